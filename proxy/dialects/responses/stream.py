"""Streams for Responses clients (relay translators, see ``proxy.relay.Translator``).

- ``FromChat``: a chat-completions stream turned into Responses events as it arrives:
  ``response.created``, ``response.in_progress``, then per output item ``response.output_item.added``,
  ``response.content_part.added`` / ``response.output_text.delta`` ... ``.done`` for text,
  ``response.function_call_arguments.delta`` / ``.done`` for a function call (a custom tool's call:
  ``response.custom_tool_call_input.delta`` / ``.done``, its input whole once the call is complete,
  since the model writes it as a JSON string; a tool search's call: its item only),
  ``response.output_item.done``,
  and ``response.completed`` (the whole response) once the node is stored. A failure ends it with
  ``response.failed`` and an ``error`` event. A chat upstream's reasoning streams as a reasoning
  item, its refusal as a refusal part.

A Responses upstream's own events are relayed by ``relayed.Native``.
"""

from __future__ import annotations

import uuid
from typing import Any

from ...failures import Failure
from ...sse import DONE, UNREAD, payload
from ...surrogates import encode
from ..chat.completion import call_id
from ..chat.masking import MaskedChunks
from ..chat.stream import StreamAccumulator, ended_without_done
from . import translate
from .tools import offered

__all__ = ["Events", "FromChat"]


