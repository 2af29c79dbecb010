"""The pass-through relay, as an ASGI app: an upstream's answer byte for byte (nothing parsed,
nothing stored; the forwarder masks echoed credentials in the bytes it is given). An answer cut at
``max_response_bytes`` never ends like a whole one: an event stream ends with an error event; any
other body is read ahead (up to ``LOOKAHEAD`` bytes) before its status goes out, so one cut within
that is answered 502 ``upstream_response_too_large`` instead, and one cut later has its connection
aborted (no end of the body is sent: the client sees a broken answer, never a short 200). A
client that takes nothing for ``[server] client_send_timeout`` is left the same way
(proxy/sending.py)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from .errors import UpstreamFailure, UpstreamTimeout, UpstreamTooLarge
from .failures import cancellation_handled, interrupted
from .http import encode_headers
from .relay import wait_for_disconnect
from .sending import ClientStalled, close_timed, timed_send
from .sse import sse_error_event

__all__ = ["LOOKAHEAD", "OPENAI_ERRORS", "BytesRelay", "ErrorVoice"]

log = logging.getLogger("branchpoint.relay")


@dataclass(frozen=True, slots=True)
class ErrorVoice:
    """How a pass-through relay says an error of its own, in its client's API: ``body(status, our
    OpenAI-shaped body)`` -> the body; ``event(status, type, code, message)`` -> the SSE event a
    cut stream ends with."""

    body: Callable[[int, bytes], bytes]
    event: Callable[[int, str, str | None, str], bytes]


OPENAI_ERRORS = ErrorVoice(lambda status, body: body,
                           lambda status, type_, code, message: sse_error_event(message, type_, code))

LOOKAHEAD = 4 << 20  # a pass-through body that is not an event stream: read this far before its status is sent
_ABORT = object()  # the pump's answer: cut after the status went out -- end the connection unfinished


class BytesRelay:
    """ASGI app relaying an upstream response byte for byte, as given (pass-through: nothing is parsed or
    stored). Stops reading the upstream when the client goes away, or takes nothing for
    ``send_timeout`` seconds (its connection then ends unfinished)."""

    def __init__(self, status: int, headers: list[tuple[bytes, bytes]], chunks: AsyncIterator[bytes],
                 close_upstream: Callable[[], Awaitable[None]], *, errors: ErrorVoice | None = None,
                 send_timeout: float = 0.0) -> None:
        self.status = status
        self.send_timeout = send_timeout
        self.headers = headers
        self.chunks = chunks
        self.close_upstream = close_upstream
        self.errors = errors or OPENAI_ERRORS  # how our own errors are said: the client's API's shape
        # an event stream is ended with an error event when cut; any other body is refused or aborted
        self.sse = any(k == b"content-type" and v.startswith(b"text/event-stream") for k, v in headers)
        self._started = False  # the response's start went out

    async def _start(self, send: Any, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self._started = True
        await send({"type": "http.response.start", "status": status, "headers": headers})

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        send = timed_send(send, self.send_timeout)
        watch = asyncio.ensure_future(wait_for_disconnect(receive))
        pump = asyncio.ensure_future(self._pump(send))
        try:
            try:
                await asyncio.wait((pump, watch), return_when=asyncio.FIRST_COMPLETED)
            except asyncio.CancelledError:  # the shutdown's grace ran out: ended like a cut upstream
                cancellation_handled()
                pump.cancel()
                await asyncio.gather(pump, return_exceptions=True)
                failure = interrupted("the proxy shut down during the answer")
                err = failure.error
                if not self._started:  # (still reading ahead: nothing went out)
                    await send({"type": "http.response.start", "status": failure.status,
                                "headers": [(b"content-type", b"application/json")]})
                    failed = self.errors.body(failure.status, failure.body)
                else:
                    failed = self.errors.event(failure.status, err.type, err.code, err.message) if self.sse else _ABORT
            else:
                if not pump.done():
                    return
                failed = pump.result()
            if failed is _ABORT:  # (uvicorn closes a connection whose answer was left unfinished)
                return
            if failed:  # cut mid-stream: tell the SSE client
                await send({"type": "http.response.body", "body": failed, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except ClientStalled as exc:  # (left unfinished: uvicorn closes the connection)
            log.info("pass-through answer ended: the client stopped reading", extra={"error": str(exc)})
        finally:
            watch.cancel()
            pump.cancel()
            close_timed(send)
            await asyncio.shield(self.close_upstream())

    async def _pump(self, send: Any) -> Any:
        """Relay the body; returns None (whole), an SSE error event to end with, or ``_ABORT``."""
        chunks = self.chunks.__aiter__()
        ahead: list[bytes] = []
        if not self.sse:
            size = 0
            try:
                while size <= LOOKAHEAD:
                    try:
                        chunk = await chunks.__anext__()
                    except StopAsyncIteration:
                        await self._start(send, self.status, self.headers)
                        await send({"type": "http.response.body", "body": b"".join(ahead), "more_body": True})
                        return None
                    ahead.append(chunk)
                    size += len(chunk)
            except UpstreamFailure as exc:  # cut before anything went out: say so
                log.info("pass-through answer refused", extra={"error": exc.message})
                body = self.errors.body(exc.status, exc.body())
                await self._start(send, exc.status, [(b"content-type", b"application/json"),
                                                     (b"content-length", str(len(body)).encode()),
                                                     *encode_headers(exc.headers.items())])
                await send({"type": "http.response.body", "body": body, "more_body": True})
                return None
        await self._start(send, self.status, self.headers)
        if ahead:
            await send({"type": "http.response.body", "body": b"".join(ahead), "more_body": True})
            ahead.clear()
        try:
            async for chunk in chunks:
                if chunk:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except UpstreamFailure as exc:
            log.info("pass-through stream cut", extra={"error": exc.message})
            if not self.sse:
                return _ABORT
            code = exc.code if isinstance(exc, (UpstreamTooLarge, UpstreamTimeout)) else "stream_interrupted"
            return self.errors.event(exc.status, exc.type, code, exc.message)
        return None
