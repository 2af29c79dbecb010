"""Chat-completions streams: the chunks' deltas merged into the stored message
(``StreamAccumulator``), and a chat stream relayed to a chat client as it arrives (``ChatStream``,
a ``proxy.relay.Translator``)."""

from __future__ import annotations

from typing import Any, NamedTuple

from ...failures import Failure
from ...secrets import Masker
from ...sse import DONE, UNREAD, payload, relayable, sse_error_event
from ...surrogates import encode
from .masking import MaskedChunks

__all__ = ["ChatStream", "StreamAccumulator", "ended_without_done"]


def _texts(parts: list[Any], kind: str) -> list[str]:
    """The texts of a delta's content parts of ``kind``: a text part's own, a thinking part's (its
    text, or the texts of the parts it holds)."""
    out: list[str] = []
    for part in parts:
        if not isinstance(part, dict) or part.get("type") != kind:
            continue
        value = part.get(kind) if kind != "text" else part.get("text")
        if isinstance(value, str):
            out.append(value)
        elif isinstance(value, list):
            out.extend(p["text"] for p in value if isinstance(p, dict) and isinstance(p.get("text"), str))
    return out


class Marks(NamedTuple):
    """Where an answer's texts ended at a moment of its stream (``StreamAccumulator.marks``): each
    list's pieces, and the characters of the two reasonings."""

    content: int
    reasoning_content: int
    reasoning: int
    refusal: int
    reasoning_content_chars: int
    reasoning_chars: int


