"""``[upstream_defaults] transport = "aiohttp"``: httpx-aiohttp's transport, with its errors told
apart the way the failure table needs them.

httpx-aiohttp maps every ``aiohttp.ClientConnectionError`` -- a server that closed or reset the
connection included -- to ``httpx.ConnectTimeout``, which would report a dead upstream as a
timeout (504). Here the aiohttp error it keeps as ``__cause__`` decides: a refused connection or
certificate is a connect error, a disconnect or a malformed answer a protocol error, a reset a
read error; a real timeout stays a timeout.
Its session's parser limits are ours (``[server] max_response_header_bytes`` per line,
``max_response_headers``), so it stops reading a head past them; what it refuses so, and a head
within them whose lines add up to more than the byte cap, is ``ResponseHeadTooLarge`` (checked
by ``UpstreamClient.send``).
Measured against the built-in transport by bench/transport.py (results in bench/README.md).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import httpx
from aiohttp import http_exceptions
from httpx_aiohttp import AiohttpTransport as _Base

from .transport import ResponseHeadTooLarge

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


def _head_too_large(exc: BaseException) -> bool:
    """aiohttp's parser refused a head for one of our limits (a line too long, too many headers)."""
    seen = 0
    cause: BaseException | None = exc
    while cause is not None and seen < 8:
        if isinstance(cause, http_exceptions.LineTooLong) or (
                isinstance(cause, http_exceptions.BadHttpMessage) and "Too many headers" in str(cause)):
            return True
        cause, seen = cause.__cause__ or cause.__context__, seen + 1
    return False


class AiohttpTransport(_Base):
    def __init__(self, *, max_head_bytes: int = 65536, max_headers: int = 100, **kw: Any) -> None:
        super().__init__(**kw)
        self.max_head_bytes = max_head_bytes
        self.max_headers = max_headers

    def get_client(self) -> aiohttp.ClientSession:
        """httpx-aiohttp's session, with our limits on a response head."""
        if self.client is not None:
            return super().get_client()
        connector = aiohttp.TCPConnector(keepalive_timeout=self.limits.keepalive_expiry, ssl=self.ssl_context,
                                         limit=self.limits.max_connections or 0)
        # No cookie jar: the session is shared by every tenant, and aiohttp's default jar would send
        # one tenant's Set-Cookie back with the next one's request (docs/architecture.md).
        return aiohttp.ClientSession(connector=connector, max_line_size=self.max_head_bytes,
                                     max_field_size=self.max_head_bytes, max_headers=self.max_headers,
                                     cookie_jar=aiohttp.DummyCookieJar())

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            response = await super().handle_async_request(request)
        except httpx.TransportError as exc:
            raise _remap(exc) from exc.__cause__
        except aiohttp.ClientError as exc:  # not mapped by httpx-aiohttp (e.g. a malformed status line)
            if _head_too_large(exc):
                raise ResponseHeadTooLarge("the upstream's response head is beyond server.max_response_header_bytes "
                                           "or server.max_response_headers") from exc
            raise httpx.RemoteProtocolError(str(exc) or type(exc).__name__) from exc
        response.stream = _Body(response.stream)  # type: ignore[arg-type]
        return response
