"""A Responses upstream's own stream, relayed (a relay translator, see ``proxy.relay.Translator``):
its events with the response id replaced by the node's, item ids of the node's, numbered in one
sequence with the events the proxy adds (a compaction item's, a failure's), the client's
``instructions`` restored, and the output items collected for storage; ``response.completed`` is
held back until the node is stored.
"""

from __future__ import annotations

import uuid
from typing import Any

from ...failures import Failure
from ...secrets import Masker, TextMasker
from ...sse import DONE, payload, relayable
from ...surrogates import encode
from . import translate
from .items import response_id
from .stream import Events

__all__ = ["Deltas", "Native"]


def _part(event: dict[str, Any]) -> Any:
    """The text a delta event adds to -- its type, item, output index, content or summary index --
    or None (not a delta of text)."""
    kind, delta = event.get("type"), event.get("delta")
    if not isinstance(kind, str) or not kind.endswith(".delta") or not isinstance(delta, str):
        return None
    part = (kind, event.get("item_id"), event.get("output_index"), event.get("content_index"), event.get("summary_index"))
    try:
        hash(part)
    except TypeError:  # (an odd upstream's index that is a list or an object: its events go as they came)
        return None
    return part


class Deltas:
    """The call's credentials masked across a Responses stream's deltas -- every ``*.delta`` event
    whose delta is text (output text, refusals, reasoning, a call's arguments) -- however the
    upstream cut them (``secrets.TextMasker``, one text per part). A delta whose text ends in what
    may begin a credential is held back, with the text before that: the next event says -- the
    part's next delta (the held one goes out as it is, the next carries the text released), or
    any other (the part's done event, usually: the held one goes out first, with the rest of the
    text). No event is added or dropped: a relay that keeps the upstream's sequence numbers (a
    pass-through) keeps them right."""

    def __init__(self, secrets: Any) -> None:
        self.text = TextMasker(secrets)
        self._held: tuple[Any, dict[str, Any]] | None = None

    def __bool__(self) -> bool:
        return bool(self.text)

    def events(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        """The events to send now for ``event``, in order (``event`` itself among them when it goes
        as it came)."""
        part = _part(event)
        out = self.rest() if self._held is None or self._held[0] != part else [self._held[1]]
        self._held = None
        if part is None:
            return [*out, event]
        piece = self.text.feed(part, event["delta"])
        if self.text.holding:
            self._held = (part, {**event, "delta": piece})
            return out
        return [*out, event if piece == event["delta"] else {**event, "delta": piece}]

    def rest(self) -> list[dict[str, Any]]:
        """The delta held back, with the rest of its text (the stream ended, or another event came)."""
        if self._held is None:
            return []
        part, held = self._held
        self._held = None
        return [{**held, "delta": held["delta"] + self.text.flush(part)}]


class Native:
    """A Responses upstream's stream, relayed with the node's response id."""

    def __init__(self, *, node_id: uuid.UUID, client: dict[str, Any], masker: Masker | None = None,
                 deltas: Deltas | None = None, compaction: list[dict[str, Any]] | None = None) -> None:
        self.masker = masker  # the call's credentials masked in each event (docs/behaviour.md#limits-and-hostile-peers)
        self.deltas = deltas  # (and one cut across a part's deltas)
        self.rid = response_id(node_id)
        # the fields that say the client's request (translate.client_fields): previous_response_id,
        # store, instructions (sent upstream as a system message: not echoed), conversation
        self.client = client
        self.finished = False
        self.error: Any = None
        self.usage: dict[str, Any] | None = None
        self.finish_reason: str | None = None
        self.done_items: dict[int, dict[str, Any]] = {}
        self.final: dict[str, Any] | None = None
        self._tail = b""
        self.emit = Events()
        self.ids: dict[str, str] = {}  # the upstream's item ids -> ours
        # the compaction item the output begins with (never stored): the upstream's items shift by it
        self.compaction = compaction or []
        self._opened = False
        self.started: dict[str, Any] | None = None

    def opening(self) -> bytes:
        return b""

    def _rewrite(self, response: dict[str, Any]) -> dict[str, Any]:
        return {**response, "id": self.rid, **self.client}

    def _line(self, kind: Any, event: dict[str, Any]) -> bytes:
        """An event as relayed, numbered in this stream's own sequence (the events the proxy adds --
        a compaction item, a failure -- are numbered in it too)."""
        event["sequence_number"] = self.emit.sequence
        self.emit.sequence += 1
        return b"event: " + str(kind).encode() + b"\ndata: " + encode(event) + b"\n\n"

    def event(self, raw: bytes) -> bytes:
        if self.masker:
            raw = self.masker.bytes(raw)
        event = payload(raw)
        if event is DONE:
            self.finished = True
            return b""
        if not isinstance(event, dict):  # (UNREAD: a comment relayed as it came; empty data not)
            return raw + b"\n\n" if relayable(raw) else b""
        if self.deltas is not None:
            return b"".join(self._event(e) for e in self.deltas.events(event))
        return self._event(event)

    def _event(self, event: dict[str, Any]) -> bytes:
        kind = event.get("type")
        if isinstance(event.get("response"), dict):
            event["response"] = self._rewrite(event["response"])
            if kind == "response.created":
                self.started = event["response"]  # (what a failure's response is made from: model, created_at ...)
        self._own_ids(event)
        if kind == "response.output_item.done" and isinstance(event.get("item"), dict):
            self.done_items[int(event.get("output_index", len(self.done_items)))] = event["item"]
        if self.compaction:
            return self._shifted(kind, event)
        if kind in ("response.failed", "error"):
            self._failed(event)
            return b""
        line = self._line(kind, event)
        if kind in ("response.completed", "response.incomplete"):
            self.final = event["response"]
            usage = self.final.get("usage")
            self.usage = usage if isinstance(usage, dict) else None
            self.finish_reason = translate.finish_of(self.final)
            self.finished = True
            self._tail = line
            return b""
        return line

    def _failed(self, event: dict[str, Any]) -> None:
        """The upstream's failure: its error, and the usage a failed response reports (its tokens
        were spent all the same)."""
        response = event.get("response") if isinstance(event.get("response"), dict) else {}
        self.error = response.get("error") or {k: event.get(k) for k in ("code", "message")}
        if isinstance(response.get("usage"), dict):
            self.usage = response["usage"]

    def _shifted(self, kind: Any, event: dict[str, Any]) -> bytes:
        """An event when the output begins with a compaction item: announced once the response is
        in progress, the upstream's output indexes after it, its completed response holding it first."""
        # announced once the response is in progress (or, from an upstream that never says so,
        # before its first event of another kind -- its end or its failure among them): the items
        # come after response.in_progress
        announce = not self._opened and kind not in ("response.created", "response.queued")
        items = self._announce() if announce and kind != "response.in_progress" else b""
        if kind in ("response.failed", "error"):
            self._failed(event)
            return items
        if isinstance(event.get("output_index"), int):
            event["output_index"] += len(self.compaction)
        if kind in ("response.completed", "response.incomplete"):
            self.final = dict(event["response"])
            usage = self.final.get("usage")
            self.usage = usage if isinstance(usage, dict) else None
            self.finish_reason = translate.finish_of(self.final)
            self.finished = True
            shown = {**self.final, "output": [*self.compaction, *(self.final.get("output") or [])]}
            self._tail = self._line(kind, {**event, "response": shown})
            return items
        line = items + self._line(kind, event)
        if announce and kind == "response.in_progress":
            line += self._announce()
        return line

    def _announce(self) -> bytes:
        self._opened = True
        out = b""
        for i, item in enumerate(self.compaction):
            out += self.emit("response.output_item.added", output_index=i, item=item)
            out += self.emit("response.output_item.done", output_index=i, item=item)
        return out

    def received(self) -> list[dict[str, Any]]:
        if self.final is not None and isinstance(self.final.get("output"), list):
            return self.final["output"]
        return [self.done_items[i] for i in sorted(self.done_items)]

    def _own(self, item: Any, index: int) -> Any:
        if isinstance(item, dict) and translate.gets_our_id(item):
            ours = f"{translate.item_id_prefix(item['type'])}_{self.rid[5:]}_{index}"
            if isinstance(item.get("id"), str):
                self.ids[item["id"]] = ours
            return {**item, "id": ours}
        return item

    def _own_ids(self, event: dict[str, Any]) -> None:
        """Our item ids, as ``exchange.own_item_ids`` gives them for a whole answer."""
        if isinstance(event.get("item"), dict):
            event["item"] = self._own(event["item"], int(event.get("output_index", 0)))
        if isinstance(event.get("item_id"), str):
            event["item_id"] = self.ids.get(event["item_id"], event["item_id"])
        response = event.get("response")
        if isinstance(response, dict) and isinstance(response.get("output"), list):
            response["output"] = [self._own(item, i) for i, item in enumerate(response["output"])]

    def closing(self) -> bytes:
        return self._tail

    def ended(self) -> bytes:
        return b""  # (a Responses stream ends with its completion event, or it was cut)

    def complete(self) -> bool:
        return self.finished  # (its completion event came)

    def failing(self, failure: Failure) -> bytes:
        err = failure.error
        response = {**(self.final or self.started or {}), "id": self.rid, "object": "response", "status": "failed",
                    **self.client, "output": self.received(),
                    "error": {"code": err.code or "server_error", "message": err.message}}
        return (self.emit("response.failed", response=response)
                + self.emit("error", code=err.code, message=err.message, param=None))
