"""Messages event streams (relay translators, see ``proxy.relay.Translator``).

- ``Native``: an Anthropic upstream's events (``message_start``, ``content_block_start`` /
  ``_delta`` / ``_stop``, ``message_delta``, ``message_stop``, ``ping``, ``error``) relayed as they
  come, each masked whole, and reassembled into the stored message (``Message``, reassembly.py);
  ``message_stop`` is held back until the node is stored.
- ``FromChat``: a chat-completions stream as Messages events, for an Anthropic client over a chat
  upstream: a thinking block for reasoning, a text block, one ``tool_use`` block per tool call
  with its input (sent whole, at the end), then ``message_delta`` and ``message_stop``.
- ``ToChat``: an Anthropic upstream's events as chat chunks, for a chat client.

A failure ends a Messages stream with Anthropic's ``error`` event.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

from ...failures import Failure
from ...secrets import Masker, TextMasker
from ...sse import DONE, UNREAD, payload, relayable, sse_error_event
from ...surrogates import encode
from .. import signed
from ..chat.completion import call_id
from ..chat.masking import MaskedChunks
from ..chat.stream import StreamAccumulator, ended_without_done
from . import answers, translate
from .blocks.from_chat import input_json
from .blocks.to_chat import line_piece, server_line, uses_of
from .errors import anthropic_type, error_event, in_anthropic_words
from .reassembly import Message

__all__ = ["Deltas", "FromChat", "Message", "Native", "ToChat", "error_event"]


def _event(kind: str, data: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + encode({"type": kind, **data}) + b"\n\n"


_DELTA_FIELDS = {"text_delta": "text", "thinking_delta": "thinking", "input_json_delta": "partial_json"}


class Deltas:
    """The call's credentials masked in an Anthropic stream's deltas, however the upstream cut
    them: text, thinking and tool input pieces go through a ``TextMasker`` per block (what may
    begin a credential is held back), and what a block still holds is given out before its
    ``content_block_stop``."""

    def __init__(self, secrets: Sequence[str | None]) -> None:
        self.text = TextMasker(secrets)
        self.kinds: dict[Any, str] = {}  # block index -> its delta type

    def __bool__(self) -> bool:
        return bool(self.text)

    def events(self, event: dict[str, Any]) -> list[dict[str, Any]] | None:
        """The events to send for ``event``, masked; None when it is to go as it came."""
        kind = event.get("type")
        index = event.get("index")
        if kind == "content_block_delta" and isinstance(event.get("delta"), dict):
            delta = event["delta"]
            field = _DELTA_FIELDS.get(delta.get("type"))
            piece = delta.get(field) if field else None
            if not isinstance(piece, str) or isinstance(index, (dict, list)):
                return None
            self.kinds[index] = delta["type"]
            masked = self.text.feed(index, piece)
            return [{**event, "delta": {**delta, field: masked}}] if masked else []
        if kind == "content_block_stop" and not isinstance(index, (dict, list)) and index in self.kinds:
            rest = self.text.flush(index)
            dtype = self.kinds.pop(index)
            if rest:
                return [{"type": "content_block_delta", "index": index, "delta": {"type": dtype, _DELTA_FIELDS[dtype]: rest}},
                        event]
        return None

    def rest(self) -> list[dict[str, Any]]:
        """What blocks still hold when the stream ends before their ``content_block_stop``: a delta each."""
        out = [{"type": "content_block_delta", "index": index, "delta": {"type": dtype, _DELTA_FIELDS[dtype]: rest}}
               for index, dtype in self.kinds.items() if (rest := self.text.flush(index))]
        self.kinds.clear()
        return out


class Native:
    """An Anthropic upstream's stream, relayed to an Anthropic client."""

    def __init__(self, *, secrets: Sequence[str | None] = ()) -> None:
        self.masker = Masker(secrets) or None  # (a credential whole in one event)
        self.deltas = Deltas(secrets)  # (one cut across deltas)
        self.acc = Message()
        self.finished = False
        self.error: Any = None
        self._tail = b""

    @property
    def usage(self) -> dict[str, Any] | None:
        return self.acc.usage or None

    @property
    def finish_reason(self) -> str | None:
        return answers.finish_reason(self.acc.stop_reason) if self.acc.stop_reason else None

    def opening(self) -> bytes:
        return b""

    def event(self, raw: bytes) -> bytes:
        if self.masker:
            raw = self.masker.bytes(raw)
        event = payload(raw)
        if event is UNREAD or event is DONE or not isinstance(event, dict):
            return raw + b"\n\n" if relayable(raw) else b""  # (comments and the like: relayed as they came)
        masked = self.deltas.events(event) if self.deltas else None
        if masked is not None:
            out = []
            for e in masked:
                self.acc.feed(e)
                out.append(_event(str(e.get("type")), {k: v for k, v in e.items() if k != "type"}))
            return b"".join(out)
        self.acc.feed(event)
        if self.acc.error is not None:
            self.error = self.acc.error
            return b""
        if event.get("type") == "message_stop":
            self.finished = True
            self._tail = raw + b"\n\n"
            return b""
        return raw + b"\n\n"

    def received(self) -> list[dict[str, Any]]:
        return [{"role": "assistant", "content": self.acc.content()}]

    def closing(self) -> bytes:
        return self._tail

    def ended(self) -> bytes:
        return b""  # (a Messages stream ends with message_stop, or it was cut)

    def complete(self) -> bool:
        return self.finished or self.acc.stop_reason is not None  # (message_delta said it, with the usage)

    def failing(self, failure: Failure) -> bytes:
        return error_event(_error_type(failure), in_anthropic_words(failure.error))