class StreamAccumulator:
    """Merges ``chat.completion.chunk`` deltas (choice 0) into one assistant message."""

    def __init__(self) -> None:
        self.content: list[str] = []
        self.reasoning_content: list[str] = []
        self.reasoning: list[str] = []
        self.refusal: list[str] = []
        self.reasoning_content_chars = 0  # (their lengths, kept as they grow: ``since`` reads them)
        self.reasoning_chars = 0
        self.reasoning_shown = 0  # (the characters of reasoning ``since`` gave out)
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self.extra: dict[str, Any] = {}
        # an audio answer's pieces (its transcript and data arrive as deltas of strings, its id and
        # expiry once): joined by ``message()``
        self.audio: dict[str, Any] = {}
        self.role = "assistant"
        self.finish_reason: str | None = None
        self.choices: dict[Any, bool] = {}  # every choice's index (n > 1: several) -> it finished
        self.usage: dict[str, Any] | None = None
        self.error: dict[str, Any] | None = None
        self.response_id: str | None = None
        self.model: str | None = None
        self.chunks = 0

    def feed(self, chunk: Any) -> None:
        if not isinstance(chunk, dict):
            return
        self.chunks += 1
        if chunk.get("error"):
            err = chunk["error"]
            self.error = err if isinstance(err, dict) else {"message": str(err)}
            return
        if self.response_id is None:
            self.response_id = chunk.get("id")
            self.model = chunk.get("model")
        usage = chunk.get("usage")
        if usage and isinstance(usage, dict):
            self.usage = usage
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            index = choice.get("index", 0)
            delta = choice.get("delta") or {}
            if index != 0:
                continue
            if delta:
                self._merge(delta)
            if choice.get("finish_reason") and isinstance(choice["finish_reason"], str):
                self.finish_reason = choice["finish_reason"]

    def note_finishes(self, chunk: Any) -> None:
        """Which choices the upstream's ``chunk`` finishes, for ``complete`` -- read before the
        credential masker releases held-back text into the finishing chunk (which would make it
        look as if it still brought text). A choice is whole once a chunk finishes it bringing
        nothing more: some servers put finish_reason on every chunk, or on chunks still bringing
        text -- an answer cut there is not whole (and more text after a finish makes it not whole
        again)."""
        if not isinstance(chunk, dict):
            return
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict) or not isinstance(index := choice.get("index", 0), (int, str)):
                continue
            delta = choice.get("delta") or {}
            finish = choice.get("finish_reason")
            carries = not isinstance(delta, dict) or any(v for k, v in delta.items() if k != "role")
            self.choices[index] = (not carries) and (self.choices.get(index, False)
                                                     or (bool(finish) and isinstance(finish, str)))

    @property
    def complete(self) -> bool:
        """Every choice finished (by a chunk bringing nothing more): what may follow is the usage
        and ``[DONE]``."""
        return self.finish_reason is not None and all(self.choices.values())

    def marks(self) -> Marks:
        """Where the answer's texts end now, for ``since``."""
        return Marks(len(self.content), len(self.reasoning_content), len(self.reasoning), len(self.refusal),
                     self.reasoning_content_chars, self.reasoning_chars)

    def since(self, marks: Marks) -> tuple[str, str, str]:
        """What the answer gained since ``marks``: (text, reasoning, refusal) -- a translator's deltas
        (one call per chunk fed), read from the pieces the chunk added, not from the whole text
        joined again at every chunk (which made a translated stream's cost grow with the square of
        its length). The reasoning is the message's as ``message()`` gives it to a reader --
        reasoning_content, else reasoning -- past what was shown of it so far (an upstream that
        begins reasoning_content after some reasoning: it takes over from there)."""
        text, refusal = "".join(self.content[marks.content:]), "".join(self.refusal[marks.refusal:])
        from_content = self.reasoning_content_chars > 0
        length = self.reasoning_content_chars if from_content else self.reasoning_chars
        if length <= self.reasoning_shown:
            return text, "", refusal
        pieces, first, chars = ((self.reasoning_content, marks.reasoning_content, marks.reasoning_content_chars)
                                if from_content else (self.reasoning, marks.reasoning, marks.reasoning_chars))
        # the usual case: what this chunk added; else (the source changed, or lagged behind what
        # was shown) the source from where the shown ends
        reasoning = "".join(pieces[first:]) if chars == self.reasoning_shown else \
            "".join(pieces)[self.reasoning_shown:]
        self.reasoning_shown = length
        return text, reasoning, refusal

    def _merge(self, delta: dict[str, Any]) -> None:
        # (an upstream's odd field -- a number where text goes -- is left out, never stored as
        # what it is not; content as a list of parts, as Mistral's reasoning models stream it,
        # gives its text, and its thinking parts the reasoning)
        for key, value in delta.items():
            if value is None:
                continue
            if key == "content":
                if isinstance(value, list):
                    thinking = _texts(value, "thinking")
                    self.reasoning_content.extend(thinking)
                    self.reasoning_content_chars += sum(len(t) for t in thinking)
                    self.content.extend(_texts(value, "text"))
                elif isinstance(value, str):
                    self.content.append(value)
            elif key == "tool_calls":
                for tc in value if isinstance(value, list) else ():
                    if isinstance(tc, dict):
                        self._merge_tool_call(tc)
            elif key in ("reasoning_content", "reasoning", "refusal"):
                if isinstance(value, str):
                    getattr(self, key).append(value)
                    if key == "reasoning_content":
                        self.reasoning_content_chars += len(value)
                    elif key == "reasoning":
                        self.reasoning_chars += len(value)
            elif key == "role":
                if isinstance(value, str):
                    self.role = value
            elif key == "function_call":
                if isinstance(value, dict):
                    fc = self.extra.get("function_call")
                    if not isinstance(fc, dict):  # (first, or after an odd upstream's null)
                        fc = self.extra["function_call"] = {"name": "", "arguments": ""}
                    for part in ("name", "arguments"):
                        if isinstance(value.get(part), str):
                            fc[part] += value[part]
            elif key == "audio" and isinstance(value, dict):
                for part, piece in value.items():
                    if part in ("transcript", "data") and isinstance(piece, str):
                        self.audio.setdefault(part, []).append(piece)
                    elif piece is not None:
                        self.audio[part] = piece
            elif isinstance(value, list):  # e.g. reasoning_details: arrives in pieces
                pieces = self.extra.get(key)
                if isinstance(pieces, list):
                    pieces.extend(value)
                else:  # (first, or after an odd upstream's other shape: the last shape said)
                    self.extra[key] = list(value)
            else:
                self.extra[key] = value

    def _merge_tool_call(self, tc: dict[str, Any]) -> None:
        # (a call's other fields -- Gemini's extra_content, its thought signature -- are kept as
        # a message's are: a list's pieces joined, anything else as it came; a delta without an
        # index is a new call, unless it brings neither id nor name: the last call's next pieces)
        index = tc.get("index")
        if type(index) is not int:
            fn = tc.get("function")
            begins = tc.get("id") or (isinstance(fn, dict) and fn.get("name"))
            index = len(self.tool_calls) if begins or not self.tool_calls else max(self.tool_calls)
        slot = self.tool_calls.get(index)
        if slot is None:
            slot = self.tool_calls[index] = {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
        for key, value in tc.items():
            if key == "index" or value is None:
                continue
            if key in ("id", "type"):
                if value and isinstance(value, str):
                    slot[key] = value
            elif key == "function":
                fn = value if isinstance(value, dict) else {}
                for part in ("name", "arguments"):
                    if isinstance(fn.get(part), str):
                        slot["function"][part] += fn[part]
            elif isinstance(value, list) and isinstance(slot.get(key, []), list):
                slot.setdefault(key, []).extend(value)
            else:
                slot[key] = value

    def message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": self.role or "assistant", "content": "".join(self.content) if self.content else None}
        if self.reasoning_content:
            msg["reasoning_content"] = "".join(self.reasoning_content)
        if self.reasoning:
            msg["reasoning"] = "".join(self.reasoning)
        if self.tool_calls:
            msg["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        if self.refusal:
            msg["refusal"] = "".join(self.refusal)
        msg.update(self.extra)
        if self.audio:
            msg["audio"] = {k: "".join(v) if k in ("transcript", "data") else v for k, v in self.audio.items()}
        return msg


def ended_without_done(translator: Any) -> bytes:
    """A translator reading a chat upstream (``acc``: its ``StreamAccumulator``) whose stream's
    body ended without ``[DONE]``: the answer is whole once its choice finished (some
    OpenAI-compatible servers end so) -- as if ``[DONE]`` had come; else nothing (a cut stream)."""
    return translator.event(b"data: [DONE]") if translator.acc.finish_reason is not None else b""


class ChatStream:
    """A chat-completions stream relayed as it arrives; ``[DONE]`` is held back until the node
    is stored; the usage chunk the proxy asked for is stripped unless the client asked too."""

    def __init__(self, *, strip_usage: bool, masker: MaskedChunks | None = None, whole: Masker | None = None) -> None:
        self.strip_usage = strip_usage
        self.masker = masker  # (a credential cut across the deltas of a text field)
        self.whole = whole  # (a credential whole in one event, in any field: a tool's name, an audio transcript)
        self.acc = StreamAccumulator()
        self.finished = False
        self.error: Any = None
        self._tail = b""

    @property
    def usage(self) -> dict[str, Any] | None:
        return self.acc.usage

    @property
    def finish_reason(self) -> str | None:
        return self.acc.finish_reason

    def opening(self) -> bytes:
        return b""

    def event(self, raw: bytes) -> bytes:
        if self.whole is not None:
            raw = self.whole.bytes(raw)
        chunk = payload(raw)
        if chunk is UNREAD:
            return raw + b"\n\n" if relayable(raw) else b""  # a comment, a keep-alive: relayed as is
        if chunk is DONE:
            self.finished = True
            self._tail = raw + b"\n\n"
            return self._rest()
        self.acc.note_finishes(chunk)
        if self.masker is not None and self.masker.apply(chunk):
            raw = b"data: " + encode(chunk)
        self.acc.feed(chunk)
        if self.acc.error is not None:
            self.error = self.acc.error
            return b""  # not relayed: our own final error event replaces it
        if self.strip_usage and isinstance(chunk, dict) and chunk.get("usage"):  # we asked for usage; the client did not
            if not chunk.get("choices"):
                return b""
            # (some servers send it on the finishing chunk, beside its choices: those go on without it)
            raw = b"data: " + encode({k: v for k, v in chunk.items() if k != "usage"})
        return raw + b"\n\n"

    def _rest(self) -> bytes:
        """What the masker still held when the stream ended without finishing its choices."""
        if self.masker is None or not self.masker.masker.holding:
            return b""
        chunk = {"id": self.acc.response_id, "object": "chat.completion.chunk", "model": self.acc.model,
                 "choices": self.masker.rest()}
        self.acc.feed(chunk)
        return b"data: " + encode(chunk) + b"\n\n"

    def closing(self) -> bytes:
        return self._tail

    def ended(self) -> bytes:
        return ended_without_done(self)

    def complete(self) -> bool:
        return self.finished or self.acc.complete

    def failing(self, failure: Failure) -> bytes:
        err = failure.error
        return sse_error_event(err.message, err.type, err.code)

    def received(self) -> list[dict[str, Any]]:
        return [self.acc.message()]
