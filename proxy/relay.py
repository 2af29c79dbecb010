"""Streaming relays, as ASGI apps.

``StreamRelay`` forwards an upstream SSE stream of a stored call to the client event by event, as
it arrives, through the ``Translator`` of the call's dialects (proxy.dialects), which also rebuilds
the answer that will be stored. It sends the response start (with the node headers) first, then
pumps events; a task watching ``receive()`` notices a client disconnect and stops the pump (an
answer already whole is stored as a success at once, else the node fails as client_disconnected).
A client that takes nothing of its answer for ``send_timeout`` seconds (``[server]
client_send_timeout``: its socket stays full, and the server's ``send`` waits for room) is one that
went away: otherwise it would hold its conversation's lease and an upstream connection for as long
as it kept its socket open. ``BytesRelay`` ends such a client's answer the same way.
Whatever happens -- the end event, an error event, a cut stream, a disconnect -- exactly one
``StreamEnd`` reaches the ``on_end`` callback, shielded from cancellation, so the node is always
finalized.

``BytesRelay`` relays a pass-through answer byte for byte (nothing parsed, nothing stored; the
forwarder masks echoed credentials in the bytes it is given). An
answer cut at ``max_response_bytes`` never ends like a whole one: an event stream ends with an
error event; any other body is read ahead (up to ``LOOKAHEAD`` bytes) before its status goes out,
so one cut within that is answered 502 ``upstream_response_too_large`` instead, and one cut later
has its connection aborted (no end of the body is sent: the client sees a broken answer, never a
short 200).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from storage import Outcome

from .background import Background
from .errors import UpstreamBadResponse, UpstreamFailure, UpstreamTooLarge
from .failures import Failure, cancellation_handled, interrupted
from .sse import SSEParser, sse_error_event

__all__ = ["LOOKAHEAD", "OPENAI_ERRORS", "BytesRelay", "ClientStalled", "ErrorVoice", "StreamEnd", "StreamRelay", "Translator",
           "client_disconnected", "relay_error", "timed_send", "wait_for_disconnect"]

log = logging.getLogger("branchpoint.relay")


class Translator(Protocol):
    """What a relayed stream becomes for the client, event by event, and what is stored of it.
    Each dialect brings its own (proxy.dialects): relayed as it is when the client and the
    upstream speak the same API, translated event by event when they do not."""

    finished: bool  # the upstream's stream ended properly
    error: Any  # an error event's payload: the stream failed

    def opening(self) -> bytes: ...  # sent before the first upstream event

    def event(self, raw: bytes) -> bytes: ...  # what the client gets for one upstream event

    def closing(self) -> bytes: ...  # the end of the stream, sent once the node is stored

    # the upstream's body ended without the stream's end event: what the client gets then, and
    # ``finished`` set when the answer is whole anyway (a chat stream whose choice finished: some
    # OpenAI-compatible servers send no [DONE]); else the stream was cut
    def ended(self) -> bytes: ...

    def failing(self, failure: Failure) -> bytes: ...  # the end of a stream that failed

    def received(self) -> list[dict[str, Any]]: ...  # the answer, as stored

    # the client left before the stream's end: whether the answer was whole already -- all that
    # was still to come was its usage and the stream's end (a chat stream whose every choice
    # finished, an Anthropic one past its stop_reason, a Responses one completed); then
    # ``received`` and ``usage`` give it as it is stored
    def complete(self) -> bool: ...

    usage: dict[str, Any] | None
    finish_reason: str | None


@dataclass(slots=True)
class StreamEnd:
    """How a relayed stream ended. ``failure`` is None on success."""

    translator: Translator
    disconnected: bool
    failure: Failure | None

    @property
    def usage(self) -> dict[str, Any] | None:
        """The usage the stream reported, or None -- also when the translator cannot read it:
        whatever it holds, the call's node is finished."""
        try:
            return self.translator.usage
        except Exception:
            log.exception("a streamed answer's usage could not be read")
            return None


# stores the outcome; returns the failure it stored instead of the answer when the answer could
# not be read (None: stored as the stream ended)
OnEnd = Callable[[StreamEnd], Awaitable["Failure | None"]]
ClassifyError = Callable[[Any], Failure]


