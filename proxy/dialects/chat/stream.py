"""Chat-completions streams: the chunks' deltas merged into the stored message
(``StreamAccumulator``), and a chat stream relayed to a chat client as it arrives (``ChatStream``,
a ``proxy.relay.Translator``)."""

from __future__ import annotations

from typing import Any

import msgspec

from ...failures import Failure
from ...secrets import TextMasker
from ...sse import DONE, UNREAD, payload, sse_error_event

__all__ = ["ChatStream", "MaskedChunks", "StreamAccumulator"]

_encode = msgspec.json.Encoder().encode



class StreamAccumulator:
    """Merges ``chat.completion.chunk`` deltas (choice 0) into one assistant message."""

    def __init__(self) -> None:
        self.content: list[str] = []
        self.reasoning_content: list[str] = []
        self.reasoning: list[str] = []
        self.refusal: list[str] = []
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self.extra: dict[str, Any] = {}
        self.role = "assistant"
        self.finish_reason: str | None = None
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
        if usage:
            self.usage = usage
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if delta:
                self._merge(delta)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    def _merge(self, delta: dict[str, Any]) -> None:
        for key, value in delta.items():
            if value is None:
                continue
            if key == "content":
                self.content.append(value)
            elif key == "tool_calls":
                for tc in value:
                    self._merge_tool_call(tc)
            elif key == "reasoning_content":
                self.reasoning_content.append(value)
            elif key == "reasoning":
                if isinstance(value, str):
                    self.reasoning.append(value)
            elif key == "refusal":
                self.refusal.append(value)
            elif key == "role":
                self.role = value
            elif key == "function_call":
                fc = self.extra.setdefault("function_call", {"name": "", "arguments": ""})
                fc["name"] += value.get("name") or ""
                fc["arguments"] += value.get("arguments") or ""
            elif isinstance(value, list):  # e.g. reasoning_details: arrives in pieces
                self.extra.setdefault(key, []).extend(value)
            else:
                self.extra[key] = value

    def _merge_tool_call(self, tc: dict[str, Any]) -> None:
        index = tc.get("index", len(self.tool_calls))
        slot = self.tool_calls.get(index)
        if slot is None:
            slot = self.tool_calls[index] = {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
        if tc.get("id"):
            slot["id"] = tc["id"]
        if tc.get("type"):
            slot["type"] = tc["type"]
        fn = tc.get("function") or {}
        if fn.get("name"):
            slot["function"]["name"] += fn["name"]
        if fn.get("arguments"):
            slot["function"]["arguments"] += fn["arguments"]

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
        return msg


class ChatStream:
    """A chat-completions stream relayed as it arrives; ``[DONE]`` is held back until the node
    is stored; the usage chunk the proxy asked for is stripped unless the client asked too."""

    def __init__(self, *, strip_usage: bool) -> None:
        self.strip_usage = strip_usage
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
        chunk = payload(raw)
        if chunk is UNREAD:
            return raw + b"\n\n"  # comment / keep-alive, or not JSON: relayed as is
        if chunk is DONE:
            self.finished = True
            self._tail = raw + b"\n\n"
            return b""
        self.acc.feed(chunk)
        if self.acc.error is not None:
            self.error = self.acc.error
            return b""  # not relayed: our own final error event replaces it
        if self.strip_usage and isinstance(chunk, dict) and chunk.get("usage") and not chunk.get("choices"):
            return b""  # we asked for usage; the client did not
        return raw + b"\n\n"

    def closing(self) -> bytes:
        return self._tail

    def failing(self, failure: Failure) -> bytes:
        err = failure.error
        return sse_error_event(err.message, err.type, err.code)

    def received(self) -> list[dict[str, Any]]:
        return [self.acc.message()]


class MaskedChunks:
    """A chat upstream's events with the call's credentials masked in their text -- the content,
    refusal and reasoning deltas and the tool calls' arguments of every choice -- however the
    deltas cut them (``secrets.TextMasker``): what may begin a credential is held back a chunk,
    and given out by the chunk that finishes the choice at the latest. A chunk is re-encoded only
    when its text changed."""

    _FIELDS = ("content", "refusal", "reasoning_content")

    def __init__(self, masker: TextMasker) -> None:
        self.masker = masker

    def __call__(self, event: bytes) -> bytes:
        chunk = payload(event)
        if not isinstance(chunk, dict) or not isinstance(chunk.get("choices"), list):
            return event
        changed = False
        for choice in chunk["choices"]:
            if isinstance(choice, dict) and isinstance(choice.get("delta"), dict):
                changed = self._choice(choice, choice.get("index", 0)) or changed
        return b"data: " + _encode(chunk) if changed else event

    def _choice(self, choice: dict[str, Any], index: Any) -> bool:
        masker, delta, changed = self.masker, choice["delta"], False
        for field in self._FIELDS:
            value = delta.get(field)
            if isinstance(value, str) and value:
                out = masker.feed((index, field), value)
                if out != value:
                    delta[field], changed = out, True
        calls = delta.get("tool_calls")
        for call in calls if isinstance(calls, list) else ():
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict) and isinstance(fn.get("arguments"), str) and fn["arguments"]:
                out = masker.feed((index, "tool", call.get("index", 0)), fn["arguments"])
                if out != fn["arguments"]:
                    fn["arguments"], changed = out, True
        if choice.get("finish_reason") and masker.holding:
            changed = self._flush(delta, index) or changed
        return changed

    def _flush(self, delta: dict[str, Any], index: Any) -> bool:
        changed = False
        for field in self._FIELDS:
            held = self.masker.flush((index, field))
            if held:
                delta[field] = (delta.get(field) or "") + held
                changed = True
        for key in [k for k in self.masker.held() if k[0] == index and k[1] == "tool"]:
            held = self.masker.flush(key)
            calls = delta.setdefault("tool_calls", [])
            calls.append({"index": key[2], "function": {"arguments": held}})
            changed = True
        return changed