def _error_type(failure: Failure) -> str:
    return anthropic_type(failure.status, failure.error)


class FromChat:
    """A chat-completions stream as Messages events."""

    def __init__(self, *, node_id: uuid.UUID, params: dict[str, Any], provider: str | None = None,
                 masker: MaskedChunks | None = None) -> None:
        self.provider = provider  # the upstream answering (what only it gets back is kept for it)
        self.masker = masker
        self.node_id = node_id
        self.params = params
        self.acc = StreamAccumulator()
        self.finished = False
        self.error: Any = None
        self.blocks: list[dict[str, Any]] = []
        self.open: int | None = None  # the block being streamed
        self.kind: str | None = None  # its kind: "thinking" | "text" | ("tool", chat index)

    @property
    def usage(self) -> dict[str, Any] | None:
        """The usage stored: the upstream's, in chat's terms (the client gets Anthropic's, ``closing``)."""
        return self.acc.usage or None

    @property
    def finish_reason(self) -> str | None:
        return self.acc.finish_reason

    def opening(self) -> bytes:
        message = answers.message_object(node_id=self.node_id, model=self.params.get("model"), content=[], stop=None,
                                           usage={"input_tokens": 0, "output_tokens": 0})
        return _event("message_start", {"message": message})

    def event(self, raw: bytes) -> bytes:
        chunk = payload(raw)
        if chunk is UNREAD:
            return b""
        if chunk is DONE:
            self.finished = True
            if self.masker is not None and self.masker.masker.holding:
                return self._chunk({"choices": self.masker.rest()})
            return b""
        self.acc.note_finishes(chunk)
        if self.masker is not None:
            self.masker.apply(chunk)
            self.masker.release_reasoning(chunk)  # (the thinking block closes whole before the text)
        return self._chunk(chunk)

    def _start(self, kind: str, block: dict[str, Any]) -> bytes:
        out = self._stop()
        self.open = len(self.blocks)
        self.kind = kind
        self.blocks.append(block)
        return out + _event("content_block_start", {"index": self.open, "content_block": block})

    def _stop(self) -> bytes:
        if self.open is None:
            return b""
        # (a thinking block is signed as Anthropic signs it, a signature_delta last: ours, as the
        # stored block and a whole answer have it, answers.content_of)
        signature = _event("content_block_delta", {"index": self.open, "delta": {
            "type": "signature_delta", "signature": signed.thinking_signature(self.provider)}}) \
            if self.kind == "thinking" else b""
        index, self.open, self.kind = self.open, None, None
        return signature + _event("content_block_stop", {"index": index})

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return _event("content_block_delta", {"index": self.open, "delta": delta})

    def _chunk(self, chunk: Any) -> bytes:
        marks = self.acc.marks()
        self.acc.feed(chunk)
        if self.acc.error is not None:
            self.error = self.acc.error
            return b""
        out = []
        text, reasoning, _ = self.acc.since(marks)  # (reasoning: as answers.content_of reads it)
        if reasoning:
            if self.kind != "thinking":
                out.append(self._start("thinking", {"type": "thinking", "thinking": "", "signature": ""}))
            out.append(self._delta({"type": "thinking_delta", "thinking": reasoning}))
        if text:
            if self.kind != "text":
                out.append(self._start("text", {"type": "text", "text": ""}))
            out.append(self._delta({"type": "text_delta", "text": text}))
        # (tool calls: sent whole at the end -- a chat stream may interleave several calls'
        # arguments, or text between a call's start and its arguments, which Anthropic's blocks,
        # one open at a time and never reopened, cannot say)
        return b"".join(out)

    def _tools(self) -> bytes:
        out = [self._stop()]
        for i, (_, call) in enumerate(sorted(self.acc.tool_calls.items())):
            out.append(self._start("tool", {"type": "tool_use", "id": call_id(call, self.node_id, i),
                                            "name": call["function"]["name"],
                                            "input": {}}))
            arguments = call["function"]["arguments"]
            if arguments:
                out.append(self._delta({"type": "input_json_delta", "partial_json": input_json(arguments)}))
            out.append(self._stop())
        carried = answers.kept_block(self.acc.message(), self.node_id, self.provider)  # (what no other block has a place for: last)
        if carried is not None:
            out.append(self._start("signed", carried) + self._stop())
        return b"".join(out)

    def received(self) -> list[dict[str, Any]]:
        return [{"role": "assistant", "content": answers.content_of(self.acc.message(), self.node_id, self.provider)}]

    def _refusal(self) -> bytes:
        """A chat upstream's refusal, when no text came: a text block of it (as the stored answer
        and a whole answer have it, ``answers.content_of``)."""
        refusal = "".join(self.acc.refusal)
        if not refusal or "".join(self.acc.content):  # (a role chunk's "" is no text)
            return b""
        return (self._start("text", {"type": "text", "text": ""})
                + self._delta({"type": "text_delta", "text": refusal}) + self._stop())

    def ended(self) -> bytes:
        return ended_without_done(self)

    def complete(self) -> bool:
        return self.finished or self.acc.complete

    def closing(self) -> bytes:
        out = self._stop() + self._refusal() + self._tools()
        usage = answers.anthropic_usage(self.acc.usage) if self.acc.usage else {"input_tokens": 0, "output_tokens": 0}
        delta: dict[str, Any] = {"delta": {"stop_reason": answers.stop_reason(self.acc.finish_reason,
                                                                                bool(self.acc.tool_calls)),
                                           "stop_sequence": None}, "usage": usage}
        applied = self.params.get(translate.APPLIED_EDITS)
        if applied is not None:  # (the context edits its request asked for, as carried out)
            delta["context_management"] = {"applied_edits": applied}
        out += _event("message_delta", delta)
        return out + _event("message_stop", {})

    def failing(self, failure: Failure) -> bytes:
        return self._stop() + error_event(_error_type(failure), in_anthropic_words(failure.error))


