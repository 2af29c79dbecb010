"""Streaming relay: forwards an upstream SSE stream to the client event by event, as it arrives,
while ``StreamAccumulator`` rebuilds the assistant message that will be stored.

The relay is an ASGI app. It sends the response start (with the node headers) first, then pumps
events; a task watching ``receive()`` notices a client disconnect and stops the pump. Whatever
happens -- ``[DONE]``, an error event, a cut stream, a disconnect -- exactly one ``StreamEnd``
reaches the ``on_end`` callback, shielded from cancellation, so the node is always finalized.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

from storage import Outcome

from .background import Background
from .errors import UpstreamFailure, UpstreamTooLarge, error_body
from .failures import Failure, cancellation_handled, interrupted

__all__ = [
    "BytesRelay",
    "ChatStream",
    "SSEParser",
    "StreamAccumulator",
    "StreamEnd",
    "StreamRelay",
    "Translator",
    "client_disconnected",
    "sse_error_event",
]

log = logging.getLogger("branchpoint.relay")

_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode


def sse_error_event(message: str, type_: str, code: str | None) -> bytes:
    return b"data: " + error_body(message, type_, code) + b"\n\n"


class SSEParser:
    """Splits a byte stream into complete SSE events (``\\n\\n``-terminated, ``\\r\\n`` tolerated).

    Linear in the bytes fed, however they are cut: each chunk is normalised on its own (a ``\\r``
    at its end waits for the next chunk), and the search for the end of an event resumes where
    the last one stopped -- an event that never ends costs no more than its bytes."""

    __slots__ = ("_buf", "_cr", "_scanned")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._scanned = 0  # bytes of _buf known to hold no event end
        self._cr = False  # the last chunk ended with \r

    def feed(self, chunk: bytes) -> list[bytes]:
        if self._cr:
            chunk = b"\r" + chunk
            self._cr = False
        if chunk.endswith(b"\r"):
            chunk = chunk[:-1]
            self._cr = True
        if b"\r" in chunk:
            chunk = chunk.replace(b"\r\n", b"\n")
        buf = self._buf
        buf += chunk
        pos = buf.find(b"\n\n", max(self._scanned - 1, 0))
        if pos < 0:
            self._scanned = len(buf)
            return []
        events = []
        start = 0
        while pos >= 0:
            if pos > start:
                events.append(bytes(buf[start:pos]))
            start = pos + 2
            pos = buf.find(b"\n\n", start)
        del buf[:start]
        self._scanned = len(buf)
        return events

    @property
    def pending(self) -> bytes:
        return bytes(self._buf)

    @staticmethod
    def data(event: bytes) -> bytes | None:
        """The joined ``data:`` payload of an event, or None (comments, other fields only)."""
        if event.startswith(b"data:") and b"\n" not in event:
            payload = event[5:]
            return payload[1:] if payload.startswith(b" ") else payload
        parts = []
        for line in event.split(b"\n"):
            if line.startswith(b"data:"):
                payload = line[5:]
                parts.append(payload[1:] if payload.startswith(b" ") else payload)
        return b"\n".join(parts) if parts else None


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


class Translator(Protocol):
    """What a relayed stream becomes for the client, event by event, and what is stored of it.
    ``ChatStream`` relays a chat-completions stream as it is; ``proxy.responses.stream`` turns
    one into Responses events, or relays a Responses upstream's own."""

    finished: bool  # the upstream's stream ended properly
    error: Any  # an error event's payload: the stream failed

    def opening(self) -> bytes: ...  # sent before the first upstream event

    def event(self, raw: bytes) -> bytes: ...  # what the client gets for one upstream event

    def closing(self) -> bytes: ...  # the end of the stream, sent once the node is stored

    def failing(self, failure: Failure) -> bytes: ...  # the end of a stream that failed

    def received(self) -> list[dict[str, Any]]: ...  # the answer, as stored

    usage: dict[str, Any] | None
    finish_reason: str | None


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
        data = SSEParser.data(raw)
        if data is None:
            return raw + b"\n\n"  # comment / keep-alive: relayed as is
        if data == b"[DONE]":
            self.finished = True
            self._tail = raw + b"\n\n"
            return b""
        try:
            chunk = _decode(data)
        except (msgspec.DecodeError, RecursionError):
            return raw + b"\n\n"
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


