"""Limits against slow or hostile clients (docs/behaviour.md#limits-and-hostile-peers).

- ``BodyTimeout`` (ASGI middleware): a request body that has not fully arrived
  ``client_body_timeout`` seconds after the request started is answered 408 ``request_timeout``.
- ``BytesInFlight`` (ASGI middleware): the request bytes all of a process's requests hold at once
  are bounded by ``max_bytes_in_flight``. A request whose body would pass the bound waits up to
  ``BUSY_WAIT`` seconds for others to end, then is answered 503 ``server_busy`` with
  ``Retry-After``. A body is held -- bytes, decoded, re-encoded for the upstream and the
  database -- until its request ends, so this bounds what large requests cost together.
  What a stored call assembles from its conversation's stored nodes counts too: the call takes
  its path's size from the same budget before building the upstream request (``hold``), on top
  of its body, until its request ends; a background compaction holds its path's size while it
  summarises (``holding``). A call whose assembled request could never fit under the bound is
  refused (``ContextTooLarge``, 413).
- ``HeaderTimeoutHttpTools`` / ``HeaderTimeoutH11`` (uvicorn protocols): a connection on which a
  request's headers have not arrived ``client_header_timeout`` seconds after it opened -- or after
  the previous response -- is closed. uvicorn itself only times out idle keep-alive connections
  after a response (``timeout_keep_alive``); a fresh connection that sends nothing, or sends its
  headers a byte at a time, would be held forever.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from contextvars import ContextVar
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from .dialects.messages.errors import from_openai_body as anthropic_error
from .dialects.messages.errors import is_messages_path
from .errors import BranchpointError, InvalidRequest, RequestTimeout, error_body

__all__ = ["BUSY_WAIT", "SMALL_BODY", "BodyTimeout", "BytesBudget", "BytesInFlight", "ContextTooLarge", "HeaderTimeoutH11",
           "HeaderTimeoutHttpTools", "ServerBusy", "bytes_bound", "hold", "holding"]

BUSY_WAIT = 5.0  # seconds a request waits for room under max_bytes_in_flight before it is refused
SMALL_BODY = 65536  # bodies up to this size are counted but never held back (bounded by max_connections)


class BodyTimeout:
    """ASGI middleware: the whole request body must arrive within ``timeout`` seconds."""

    def __init__(self, app: Any, timeout: float) -> None:
        self.app = app
        self.timeout = timeout

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or self.timeout <= 0:
            await self.app(scope, receive, send)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        complete = False

        async def guarded() -> Any:
            nonlocal complete
            if complete:
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):  # (not wait_for: no task per message)
                    message = await receive()
            except TimeoutError:
                raise RequestTimeout(f"the request body did not arrive within {self.timeout:g} s "
                                     "(server.client_body_timeout)") from None
            if message["type"] == "http.disconnect" or not message.get("more_body", False):
                complete = True
            return message

        await self.app(scope, guarded, send)


class ServerBusy(BranchpointError, status=503, type_="server_error", code="server_busy"):
    """The process holds as many request bytes as ``max_bytes_in_flight`` allows."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the proxy is busy with other large requests (server.max_bytes_in_flight = {limit} "
                         "bytes); retry shortly", headers={"retry-after": "1"})


