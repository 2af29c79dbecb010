"""``[upstream_defaults] transport = "aiohttp"``: httpx-aiohttp's transport, with its errors told
apart the way the failure table needs them.

httpx-aiohttp maps every ``aiohttp.ClientConnectionError`` -- a server that closed or reset the
connection included -- to ``httpx.ConnectTimeout``, which would report a dead upstream as a
timeout (504). Here the aiohttp error it keeps as ``__cause__`` decides: a refused connection or
certificate is a connect error, a disconnect or a malformed answer a protocol error, a reset a
read error; a real timeout stays a timeout.
Measured against the built-in transport by bench/transport.py (results in bench/README.md).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import httpx
from httpx_aiohttp import AiohttpTransport as _Base

__all__ = ["AiohttpTransport"]


def _remap(exc: httpx.TransportError) -> httpx.TransportError:
    cause = exc.__cause__
    if isinstance(cause, aiohttp.ServerTimeoutError) or not isinstance(cause, aiohttp.ClientError):
        return exc
    if isinstance(cause, aiohttp.ClientConnectorError):  # refused, unresolvable, TLS refused
        return httpx.ConnectError(str(cause) or type(cause).__name__)
    if isinstance(cause, aiohttp.ServerDisconnectedError | aiohttp.ClientResponseError | aiohttp.ClientPayloadError):
        return httpx.RemoteProtocolError(str(cause) or type(cause).__name__)
    if isinstance(cause, aiohttp.ClientOSError):
        return httpx.ReadError(str(cause) or type(cause).__name__)
    if isinstance(cause, aiohttp.ClientConnectionError):
        return httpx.RemoteProtocolError(str(cause) or type(cause).__name__)
    return exc


class _Body(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream) -> None:
        self.inner = inner

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self.inner:
                yield chunk
        except httpx.TransportError as exc:
            raise _remap(exc) from exc.__cause__
        except aiohttp.ClientError as exc:
            raise httpx.RemoteProtocolError(str(exc) or type(exc).__name__) from exc

    async def aclose(self) -> None:
        await self.inner.aclose()


class AiohttpTransport(_Base):
    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            response = await super().handle_async_request(request)
        except httpx.TransportError as exc:
            raise _remap(exc) from exc.__cause__
        except aiohttp.ClientError as exc:  # not mapped by httpx-aiohttp (e.g. a malformed status line)
            raise httpx.RemoteProtocolError(str(exc) or type(exc).__name__) from exc
        response.stream = _Body(response.stream)  # type: ignore[arg-type]
        return response
