"""A fake Anthropic upstream (the Messages API): records what it received, answers scripted
messages as JSON or as Anthropic's event stream (``message_start``, ``content_block_*``,
``message_delta``, ``message_stop``, with ``ping`` events between)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from tests.fakes import Recorded, asgi_body


@dataclass
class AReply:
    """One scripted answer: ``content`` blocks (default: one text block echoing the last user
    text), or an error (``status`` + ``error`` type/message), or a stream that fails midway."""

    content: list[dict[str, Any]] | None = None
    stop_reason: str = "end_turn"
    usage: dict[str, Any] = field(default_factory=lambda: {"input_tokens": 11, "output_tokens": 5})
    status: int = 200
    error: dict[str, Any] | None = None  # {"type": ..., "message": ...}
    stream_error: dict[str, Any] | None = None  # an error event after the first block
    cut: bool = False  # drop the connection after the first block
    gate: threading.Event | None = None  # a stream: wait for this between message_delta and message_stop
    empty_input_delta: bool = False  # a stream: a tool_use with empty input gets one input_json_delta of "" (else "{}")


# Fields of OpenAI's APIs that Anthropic's refuses, as it refuses any field it does not know
# ("<field>: Extra inputs are not permitted", 400): a translation that forwarded one of them would
# fail every call against the real API, so the fake refuses them too. (Not every unknown field: a
# native client may rightly send one of Anthropic's the fake does not list.)
OPENAI_ONLY = frozenset({
    "prompt_cache_key", "prompt_cache_retention", "prompt_cache_options", "safety_identifier", "response_format",
    "reasoning_effort", "reasoning", "seed", "n", "logprobs", "top_logprobs", "logit_bias", "frequency_penalty",
    "presence_penalty", "parallel_tool_calls", "max_completion_tokens", "stream_options", "store", "user",
    "modalities", "audio", "prediction", "web_search_options", "verbosity", "functions", "function_call",
    "moderation", "text", "input", "instructions", "previous_response_id", "truncation", "include",
    "max_output_tokens", "conversation", "background", "prompt",
})


def _refused_field(body: Any) -> str | None:
    if not isinstance(body, dict):
        return None
    for key in body:
        if key in OPENAI_ONLY:
            return key
    if body.get("service_tier") not in (None, "auto", "standard_only"):
        return "service_tier"
    return None


def _last_user_text(body: dict[str, Any]) -> str:
    for m in reversed(body.get("messages") or []):
        if m.get("role") != "user":
            continue
        content = m.get("content")
        if isinstance(content, str):
            return content
        texts = [b.get("text", "") for b in content or () if isinstance(b, dict) and b.get("type") == "text"]
        if texts:
            return texts[-1]
    return ""


class FakeAnthropic:
    """An ASGI app speaking enough of Anthropic's Messages API (``/v1/messages``,
    ``/v1/messages/count_tokens``)."""

    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self.queue: deque[AReply] = deque()
        self.lock = threading.Lock()
        self.counter = 0

    def enqueue(self, *replies: AReply) -> None:
        with self.lock:
            self.queue.extend(replies)

    def reset(self) -> None:
        with self.lock:
            self.requests.clear()
            self.queue.clear()

    @property
    def calls(self) -> list[Recorded]:
        return [r for r in self.requests if r.path.split("?")[0].endswith("/messages")]

    @property
    def last(self) -> Recorded:
        return self.calls[-1]

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        raw = await asgi_body(scope, receive, send)
        if raw is None:
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        body: Any = json.loads(raw) if raw else None
        path = scope["path"] + ("?" + scope["query_string"].decode() if scope.get("query_string") else "")
        with self.lock:
            self.requests.append(Recorded(scope["method"], path, headers, body, raw))
            self.counter += 1
            n = self.counter
            reply = self.queue.popleft() if self.queue and scope["path"].endswith("/messages") else None
        if scope["path"].endswith("/messages/count_tokens"):
            await self._json(send, 200, {"input_tokens": 42})
            return
        if not scope["path"].endswith("/messages"):
            await self._json(send, 404, {"type": "error", "error": {"type": "not_found_error", "message": "no route"}})
            return
        reply = reply or AReply()
        refused = _refused_field(body)
        if refused is not None:
            await self._json(send, 400, {"type": "error", "error": {
                "type": "invalid_request_error", "message": f"{refused}: Extra inputs are not permitted"}})
            return
        if reply.error is not None:
            await self._json(send, reply.status, {"type": "error", "error": reply.error})
            return
        content = reply.content if reply.content is not None else [
            {"type": "text", "text": f"echo: {_last_user_text(body)}"}]
        message = {"id": f"msg_fake{n}", "type": "message", "role": "assistant", "model": body.get("model"),
                   "content": content, "stop_reason": reply.stop_reason, "stop_sequence": None, "usage": reply.usage}
        if body.get("stream"):
            await self._stream(send, message, reply)
        else:
            await self._json(send, 200, message)

    @staticmethod
    async def _json(send: Any, status: int, data: Any) -> None:
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"request-id", b"req_fake")]})
        await send({"type": "http.response.body", "body": json.dumps(data).encode()})

    @staticmethod
    async def _stream(send: Any, message: dict[str, Any], reply: AReply) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream"), (b"request-id", b"req_fake")]})

        async def event(kind: str, data: dict[str, Any]) -> None:
            line = f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode()
            await send({"type": "http.response.body", "body": line, "more_body": True})
            await asyncio.sleep(0)

        start = {**message, "content": [], "stop_reason": None,
                 "usage": {**message["usage"], "output_tokens": 1}}
        await event("message_start", {"message": start})
        await event("ping", {})
        for i, block in enumerate(message["content"]):
            kind = block.get("type")
            if kind == "text":
                await event("content_block_start", {"index": i, "content_block": {"type": "text", "text": ""}})
                text = block["text"]
                for j in range(0, len(text), 4):
                    await event("content_block_delta", {"index": i, "delta": {"type": "text_delta", "text": text[j:j + 4]}})
            elif kind in ("tool_use", "server_tool_use", "mcp_tool_use"):
                await event("content_block_start", {"index": i, "content_block": {**block, "input": {}}})
                args = "" if reply.empty_input_delta and not block["input"] else json.dumps(block["input"])
                if not args:  # (how Anthropic streams a call without input: one empty piece)
                    await event("content_block_delta", {"index": i, "delta": {"type": "input_json_delta", "partial_json": ""}})
                for j in range(0, len(args), 5):
                    await event("content_block_delta",
                                {"index": i, "delta": {"type": "input_json_delta", "partial_json": args[j:j + 5]}})
            elif kind == "thinking":
                await event("content_block_start", {"index": i, "content_block": {"type": "thinking", "thinking": ""}})
                await event("content_block_delta", {"index": i, "delta": {"type": "thinking_delta",
                                                                          "thinking": block["thinking"]}})
                await event("content_block_delta", {"index": i, "delta": {"type": "signature_delta",
                                                                          "signature": block["signature"]}})
            elif kind == "compaction":  # (server-side compaction: an empty block, then the summary in one delta)
                await event("content_block_start", {"index": i, "content_block": {"type": "compaction", "content": None}})
                await event("content_block_delta", {"index": i, "delta": {
                    "type": "compaction_delta", "content": block.get("content"),
                    "encrypted_content": block.get("encrypted_content")}})
            else:
                await event("content_block_start", {"index": i, "content_block": block})
            await event("content_block_stop", {"index": i})
            if i == 0 and reply.stream_error is not None:
                await event("error", {"error": reply.stream_error})
                await send({"type": "http.response.body", "body": b""})
                return
            if i == 0 and reply.cut:
                raise ConnectionResetError("fake anthropic cut the stream")
        await event("message_delta", {"delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                                      "usage": {"output_tokens": message["usage"].get("output_tokens", 0)}})
        if reply.gate is not None:
            await asyncio.to_thread(reply.gate.wait, 30)
        await event("message_stop", {})
        await send({"type": "http.response.body", "body": b""})