class ContextTooLarge(InvalidRequest, code="payload_too_large"):
    """What a call would assemble (its conversation's path and its own items) is larger than
    ``max_bytes_in_flight``: it could never fit, however long it waited."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"the request this call would assemble -- the conversation's context and this call's "
                         f"messages, about {size} bytes -- is larger than the proxy holds for all requests at once "
                         f"(server.max_bytes_in_flight = {limit} bytes); compact the conversation, or move its head "
                         "past the large messages", status=413)


class BytesBudget:
    """Bytes granted to requests, at most ``limit`` at once -- except that a request alone always
    gets what it asks (``max_body_bytes`` may exceed the bound), and small bodies always get theirs.
    Waiters are served first come, first served: a large request is not starved by smaller ones.
    ``own``: what the asking request holds already (it is alone when nobody else holds anything).
    One per process (``Runtime.bytes_in_flight``), shared by every route's ``BytesInFlight``."""

    def __init__(self, limit: int, on_change: Any = None) -> None:
        self.limit = limit
        self.used = 0
        self._waiters: deque[tuple[int, int, asyncio.Future[None]]] = deque()
        self._on_change = on_change

    def _fits(self, n: int, own: int = 0) -> bool:
        return self.used <= own or self.used + n <= self.limit

    async def take(self, n: int, wait: float, own: int = 0) -> bool:
        """Take ``n`` bytes, waiting up to ``wait`` seconds for them; False: not granted."""
        if n <= SMALL_BODY or (not self._waiters and self._fits(n, own)):
            self._grant(n)
            return True
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (n, own, future)
        self._waiters.append(entry)
        try:
            async with asyncio.timeout(wait):
                await future
        except BaseException as exc:
            granted = future.done() and not future.cancelled()  # (just as the time ran out)
            if isinstance(exc, TimeoutError):
                if granted:
                    return True
                self._leave(entry)
                return False
            if granted:  # cancelled: what it was given goes back
                self.give(n)
            else:
                self._leave(entry)
            raise
        return True

    def _leave(self, entry: tuple[int, int, asyncio.Future[None]]) -> None:
        if entry in self._waiters:
            self._waiters.remove(entry)
        self._wake()  # (a large one leaving may let smaller ones behind it in)

    def give(self, n: int) -> None:
        if n:
            self.used -= n
            self._changed()
            self._wake()

    def _grant(self, n: int) -> None:
        self.used += n
        self._changed()

    def _wake(self) -> None:
        while self._waiters and self._fits(self._waiters[0][0], self._waiters[0][1]):
            n, _, future = self._waiters.popleft()
            if not future.done():
                self._grant(n)
                future.set_result(None)

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change(self.used)


class _Hold:
    """What one request holds under the budget (its body, what its call assembled), given back
    when the request ends."""

    __slots__ = ("budget", "held", "open", "refused", "wait")

    def __init__(self, budget: BytesBudget, wait: float, refused: Any) -> None:
        self.budget, self.wait, self.refused = budget, wait, refused
        self.held = 0
        self.open = True


_hold: ContextVar[_Hold | None] = ContextVar("branchpoint_bytes_in_flight", default=None)


def bytes_bound() -> int:
    """The current request's bound on bytes in flight (0: none, or outside a request)."""
    h = _hold.get()
    return h.budget.limit if h is not None else 0


async def hold(n: int) -> None:
    """Count ``n`` more bytes against ``max_bytes_in_flight`` for the current request, until it
    ends -- waiting up to ``BUSY_WAIT`` seconds for room, else ``ServerBusy``. Nothing outside a
    request, or with no bound."""
    h = _hold.get()
    if h is None or not h.open or h.budget.limit <= 0 or n <= 0:
        return
    if not await h.budget.take(n, h.wait, own=h.held):
        raise h.refused()
    if h.open:
        h.held += n
    else:  # (the request ended meanwhile)
        h.budget.give(n)


@asynccontextmanager
async def holding(n: int) -> AsyncIterator[None]:
    """``n`` bytes held against ``max_bytes_in_flight`` for the block (work that outlives its
    request: a background compaction), waiting up to ``BUSY_WAIT`` for room, else ``ServerBusy``."""
    h = _hold.get()
    if h is None or h.budget.limit <= 0 or n <= 0:
        yield
        return
    if not await h.budget.take(n, h.wait):
        raise ServerBusy(h.budget.limit)  # (no request answered: not counted as a rejection)
    try:
        yield
    finally:
        h.budget.give(n)