@dataclass(slots=True, kw_only=True)
class StreamRelay:
    """ASGI app relaying ``chunks`` (upstream SSE bytes) to the client through a translator."""

    chunks: AsyncIterator[bytes]
    headers: list[tuple[bytes, bytes]]
    on_end: OnEnd
    close_upstream: Callable[[], Awaitable[None]]
    classify_error: ClassifyError
    translator: Translator
    background: Background
    send_timeout: float = 0.0  # seconds the client may take nothing of its answer (0: no limit)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        failure: Failure | None = None
        disconnected = False
        finished = False
        send = timed_send(send, self.send_timeout)
        pump = asyncio.ensure_future(self._pump(send))
        watch = asyncio.ensure_future(wait_for_disconnect(receive))
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.headers})
            await asyncio.wait((pump, watch), return_when=asyncio.FIRST_COMPLETED)
            if not pump.done() or watch.done():  # (gone before the end reached it: the end was never seen)
                disconnected = True
                pump.cancel()
                await asyncio.gather(pump, return_exceptions=True)
                failure = self._left("the client disconnected before the stream ended")
            else:
                failure = pump.result()
                end = b""
                if failure is None:
                    try:
                        end = self.translator.closing()
                    except Exception as exc:  # (an upstream's odd answer the translator could not end)
                        log.exception("the stream's end could not be made")
                        failure = relay_error(exc)
                # The node is stored (and the head moved, the lease released) before the client
                # sees the end of the stream: a client that sends its next call the moment it
                # reads the end must find the conversation free and the head on this answer.
                finished = True
                stored = await self._finish_shielded(StreamEnd(self.translator, False, failure))
                failure = failure or stored
                if failure is not None:
                    end = self.translator.failing(failure)
                if end:
                    await send({"type": "http.response.body", "body": end, "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except (OSError, RuntimeError) as exc:  # the client went away under our send(), or stopped reading
            disconnected = True
            if not finished:
                failure = failure or self._left(str(exc) if isinstance(exc, ClientStalled)
                                                else f"the client connection failed: {type(exc).__name__}")
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
            elif not pump.cancelled():
                pump.exception()  # (retrieved: a stall the shutdown overtook is not "never retrieved")
            if isinstance(send, _TimedSend):
                send.close()
            if not finished:
                await self._finish_shielded(StreamEnd(self.translator, disconnected, failure))

    def _left(self, message: str) -> Failure | None:
        """The client went away before the stream's end: ``client_disconnected`` -- or None (a
        success) when it had its whole answer already (``Translator.complete``). The upstream's
        rest (the usage, the end) is not waited for: the node is stored at once, so the client's
        next call finds the conversation free, with the usage seen so far
        (docs/behaviour.md#the-chat-endpoint)."""
        try:
            if self.translator.error is None and self.translator.complete():
                return None
        except Exception:  # (an answer the translator cannot say whole is not)
            log.exception("a streamed answer's completeness could not be read")
        return client_disconnected(message)

    async def _finish_shielded(self, end: StreamEnd) -> Failure | None:
        """Close the upstream and store the outcome, even if this task is being cancelled: then
        (the shutdown's grace ran out) the storing goes on in the background, which the shutdown
        waits for, and the cancellation counts as handled -- the client still gets its stream's end.
        Returns the failure stored instead of the answer (``OnEnd``)."""
        try:
            return await asyncio.shield(self.background.spawn(self._finish(end)))
        except asyncio.CancelledError:
            cancellation_handled()
            return None

    async def _finish(self, end: StreamEnd) -> Failure | None:
        if end.translator.finished and end.failure is None:
            # the body's last bytes (the chunked terminator) usually follow the end at once: read
            # them in the background so the connection goes back to the pool, without waiting
            self.background.spawn(self._drain_then_close())
        else:
            await self._close()
        return await self.on_end(end)

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
                    try:
                        piece = translator.event(event)
                    except UpstreamFailure:  # (a broken event: what came before it still goes out)
                        if out:
                            await send({"type": "http.response.body", "body": b"".join(out), "more_body": True})
                        raise
                    if piece:
                        out.append(piece)
                    if translator.error is not None or translator.finished:
                        break
                if out:
                    await send({"type": "http.response.body", "body": b"".join(out), "more_body": True})
                if translator.error is not None or translator.finished:
                    break
            else:  # the body ended, and no end event came
                rest = translator.ended()
                if rest:
                    await send({"type": "http.response.body", "body": rest, "more_body": True})
        except UpstreamFailure as exc:
            code = exc.code if isinstance(exc, (UpstreamTooLarge, UpstreamBadResponse)) else "stream_interrupted"
            return Failure.of(Outcome.TRANSIENT, exc.type, code, exc.message)
        except (OSError, RuntimeError):
            raise  # the client side failed: handled by __call__
        except Exception as exc:
            log.exception("stream relay failed")
            return relay_error(exc)
        if translator.error is not None:
            return self.classify_error(translator.error)
        if not translator.finished:
            return Failure.of(Outcome.TRANSIENT, "upstream_error", "stream_interrupted",
                              "the upstream stream ended without its end event")
        return None


def relay_error(exc: Exception) -> Failure:
    """The relay itself failed -- on an upstream's odd events, say, or an answer that could not be
    read at the end: transient, the proxy's error."""
    return Failure.of(Outcome.TRANSIENT, "server_error", "relay_error", type(exc).__name__, 500)


async def wait_for_disconnect(receive: Any) -> None:
    """Returns when the client has gone away (ASGI ``http.disconnect``)."""
    while True:
        if (await receive())["type"] == "http.disconnect":
            return


class ClientStalled(OSError):
    """The client took nothing of its answer for ``[server] client_send_timeout`` seconds: ended as
    a client that went away (the server closes its connection: the answer was left unfinished)."""


def timed_send(send: Any, timeout: float) -> Any:
    """``send`` raising ``ClientStalled`` when a message is not taken within ``timeout`` seconds --
    the server's ``send`` waits while the client's socket is full (0: no limit). Call ``close()``
    on it when the response ends (its timer goes)."""
    return _TimedSend(send, timeout) if timeout > 0 else send


class _TimedSend:
    """One timer a response, not one a message: a send notes when it began, and the timer, when it
    fires, ends a send begun ``timeout`` ago (its task cancelled, the cancellation turned into
    ``ClientStalled``) or is set again for the send in progress -- none while nothing is sent.
    (``asyncio.timeout`` around each send cost ~7 us a message, against <1 us this way: a stream's
    every event passes here.)"""

    __slots__ = ("_handle", "_loop", "_send", "_since", "_stalled", "_task", "timeout")

    def __init__(self, send: Any, timeout: float) -> None:
        self._send = send
        self.timeout = timeout
        self._loop = asyncio.get_running_loop()
        self._since: float | None = None
        self._task: asyncio.Task[Any] | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._stalled = False

    async def __call__(self, message: Any) -> None:
        if self._stalled:
            raise self._error()
        self._since = since = self._loop.time()
        self._task = task = asyncio.current_task()
        if self._handle is None:
            self._handle = self._loop.call_at(since + self.timeout, self._check)
        try:
            await self._send(message)
        except asyncio.CancelledError:
            # (ours, and nobody else's: the shutdown's cancellation stays one)
            if self._stalled and task is self._task and task is not None and task.uncancel() == 0:
                raise self._error() from None
            raise
        finally:
            if self._task is task:  # (another task's send begun meanwhile stays watched)
                self._since = None

    def _check(self) -> None:
        self._handle = None
        since, task = self._since, self._task
        if since is None or task is None:
            return  # (nothing in progress: the next send sets the timer again)
        if self._loop.time() - since >= self.timeout:
            self._stalled = True
            task.cancel()
        else:
            self._handle = self._loop.call_at(since + self.timeout, self._check)

    def _error(self) -> ClientStalled:
        return ClientStalled(f"the client took nothing of its answer for {self.timeout:g} s "
                             "(server.client_send_timeout)")

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


def client_disconnected(message: str = "the client disconnected before the answer arrived") -> Failure:
    """The client went away before its answer was complete: transient (HTTP 499 in the logs)."""
    return Failure.of(Outcome.TRANSIENT, "client_disconnected", "client_disconnected", message, 499)


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
            if isinstance(send, _TimedSend):
                send.close()
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
                                                     (b"content-length", str(len(body)).encode())])
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
            code = exc.code if isinstance(exc, UpstreamTooLarge) else "stream_interrupted"
            return self.errors.event(exc.status, exc.type, code, exc.message)
        return None
