"""An Anthropic upstream's event stream reassembled into the message it makes -- what a
streamed answer stores, whichever API its client speaks (docs/behaviour.md#the-messages-api)."""

from __future__ import annotations

from typing import Any

import msgspec

from ...surrogates import loads

__all__ = ["Message"]


def _onto(block: dict[str, Any], delta: dict[str, Any]) -> None:
    """A delta of a type not known here, on its block: a piece of text where the block holds text
    under that name is added to it (as text, thinking and signature pieces are), anything else
    set -- so a new block type's content is stored and sent back, never emptied unsaid."""
    for key, value in delta.items():
        if key == "type":
            continue
        if isinstance(value, str) and isinstance(block.get(key), str):
            block[key] += value
        else:
            block[key] = value


class Message:
    """An Anthropic stream's events merged into the message they make (as the anthropic SDK's
    accumulator does; a delta of a type it does not know lands on its block too, ``_onto``)."""

    def __init__(self) -> None:
        self.message: dict[str, Any] = {}
        self.blocks: dict[int, dict[str, Any]] = {}
        self.partial: dict[int, list[str]] = {}  # tool inputs, as JSON pieces
        self.usage: dict[str, Any] = {}
        self.stop_reason: str | None = None
        self.error: Any = None
        self.stopped = False

    def feed(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        index = event.get("index") if isinstance(event.get("index"), int) else 0
        if kind == "message_start" and isinstance(event.get("message"), dict):
            self.message = dict(event["message"])
            if isinstance(self.message.get("usage"), dict):
                self.usage.update(self.message["usage"])
        elif kind == "content_block_start" and isinstance(event.get("content_block"), dict):
            self.blocks[index] = dict(event["content_block"])
        elif kind == "content_block_delta" and isinstance(event.get("delta"), dict):
            block = self.blocks.setdefault(index, {"type": "text", "text": ""})
            delta = event["delta"]
            dtype = delta.get("type")
            if dtype == "text_delta":
                block["text"] = str(block.get("text") or "") + str(delta.get("text") or "")
            elif dtype == "input_json_delta":
                self.partial.setdefault(index, []).append(str(delta.get("partial_json") or ""))
            elif dtype == "thinking_delta":
                block["thinking"] = str(block.get("thinking") or "") + str(delta.get("thinking") or "")
            elif dtype == "signature_delta":
                block["signature"] = str(block.get("signature") or "") + str(delta.get("signature") or "")
            elif dtype == "citations_delta":
                if delta.get("citation") is not None:
                    block.setdefault("citations", []).append(delta["citation"])
            elif dtype == "compaction_delta":  # (the summary and its encrypted form, whole, as the SDK sets them)
                block.update({k: v for k, v in delta.items() if k != "type"})
            else:  # (a delta type not known here: its fields land on its block, never lost)
                _onto(block, delta)
        elif kind == "content_block_stop":
            self._close(index)
        elif kind == "message_delta":
            delta = event.get("delta") if isinstance(event.get("delta"), dict) else {}
            if delta.get("stop_reason"):
                self.stop_reason = delta["stop_reason"]
            for key in ("stop_sequence", "container"):
                if key in delta:
                    self.message[key] = delta[key]
            if isinstance(event.get("usage"), dict):
                self.usage.update({k: v for k, v in event["usage"].items() if v is not None})
        elif kind == "message_stop":
            self.stopped = True
        elif kind == "error":
            self.error = event.get("error") if isinstance(event.get("error"), dict) else {"message": str(event)}

    def _close(self, index: int) -> None:
        pieces = self.partial.pop(index, None)
        block = self.blocks.get(index)
        if block is None or pieces is None:
            return
        text = "".join(pieces)
        try:
            block["input"] = loads(text) if text.strip() else {}
        except (msgspec.DecodeError, RecursionError):
            block["input"] = {"arguments": text}

    def content(self) -> list[dict[str, Any]]:
        for index in list(self.partial):
            self._close(index)
        return [self.blocks[i] for i in sorted(self.blocks)]

    def whole(self) -> dict[str, Any]:
        return {**self.message, "content": self.content(), "stop_reason": self.stop_reason, "usage": self.usage}