class Events:
    """Numbered Responses SSE events."""

    def __init__(self) -> None:
        self.sequence = 0

    def __call__(self, type_: str, **fields: Any) -> bytes:
        data = {"type": type_, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return b"event: " + type_.encode() + b"\ndata: " + encode(data) + b"\n\n"


class FromChat:
    def __init__(self, *, node_id: uuid.UUID, params: dict[str, Any], instructions: Any, provider: str | None = None,
                 masker: MaskedChunks | None = None, compaction: list[dict[str, Any]] | None = None) -> None:
        self.provider = provider  # the upstream answering (what only it gets back is kept for it)
        self.masker = masker  # the call's credentials masked in the chat chunks' text
        self.node_id = node_id
        self.params = params
        self.instructions = instructions
        self.acc = StreamAccumulator()
        self.finished = False
        self.error: Any = None
        self.emit = Events()
        self.items: list[dict[str, Any]] = []  # output items as added, by output_index
        # Items are said one after the other, as OpenAI streams them: one opening closes those before
        # it (LangChain numbers a response's content blocks by the order of output_index, and took a
        # delta or a done event of an earlier item for a block of its own, sent back as an item of
        # its own). Text (or reasoning) that goes on after a later item began is an item of its
        # own; the final response holds the answer's one message (and reasoning) at the first one's place.
        self.text_index: int | None = None  # the (first) message item
        self.text_at: int | None = None  # the message item the text goes to now
        self.parts: dict[str, int] = {}  # its content parts by type ("output_text", "refusal"): content_index
        self.text: list[str] = []  # the message's text and refusal as streamed (joined as their parts close)
        self.refusal: list[str] = []
        self.reasoning_index: int | None = None  # the (first) reasoning item (a chat upstream's reasoning, as its summary)
        self.reasoning_at: int | None = None  # the reasoning item the reasoning goes to now
        self.reasoning: list[str] = []
        self.calls: dict[int, int] = {}  # chat tool-call index -> output_index
        # chat tool-call index -> the call's place among the answer's calls, which its ids are made
        # of (fc_<node>_<n>, call_<node>_<n> when the upstream gave none), as translate.output_items
        # numbers them for the final response and the stored answer: an upstream may number its
        # calls from 1, or leave gaps
        self.places: dict[int, int] = {}
        self.closed: set[int] = set()
        self.compaction = compaction or []  # the compaction item the output begins with (never stored)

    # -- the Translator protocol --------------------------------------------------------------

    @property
    def usage(self) -> dict[str, Any] | None:
        return translate.usage_of(self.acc.usage)

    @property
    def finish_reason(self) -> str | None:
        return self.acc.finish_reason

    def _response(self, status: str, output: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return translate.response_object(node_id=self.node_id, params=self.params, output=output, status=status,
                                         usage=extra.pop("usage", None), instructions=self.instructions,
                                         model=self.acc.model or self.params.get("model"), **extra)

    def opening(self) -> bytes:
        response = self._response("in_progress", [])
        out = self.emit("response.created", response=response) + self.emit("response.in_progress", response=response)
        for item in self.compaction:  # output_index 0: the answer's items follow it
            self.items.append(item)
            self.closed.add(len(self.items) - 1)
            out += self.emit("response.output_item.added", output_index=len(self.items) - 1, item=item)
            out += self.emit("response.output_item.done", output_index=len(self.items) - 1, item=item)
        return out

    def event(self, raw: bytes) -> bytes:
        chunk = payload(raw)
        if chunk is UNREAD:
            return b""
        if chunk is DONE:
            self.finished = True
            if self.masker is not None and self.masker.masker.holding:  # (no finishing chunk came)
                return self._chunk({"choices": self.masker.rest()})
            return b""
        self.acc.note_finishes(chunk)
        if self.masker is not None:
            self.masker.apply(chunk)
            self.masker.release_before_items(chunk)  # (what an item holds back goes out before the next item)
        return self._chunk(chunk)

    def _chunk(self, chunk: Any) -> bytes:
        marks = self.acc.marks()
        before_args = {i: tc["function"]["arguments"] for i, tc in self.acc.tool_calls.items()}
        self.acc.feed(chunk)
        if self.acc.error is not None:
            self.error = self.acc.error
            return b""
        out = []
        text, reasoning, refusal = self.acc.since(marks)  # (reasoning: as translate.output_items reads it)
        if reasoning:
            out.append(self._reasoning_delta(reasoning))
        if text:
            out.append(self._text_delta(text))
        if refusal:
            out.append(self._refusal_delta(refusal))
        for i, call in sorted(self.acc.tool_calls.items()):
            arguments = call["function"]["arguments"]
            if i not in self.calls:  # (the message stays open: text may follow a call, and is its own)
                out.append(self._open_call(i, call))
            added = arguments[len(before_args.get(i, "")):]
            item = self.items[self.calls[i]]
            if added and item["type"] == "function_call":  # (a custom tool's input, a search's query: whole, at its end)
                out.append(self.emit("response.function_call_arguments.delta", item_id=item["id"],
                                     output_index=self.calls[i], delta=added))
        return b"".join(out)

    def _reasoning_delta(self, delta: str) -> bytes:
        out = b""
        if self.reasoning_at is None or self.reasoning_at in self.closed:
            out += self._close_text()  # (a call stays open: its arguments may go on)
            at = self.reasoning_at = len(self.items)
            if self.reasoning_index is None:
                self.reasoning_index = at
            suffix = "" if at == self.reasoning_index else f"_{at}"
            item = {"id": f"rs_{self.node_id.hex}{suffix}", "type": "reasoning", "summary": []}
            self.items.append(item)
            self.reasoning = []
            out += self.emit("response.output_item.added", output_index=at, item=item)
            out += self.emit("response.reasoning_summary_part.added", item_id=item["id"],
                             output_index=at, summary_index=0, part={"type": "summary_text", "text": ""})
        self.reasoning.append(delta)
        return out + self.emit("response.reasoning_summary_text.delta", item_id=self.items[self.reasoning_at]["id"],
                               output_index=self.reasoning_at, summary_index=0, delta=delta)

    def _closing(self, index: int | None) -> dict[str, Any] | None:
        """The item at ``index`` when it is open (marked closed now), else None."""
        if index is None or index in self.closed:
            return None
        self.closed.add(index)
        return self.items[index]

    def _close_reasoning(self) -> bytes:
        index = self.reasoning_at
        item = self._closing(index)
        if item is None:
            return b""
        text = "".join(self.reasoning)
        part = {"type": "summary_text", "text": text}
        item.update(summary=[part])
        return (self.emit("response.reasoning_summary_text.done", item_id=item["id"], output_index=index,
                          summary_index=0, text=text)
                + self.emit("response.reasoning_summary_part.done", item_id=item["id"], output_index=index,
                            summary_index=0, part=part)
                + self.emit("response.output_item.done", output_index=index, item=item))

    def _part(self, kind: str) -> tuple[bytes, int]:
        """The message item's ``kind`` content part (``output_text`` or ``refusal``): its
        content index, and the events that opened it (and the message, closing the items before it)
        when it was not open."""
        out = b""
        if self.text_at is None or self.text_at in self.closed:
            out += self._close_reasoning()  # (a call stays open: its arguments may go on)
            at = self.text_at = len(self.items)
            if self.text_index is None:
                self.text_index = at
            suffix = "" if at == self.text_index else f"_{at}"
            item = {"id": translate.message_item_id(self.node_id) + suffix, "type": "message", "role": "assistant",
                    "status": "in_progress", "content": []}
            self.items.append(item)
            self.parts, self.text, self.refusal = {}, [], []
            out += self.emit("response.output_item.added", output_index=at, item=item)
        if kind not in self.parts:
            self.parts[kind] = len(self.parts)
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []} if kind == "output_text" \
                else {"type": "refusal", "refusal": ""}
            out += self.emit("response.content_part.added", item_id=self.items[self.text_at]["id"],
                             output_index=self.text_at, content_index=self.parts[kind], part=part)
        return out, self.parts[kind]

    def _text_delta(self, delta: str) -> bytes:
        out, at = self._part("output_text")
        self.text.append(delta)
        return out + self.emit("response.output_text.delta", item_id=self.items[self.text_at]["id"],
                               output_index=self.text_at, content_index=at, delta=delta, logprobs=[])

    def _refusal_delta(self, delta: str) -> bytes:
        out, at = self._part("refusal")
        self.refusal.append(delta)
        return out + self.emit("response.refusal.delta", item_id=self.items[self.text_at]["id"],
                               output_index=self.text_at, content_index=at, delta=delta)

    def _close_text(self) -> bytes:
        index = self.text_at
        item = self._closing(index)
        if item is None:
            return b""
        out, parts = b"", []
        for kind, at in sorted(self.parts.items(), key=lambda kv: kv[1]):
            if kind == "output_text":
                text = "".join(self.text)
                part: dict[str, Any] = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
                out += self.emit("response.output_text.done", item_id=item["id"], output_index=index, content_index=at,
                                 text=text, logprobs=[])
            else:
                refusal = "".join(self.refusal)
                part = {"type": "refusal", "refusal": refusal}
                out += self.emit("response.refusal.done", item_id=item["id"], output_index=index, content_index=at,
                                 refusal=refusal)
            out += self.emit("response.content_part.done", item_id=item["id"], output_index=index, content_index=at,
                             part=part)
            parts.append(part)
        item.update(status="completed", content=parts)
        return out + self.emit("response.output_item.done", output_index=index, item=item)

    def _open_call(self, i: int, call: dict[str, Any]) -> bytes:
        out = self._close_reasoning() + self._close_text()
        index = len(self.items)
        self.calls[i] = index
        n = self.places[i] = len(self.places)
        item = translate.tool_call_item(self.node_id, n, call_id(call, self.node_id, n), call["function"]["name"],
                                       "", offered(self.params), status="in_progress")
        self.items.append(item)
        return out + self.emit("response.output_item.added", output_index=index, item=item)

    def _close_calls(self) -> bytes:
        out = b""
        for i, index in sorted(self.calls.items(), key=lambda kv: kv[1]):
            item = self._closing(index)
            if item is None:
                continue
            call = self.acc.tool_calls[i]
            n = self.places[i]
            item.update(translate.tool_call_item(self.node_id, n, call_id(call, self.node_id, n), call["function"]["name"],
                                                call["function"]["arguments"], offered(self.params), status="completed"))
            if item["type"] == "custom_tool_call":
                if item["input"]:
                    out += self.emit("response.custom_tool_call_input.delta", item_id=item["id"], output_index=index,
                                     delta=item["input"])
                out += self.emit("response.custom_tool_call_input.done", item_id=item["id"], output_index=index,
                                 input=item["input"])
            elif item["type"] == "function_call":
                out += self.emit("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                                 arguments=item["arguments"])
            out += self.emit("response.output_item.done", output_index=index, item=item)
        return out

    def received(self) -> list[dict[str, Any]]:
        # (each item at its output_index, its place in the response's output: a stream whose call
        # came before its text announced the call first -- and a client keeps the items in that
        # order; items.convert reads the message after its calls as one assistant message)
        items = translate.output_items(self.acc.message(), self.node_id, offered(self.params), self.provider)
        calls = iter([self.calls[i] for i in sorted(self.calls)])  # (output_items' calls: in that order)
        places = [(None if item.get("encrypted_content") else self.reasoning_index) if item["type"] == "reasoning"
                  else self.text_index if item["type"] == "message" else next(calls, None) for item in items]
        order = sorted(range(len(items)), key=lambda k: len(self.items) if places[k] is None else places[k])
        return [items[k] for k in order]

    def ended(self) -> bytes:
        return ended_without_done(self)

    def complete(self) -> bool:
        return self.finished or self.acc.complete

    def closing(self) -> bytes:
        out = self._close_reasoning() + self._close_text() + self._close_calls()
        if self.text_index is None and not self.calls:  # an answer without text or calls still has an (empty) message
            out += self._text_delta("") + self._close_text()
        carried = translate.kept_item(self.acc.message(), self.node_id, self.provider)  # (what no other item has a place for: last)
        if carried is not None:
            self.items.append(carried)
            self.closed.add(len(self.items) - 1)
            out += self.emit("response.output_item.added", output_index=len(self.items) - 1, item=carried)
            out += self.emit("response.output_item.done", output_index=len(self.items) - 1, item=carried)
        final = self._response("completed", [*self.compaction, *self.received()], usage=self.usage,
                               finish_reason=self.finish_reason)
        kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        return out + self.emit(kind, response=final)

    def failing(self, failure: Failure) -> bytes:
        err = failure.error
        error = {"code": err.code or "server_error", "message": err.message}
        response = self._response("failed", [dict(i) for i in self.items], error=error, usage=self.usage)
        return (self.emit("response.failed", response=response)
                + self.emit("error", code=err.code, message=err.message, param=None))