@dataclass(slots=True)
class StreamEnd:
    """How a relayed stream ended. ``failure`` is None on success."""

    translator: Translator
    disconnected: bool
    failure: Failure | None


OnEnd = Callable[[StreamEnd], Awaitable[None]]
ClassifyError = Callable[[Any], Failure]


class StreamRelay:
    """ASGI app relaying ``chunks`` (upstream SSE bytes) to the client through a translator."""

    def __init__(
        self,
        chunks: AsyncIterator[bytes],
        *,
        headers: list[tuple[bytes, bytes]],
        on_end: OnEnd,
        close_upstream: Callable[[], Awaitable[None]],
        classify_error: ClassifyError,
        translator: Translator,
        background: Background,
    ) -> None:
        self.chunks = chunks
        self.headers = headers
        self.on_end = on_end
        self.close_upstream = close_upstream
        self.classify_error = classify_error
        self.translator = translator
        self.background = background

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        failure: Failure | None = None
        disconnected = False
        finished = False
        pump = asyncio.ensure_future(self._pump(send))
        watch = asyncio.ensure_future(self._watch(receive))
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.headers})
            await asyncio.wait((pump, watch), return_when=asyncio.FIRST_COMPLETED)
            if not pump.done():
                disconnected = True
                pump.cancel()
                await asyncio.gather(pump, return_exceptions=True)
                failure = client_disconnected("the client disconnected before the stream ended")
            else:
                failure = pump.result()
                # The node is stored (and the head moved, the lease released) before the client
                # sees the end of the stream: a client that sends its next call the moment it
                # reads the end must find the conversation free and the head on this answer.
                finished = True
                await self._finish_shielded(StreamEnd(self.translator, False, failure))
                end = self.translator.failing(failure) if failure is not None else self.translator.closing()
                if end:
                    await send({"type": "http.response.body", "body": end, "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except (OSError, RuntimeError) as exc:  # the client went away under our send()
            disconnected = True
            failure = failure or client_disconnected(f"the client connection failed: {type(exc).__name__}")
        except asyncio.CancelledError:
            # only the server cancels a response: its shutdown grace ran out (docs/behaviour.md#shutdown)
            if finished:
                raise
            failure = interrupted("the proxy shut down during the stream")
            log.warning("stream interrupted by the shutdown")
            cancellation_handled()  # the client gets the stream's end: an error event
            try:
                await send({"type": "http.response.body", "body": self.translator.failing(failure), "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            except (OSError, RuntimeError):
                disconnected = True
        finally:
            watch.cancel()
            if not pump.done():
                pump.cancel()
            if not finished:
                await self._finish_shielded(StreamEnd(self.translator, disconnected, failure))

    async def _finish_shielded(self, end: StreamEnd) -> None:
        """Close the upstream and store the outcome, even if this task is being cancelled: then
        (the shutdown's grace ran out) the storing goes on in the background, which the shutdown
        waits for, and the cancellation counts as handled -- the client still gets its stream's end."""
        try:
            await asyncio.shield(self.background.spawn(self._finish(end)))
        except asyncio.CancelledError:
            cancellation_handled()

    async def _finish(self, end: StreamEnd) -> None:
        if end.translator.finished and end.failure is None:
            # the body's last bytes (the chunked terminator) usually follow the end at once: read
            # them in the background so the connection goes back to the pool, without waiting
            self.background.spawn(self._drain_then_close())
        else:
            await self._close()
        await self.on_end(end)

    async def _drain_then_close(self) -> None:
        try:
            async with asyncio.timeout(5):
                async for _ in self.chunks:
                    pass
        except Exception:  # noqa: BLE001 - whatever follows the end does not matter any more
            pass
        finally:
            await self._close()

    async def _close(self) -> None:
        try:
            await self.close_upstream()
        except Exception:
            log.debug("closing the upstream stream failed", exc_info=True)

    @staticmethod
    async def _watch(receive: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return

    async def _pump(self, send: Any) -> Failure | None:
        """Relay events as they arrive, up to the stream's end (held back by the translator);
        returns the failure, if any (None: success)."""
        parser = SSEParser()
        translator = self.translator
        try:
            opening = translator.opening()
            if opening:
                await send({"type": "http.response.body", "body": opening, "more_body": True})
            async for raw in self.chunks:
                out = []
                for event in parser.feed(raw):
                    piece = translator.event(event)
                    if piece:
                        out.append(piece)
                    if translator.error is not None or translator.finished:
                        break
                if out:
                    await send({"type": "http.response.body", "body": b"".join(out), "more_body": True})
                if translator.error is not None or translator.finished:
                    break
        except UpstreamFailure as exc:
            code = exc.code if isinstance(exc, UpstreamTooLarge) else "stream_interrupted"
            return Failure.of(Outcome.TRANSIENT, exc.type, code, exc.message)
        except (OSError, RuntimeError):
            raise  # the client side failed: handled by __call__
        except Exception as exc:
            log.exception("stream relay failed")
            return Failure.of(Outcome.TRANSIENT, "server_error", "relay_error", type(exc).__name__, 500)
        if translator.error is not None:
            return self.classify_error(translator.error)
        if not translator.finished:
            return Failure.of(Outcome.TRANSIENT, "upstream_error", "stream_interrupted",
                              "the upstream stream ended without its end event")
        return None


def client_disconnected(message: str = "the client disconnected before the answer arrived") -> Failure:
    """The client went away before its answer was complete: transient (HTTP 499 in the logs)."""
    return Failure.of(Outcome.TRANSIENT, "client_disconnected", "client_disconnected", message, 499)


class BytesRelay:
    """ASGI app relaying an upstream response byte for byte (pass-through: nothing is parsed or
    stored). Stops reading the upstream when the client goes away."""

    def __init__(self, status: int, headers: list[tuple[bytes, bytes]], chunks: AsyncIterator[bytes],
                 close_upstream: Callable[[], Awaitable[None]]) -> None:
        self.status = status
        self.headers = headers
        self.chunks = chunks
        self.close_upstream = close_upstream
        # an event stream is ended with an error event when cut; any other body just ends
        self.sse = any(k == b"content-type" and v.startswith(b"text/event-stream") for k, v in headers)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        watch = asyncio.ensure_future(StreamRelay._watch(receive))
        pump = asyncio.ensure_future(self._pump(send))
        try:
            try:
                await asyncio.wait((pump, watch), return_when=asyncio.FIRST_COMPLETED)
            except asyncio.CancelledError:  # the shutdown's grace ran out: ended like a cut upstream
                cancellation_handled()
                pump.cancel()
                await asyncio.gather(pump, return_exceptions=True)
                err = interrupted("the proxy shut down during the answer").error
                failed = sse_error_event(err.message, err.type, err.code) if self.sse else b""
            else:
                if not pump.done():
                    return
                failed = pump.result()
            if failed is not None:  # cut mid-body: tell an SSE client, else just end
                await send({"type": "http.response.body", "body": failed, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            watch.cancel()
            pump.cancel()
            await asyncio.shield(self.close_upstream())

    async def _pump(self, send: Any) -> bytes | None:
        await send({"type": "http.response.start", "status": self.status, "headers": self.headers})
        try:
            async for chunk in self.chunks:
                if chunk:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except UpstreamFailure as exc:
            log.info("pass-through stream cut", extra={"error": exc.message})
            code = exc.code if isinstance(exc, UpstreamTooLarge) else "stream_interrupted"
            return sse_error_event(exc.message, exc.type, code) if self.sse else b""
        return None