class ToChat:
    """An Anthropic upstream's events as chat-completion chunks; the finishing chunk (and the usage
    chunk, when the client asked) and ``[DONE]`` once the node is stored."""

    def __init__(self, *, node_id: uuid.UUID, provider: str | None, wants_usage: bool,
                 secrets: Sequence[str | None] = ()) -> None:
        self.masker = Masker(secrets) or None
        self.deltas = Deltas(secrets)
        self.node_id = node_id
        self.provider = provider
        self.wants_usage = wants_usage
        self.acc = Message()
        self.finished = False
        self.error: Any = None
        self.created = int(time.time())
        self._opened = False
        self._calls: dict[int, int] = {}  # block index -> chat tool-call index
        self._argued: set[int] = set()  # block indexes of the calls whose arguments said something
        self._said = ""  # the content sent so far: its last character (where a server tool's line goes)

    @property
    def usage(self) -> dict[str, Any] | None:
        return answers.chat_usage(self.acc.usage) if self.acc.usage else None

    @property
    def finish_reason(self) -> str | None:
        return answers.finish_reason(self.acc.stop_reason) if self.acc.stop_reason else None

    def opening(self) -> bytes:
        return b""

    def _line(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        chunk = {"id": f"chatcmpl-{self.node_id.hex}", "object": "chat.completion.chunk", "created": self.created,
                 "model": self.acc.message.get("model"), "choices": choices, **extra}
        return b"data: " + encode(chunk) + b"\n\n"

    def _chunk(self, delta: dict[str, Any]) -> bytes:
        if delta.get("content"):
            self._said = delta["content"][-1]
        out = b""
        if not self._opened:
            self._opened = True
            out = self._line([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
        return out + self._line([{"index": 0, "delta": delta, "finish_reason": None}])

    def event(self, raw: bytes) -> bytes:
        if self.masker:
            raw = self.masker.bytes(raw)
        event = payload(raw)
        if not isinstance(event, dict):
            return b""
        masked = self.deltas.events(event) if self.deltas else None
        if masked is not None:
            return b"".join(self._one(e) for e in masked)
        return self._one(event)

    def _one(self, event: dict[str, Any]) -> bytes:
        self.acc.feed(event)
        if self.acc.error is not None:
            self.error = self.acc.error
            return b""
        kind = event.get("type")
        if kind == "message_stop":
            self.finished = True
            return b""
        index = event.get("index") if isinstance(event.get("index"), int) else 0
        if kind == "content_block_start":
            block = event.get("content_block") if isinstance(event.get("content_block"), dict) else {}
            if block.get("type") == "tool_use":
                call = self._calls[index] = len(self._calls)
                return self._chunk({"tool_calls": [{"index": call, "id": block.get("id"), "type": "function",
                                                    "function": {"name": block.get("name"), "arguments": ""}}]})
            if block.get("type") == "text" and block.get("text"):
                return self._chunk({"content": block["text"]})
            return b""
        if kind == "content_block_delta" and isinstance(event.get("delta"), dict):
            delta = event["delta"]
            dtype = delta.get("type")
            if dtype == "text_delta":
                return self._chunk({"content": str(delta.get("text") or "")})
            if dtype == "thinking_delta":
                return self._chunk({"reasoning_content": str(delta.get("thinking") or "")})
            if dtype == "input_json_delta" and index in self._calls:
                piece = str(delta.get("partial_json") or "")
                if piece:
                    self._argued.add(index)
                return self._chunk({"tool_calls": [{"index": self._calls[index], "function": {"arguments": piece}}]})
        if kind == "content_block_stop" and index in self._calls and index not in self._argued:
            # (a call without input: Anthropic streams none, or one empty piece -- the arguments are
            # "{}", as OpenAI's are and as the stored and a whole answer say, never "")
            self._argued.add(index)
            block = self.acc.blocks.get(index) or {}
            value = block.get("input") if isinstance(block.get("input"), dict) else {}
            return self._chunk({"tool_calls": [{"index": self._calls[index],
                                                "function": {"arguments": encode(value).decode()}}]})
        if kind == "content_block_stop":  # (a server tool's call or result, whole: its line, as the answer reads)
            line = server_line(self.acc.blocks.get(index), uses_of(self.acc.blocks.values()))
            if line is not None:
                return self._chunk({"content": line_piece(line, self._said)})
        return b""

    def received(self) -> list[dict[str, Any]]:
        return [answers.chat_message(self.acc.content(), self.provider)]

    def closing(self) -> bytes:
        out = b""
        if not self._opened:
            out = self._chunk({})
        signed = [dict(b) for _, b in sorted(self.acc.blocks.items())
                  if isinstance(b, dict) and b.get("type") in ("thinking", "redacted_thinking")]
        if signed:  # (the signed thinking, whole and once, as a whole answer's message holds it: a
            # client -- or the next translator -- keeps it for the provider that made it)
            out += self._chunk({"thinking_blocks": signed})
        out += self._line([{"index": 0, "delta": {}, "finish_reason": self.finish_reason or "stop"}])
        if self.wants_usage:
            out += self._line([], usage=self.usage)
        return out + b"data: [DONE]\n\n"

    def ended(self) -> bytes:
        return b""  # (a Messages stream ends with message_stop, or it was cut)

    def complete(self) -> bool:
        return self.finished or self.acc.stop_reason is not None  # (message_delta said it, with the usage)

    def failing(self, failure: Failure) -> bytes:
        err = failure.error
        return sse_error_event(err.message, err.type, err.code)
