"""Streaming relays, as ASGI apps.

``StreamRelay`` forwards an upstream SSE stream of a stored call to the client event by event, as
it arrives, through the ``Translator`` of the call's dialects (proxy.dialects), which also rebuilds
the answer that will be stored. It sends the response start (with the node headers) first, then
pumps events; a task watching ``receive()`` notices a client disconnect and stops the pump (an
answer already whole is stored as a success at once, else the node fails as client_disconnected).
A client that takes nothing of its answer for ``send_timeout`` seconds is one that went away
(``[server] client_send_timeout``, proxy/sending.py).
Whatever happens -- the end event, an error event, a cut stream, a disconnect -- exactly one
``StreamEnd`` reaches the ``on_end`` callback, shielded from cancellation, so the node is always
finalized.

A pass-through answer is relayed byte for byte by ``BytesRelay`` (proxy/bytes_relay.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from storage import Outcome

from .background import Background
from .errors import UpstreamBadResponse, UpstreamFailure, UpstreamTimeout, UpstreamTooLarge
from .failures import Failure, cancellation_handled, interrupted
from .sending import ClientStalled, close_timed, timed_send
from .sse import SSEParser

__all__ = ["StreamEnd", "StreamRelay", "Translator", "client_disconnected", "relay_error", "wait_for_disconnect"]

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
            close_timed(send)
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

    async def _relay_events(self, events: list[bytes], send: Any) -> bool:
        """Translate and send some of the stream's events; True once the stream has ended (its end
        event, or an error)."""
        translator = self.translator
        out = []
        for event in events:
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
        return translator.error is not None or translator.finished

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
                if await self._relay_events(parser.feed(raw), send):
                    break
            else:  # the body ended: its last events (a line end held back), then ended() if no end event came
                if not await self._relay_events(parser.close(), send):
                    rest = translator.ended()
                    if rest:
                        await send({"type": "http.response.body", "body": rest, "more_body": True})
        except UpstreamFailure as exc:
            code = exc.code if isinstance(exc, (UpstreamTooLarge, UpstreamBadResponse, UpstreamTimeout)) else "stream_interrupted"
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


def client_disconnected(message: str = "the client disconnected before the answer arrived") -> Failure:
    """The client went away before its answer was complete: transient (HTTP 499 in the logs)."""
    return Failure.of(Outcome.TRANSIENT, "client_disconnected", "client_disconnected", message, 499)