class BytesInFlight:
    """ASGI middleware: the request bodies of all requests in flight hold at most ``limit`` bytes
    (0: no bound). A body with a Content-Length takes its bytes before it is read, all at once --
    requests never hold part of what they need while waiting for the rest -- and a chunked one as
    its chunks arrive. They are given back when the request ends (its answer sent: the body, its
    decoded form and its copies live as long as the call). A request refused is answered 503
    ``server_busy`` (``Retry-After: 1``); one with a Content-Length has its body read and dropped
    first, so the client reads the answer instead of a broken pipe.

    Litestar builds an app's middleware once per route: ``budget`` is the process's one, built
    with the runtime -- each instance making its own bounded every route apart."""

    def __init__(self, app: Any, budget: BytesBudget, max_body: int, metrics: Any = None,
                 wait: float = BUSY_WAIT) -> None:
        self.app = app
        self.limit = budget.limit
        self.max_body = max_body
        self.wait = wait
        self.metrics = metrics
        self.budget = budget

    def _refused(self) -> ServerBusy:
        if self.metrics is not None:
            self.metrics.busy_bytes_rejections.inc()
        return ServerBusy(self.limit)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or self.limit <= 0:
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        h = _Hold(self.budget, self.wait, self._refused)
        token = _hold.set(h)
        try:
            if declared is not None:
                n = min(declared, self.max_body + 1)  # (a larger one is refused 413 by the app)
                if n and not await self.budget.take(n, self.wait):
                    await _drain(receive)
                    error = self._refused()
                    await _answer(scope, send, error)
                    return
                h.held = n
                await self.app(scope, receive, send)
                return

            async def counted() -> Any:
                message = await receive()
                n = len(message.get("body", b""))
                if n:
                    if not await self.budget.take(n, self.wait, own=h.held):
                        raise self._refused()
                    h.held += n
                return message

            await self.app(scope, counted, send)
        finally:
            h.open = False
            self.budget.give(h.held)
            _hold.reset(token)


def _content_length(scope: Any) -> int | None:
    for key, value in scope["headers"]:
        if key == b"content-length":
            try:
                return max(0, int(value))
            except ValueError:
                return None
    return None


async def _drain(receive: Any) -> None:
    """Read a request's body to its end, keeping nothing."""
    while True:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body", False):
            return


async def _answer(scope: Any, send: Any, error: BranchpointError) -> None:
    body = error_body(error.message, error.type, error.code)
    if is_messages_path(scope.get("path", "")):  # Anthropic's clients: its shape
        body = anthropic_error(error.status, body)
    await send({"type": "http.response.start", "status": error.status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        *((k.encode(), v.encode()) for k, v in error.headers.items())]})
    await send({"type": "http.response.body", "body": body})


class _HeaderTimeout:
    """Mixin for uvicorn's protocols: close a connection whose next request's headers do not
    arrive in time. A request in progress (headers complete) is never cut by it."""

    _header_timer: asyncio.TimerHandle | None = None

    def _arm(self) -> None:
        self._disarm()
        # set on uvicorn's Config by ``branchpoint serve`` (server.client_header_timeout)
        timeout = getattr(self.config, "client_header_timeout", 10.0)  # type: ignore[attr-defined]
        if timeout > 0:
            self._header_timer = self.loop.call_later(timeout, self._header_timeout_fired)  # type: ignore[attr-defined]

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    # armed while a connection waits for a request's headers: from the start, and after each response
    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._arm()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)  # type: ignore[misc]

    def _header_timeout_fired(self) -> None:
        self._header_timer = None
        cycle = getattr(self, "cycle", None)
        if cycle is None or cycle.response_complete:  # waiting for (the rest of) the next request's headers
            transport = getattr(self, "transport", None)
            if transport is not None and not transport.is_closing():
                transport.close()


class HeaderTimeoutHttpTools(_HeaderTimeout, HttpToolsProtocol):
    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()


class HeaderTimeoutH11(_HeaderTimeout, H11Protocol):
    def handle_events(self) -> None:
        before = self.cycle
        super().handle_events()
        if self.cycle is not before and self.cycle is not None:  # a new request's headers arrived
            self._disarm()
