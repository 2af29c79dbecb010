"""A pass-through event stream of an API the proxy reads -- chat completions, Responses, Anthropic
Messages -- with the call's credentials masked across its text deltas, as a stored call's stream
is (docs/behaviour.md#limits-and-hostile-peers): each event masked whole (``secrets.Masker``), and
its text through the dialect's own masker of deltas (``secrets.TextMasker``: what may begin a
credential held back until the next delta of the same text says). Only an event whose text changed
is written again (its data; its other lines kept); every other one goes as it came. A stream that
carries no credential never comes here: its bytes are relayed as they are."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol

import msgspec

from .dialects.chat.masking import MaskedChunks, masked_chunks
from .dialects.messages.stream import Deltas as MessagesDeltas
from .dialects.responses.relayed import Deltas as ResponsesDeltas
from .errors import UpstreamFailure
from .secrets import Masker
from .sse import SSEParser
from .surrogates import encode, loads_piece

__all__ = ["EventMasker", "event_masker", "masked_events"]


class _Texts(Protocol):
    def event(self, raw: bytes) -> bytes: ...  # what the client gets for one event (masked whole), ended

    def rest(self) -> bytes: ...  # the text still held back when the stream ends


def _read(raw: bytes) -> dict[str, Any] | None:
    """An event's data as a JSON object; None for anything else (a comment, ``[DONE]``, data that is
    not JSON: relayed as they came -- a pass-through judges nothing)."""
    data = SSEParser.data(raw)
    if not data or data.lstrip()[:1] != b"{":
        return None
    try:
        value = loads_piece(data)
    except (msgspec.DecodeError, RecursionError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _with_data(raw: bytes, data: bytes) -> bytes:
    """``raw`` with its data replaced by ``data``: its other lines (``event:``, ``id:``, comments) kept."""
    if raw.startswith(b"data:") and b"\n" not in raw:
        return b"data: " + data
    out, put = [], False
    for line in raw.split(b"\n"):
        if not line.startswith(b"data:"):
            out.append(line)
        elif not put:
            out.append(b"data: " + data)
            put = True
    return b"\n".join(out)


def _named(event: dict[str, Any]) -> bytes:
    """An event the masker made (or changed), as Responses and Messages streams name theirs."""
    return b"event: " + str(event.get("type")).encode() + b"\ndata: " + encode(event) + b"\n\n"


class _Chat:
    """Chat chunks: their choices' text fields (``MaskedChunks``, as a stored stream's), what is held
    given out by the chunk that finishes its choice -- or, in a chunk of its own, before ``[DONE]``
    or at the stream's end."""

    def __init__(self, chunks: MaskedChunks) -> None:
        self.chunks = chunks
        self.head: dict[str, Any] = {}  # (the id, created and model a chunk of our own says)

    def event(self, raw: bytes) -> bytes:
        chunk = _read(raw)
        if chunk is None:
            return (self.rest() if SSEParser.data(raw) == b"[DONE]" else b"") + raw + b"\n\n"
        if not self.head:
            self.head = {k: chunk[k] for k in ("id", "created", "model") if k in chunk}
        if self.chunks.apply(chunk):
            raw = _with_data(raw, encode(chunk))
        return raw + b"\n\n"

    def rest(self) -> bytes:
        if not self.chunks.masker.holding:
            return b""
        return b"data: " + encode({"id": self.head.get("id"), "object": "chat.completion.chunk",
                                   **{k: v for k, v in self.head.items() if k != "id"},
                                   "choices": self.chunks.rest()}) + b"\n\n"


class _Events:
    """Responses or Messages events: those the dialect's ``Deltas`` gives back as they came go as
    they came, the others are written again."""

    def __init__(self, deltas: ResponsesDeltas | MessagesDeltas) -> None:
        self.deltas = deltas

    def event(self, raw: bytes) -> bytes:
        event = _read(raw)
        if event is None:
            return raw + b"\n\n"
        events = self.deltas.events(event)
        if events is None:  # (Messages: a block's delta that is no text, and the like)
            return raw + b"\n\n"
        return b"".join(raw + b"\n\n" if e is event else _named(e) for e in events)

    def rest(self) -> bytes:
        return b"".join(_named(e) for e in self.deltas.rest())


class EventMasker:
    """One pass-through stream's events, masked (``feed`` each chunk as it comes; ``end`` when the
    body ended: the text still held back, and an unended last event as it came, masked)."""

    def __init__(self, secrets: Sequence[str | None], texts: _Texts) -> None:
        self.whole = Masker(secrets)
        self.texts = texts
        self.parser = SSEParser()

    def feed(self, chunk: bytes) -> bytes:
        return b"".join([self.texts.event(self.whole.bytes(raw)) for raw in self.parser.feed(chunk)])

    def end(self) -> bytes:
        closed = b"".join([self.texts.event(self.whole.bytes(raw)) for raw in self.parser.close()])  # (a last CR)
        return closed + self.texts.rest() + self.whole.bytes(self.parser.pending)


def event_masker(path: str, secrets: Sequence[str | None]) -> EventMasker | None:
    """The masker of an event stream answering ``path`` (the upstream's, after ``/v1/``), or None:
    not an API whose events the proxy reads, or no credential to mask."""
    texts: _Texts
    if path == "chat/completions":
        chunks = masked_chunks(secrets)
        if chunks is None:
            return None
        texts = _Chat(chunks)
    elif path == "responses" or path.startswith("responses/"):  # (a background response's stream, resumed)
        texts = _Events(ResponsesDeltas(secrets))
    elif path == "messages":
        texts = _Events(MessagesDeltas(secrets))
    else:
        return None
    masker = EventMasker(secrets, texts)
    return masker if masker.whole else None


async def masked_events(chunks: AsyncIterator[bytes], masker: EventMasker) -> AsyncIterator[bytes]:
    """``chunks`` with ``masker`` applied; what it holds goes out when the body ends -- or is cut,
    before the cut is said."""
    try:
        async for chunk in chunks:
            if out := masker.feed(chunk):
                yield out
    except UpstreamFailure:
        if held := masker.end():
            yield held
        raise
    if held := masker.end():
        yield held
