"""Limits against slow or hostile clients (docs/behaviour.md#limits-and-hostile-peers).

- ``BodyTimeout`` (ASGI middleware): a request body that has not fully arrived
  ``client_body_timeout`` seconds after the request started is answered 408 ``request_timeout``.
- ``HeaderTimeoutHttpTools`` / ``HeaderTimeoutH11`` (uvicorn protocols): a connection on which a
  request's headers have not arrived ``client_header_timeout`` seconds after it opened -- or after
  the previous response -- is closed. uvicorn itself only times out idle keep-alive connections
  after a response (``timeout_keep_alive``); a fresh connection that sends nothing, or sends its
  headers a byte at a time, would be held forever.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from .errors import RequestTimeout

__all__ = ["BodyTimeout", "HeaderTimeoutH11", "HeaderTimeoutHttpTools"]


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
