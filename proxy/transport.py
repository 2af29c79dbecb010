"""A lean HTTP/1.1 keep-alive transport for httpx, used for upstream calls.

Why: httpcore's pool checks every pooled connection with a ``select()`` (through anyio's typed
attributes) on each request and again on each response close; with a few dozen keep-alive
connections that was a quarter of the proxy's CPU per call. This transport keeps the httpx API
(``httpx.Request`` in, ``httpx.Response`` with a streaming body out, httpx's exceptions) and does
the protocol work with an ``asyncio.Protocol`` and ``httptools`` (the C parser uvicorn uses):

- data is pushed into the parser as it arrives; a closed idle connection is noticed by the event
  loop (``connection_lost``), and the one connection picked for a request is polled once more
  (one ``select()`` of its socket, ``_has_news``): an upstream's close the loop has not read yet
  would fail the request -- for a POST, never re-sent, a 502;
- idle connections are reused last-in first-out and dropped after ``keepalive_expiry``;
- a POST is never re-sent on a fresh connection (it may have reached the upstream); only
  idempotent requests are retried once when a reused connection turns out dead.

A response head is bounded while it is read: past ``max_head_bytes`` (its header lines, and the
bytes received before it ended) or ``max_headers`` header lines the connection is closed and
``ResponseHeadTooLarge`` raised -- without reading the rest of it (httptools itself keeps no limit,
and buffers a header it has not seen the end of).

Not supported (use ``upstream_defaults.transport = "httpx"`` instead): HTTP proxies, HTTP/2,
streaming request bodies are read fully before sending.
"""

from __future__ import annotations

import asyncio
import select
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator

import httptools
import httpx

__all__ = ["ResponseHeadTooLarge", "UpstreamTransport", "check_head"]

_HIGH_WATER = 1 << 20  # pause reading above 1 MiB of unread body
_LOW_WATER = 1 << 18
_IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})
_DEFAULT_PORTS = {"http": 80, "https": 443}


class ResponseHeadTooLarge(httpx.RemoteProtocolError):
    """An upstream's response head passed ``max_head_bytes`` or ``max_headers``."""


def check_head(raw: list[tuple[bytes, bytes]], max_bytes: int, max_headers: int) -> None:
    """The cap on a head another transport has already read (its own limits bound that read):
    ``ResponseHeadTooLarge`` past ``max_headers`` lines or ``max_bytes`` of header lines."""
    if len(raw) > max_headers:
        raise ResponseHeadTooLarge(f"the upstream sent more than {max_headers} response headers")
    if sum(len(k) + len(v) for k, v in raw) + 4 * len(raw) > max_bytes:
        raise ResponseHeadTooLarge(f"the upstream's response head is larger than {max_bytes} bytes")


class _Expired(Exception):
    """A wait of ``_wait_at_most`` ran out."""


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(_Expired())


async def _wait_at_most(waiter: asyncio.Future[None], timeout: float | None) -> None:
    """Await a future of our own for at most ``timeout`` seconds (``_Expired`` after that). One
    timer that fails the future: a third of what ``asyncio.timeout`` costs, which cancels and
    un-cancels the waiting task -- and this runs at least once per upstream call."""
    if timeout is None:
        await waiter
        return
    timer = asyncio.get_running_loop().call_later(timeout, _expire, waiter)
    try:
        await waiter
    finally:
        timer.cancel()


class _Connection(asyncio.Protocol):
    """One TCP (or TLS) connection, parsing one response at a time."""

    def __init__(self, key: tuple[str, str, int], max_head_bytes: int, max_headers: int) -> None:
        self.key = key
        self.max_head_bytes = max_head_bytes
        self.max_headers = max_headers
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.error: Exception | None = None
        self.idle_since = 0.0
        self._waiter: asyncio.Future[None] | None = None
        self._drain: asyncio.Future[None] | None = None
        self._write_paused = False
        self._reset(head_only=False, active=False)

    # -- per response ------------------------------------------------------------------------

    def _reset(self, *, head_only: bool, active: bool) -> None:
        self.parser = httptools.HttpResponseParser(self) if active else None
        self.head_only = head_only
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.headers_done = False
        self.head_received = 0  # bytes received while the head had not ended (interim heads too)
        self.head_bytes = 0  # its header lines' bytes, counted as httptools hands them over
        self.complete = False
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.read_paused = False
        self.close_delimited = False
        self.keep_alive = False

    def begin(self, *, head_only: bool) -> None:
        self._reset(head_only=head_only, active=True)

    # -- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.parser is None:  # bytes while idle: the connection is out of sync
            self.close()
            return
        if not self.headers_done:
            self.head_received += len(data)
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, ResponseHeadTooLarge) as exc:
            if self.error is None:
                self.error = httpx.RemoteProtocolError(f"malformed response from the upstream: {exc}")
            self.close()
        if not self.headers_done and self.head_received > self.max_head_bytes and self.error is None:
            # (a head still unfinished: a header without its end is not even handed to on_header)
            self.error = ResponseHeadTooLarge(f"the upstream's response head is larger than {self.max_head_bytes} bytes")
            self.close()
        if self.buffered > _HIGH_WATER and not self.read_paused and self.transport is not None:
            self.transport.pause_reading()
            self.read_paused = True
        self._wake()

    def eof_received(self) -> bool:
        self.closed = True
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if exc is not None and self.error is None and not self.complete:
            self.error = httpx.ReadError(f"connection to the upstream lost: {exc!r}")
        self._wake()
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    # -- httptools callbacks -----------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self.head_bytes += len(name) + len(value) + 4
        if self.head_bytes > self.max_head_bytes or len(self.headers) >= self.max_headers:
            self.error = ResponseHeadTooLarge(
                f"the upstream's response head is larger than {self.max_head_bytes} bytes" if self.head_bytes > self.max_head_bytes
                else f"the upstream sent more than {self.max_headers} response headers")
            raise self.error  # (stops the parser; data_received closes the connection)
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        assert self.parser is not None
        self.status = self.parser.get_status_code()
        if 100 <= self.status < 200 and self.status != 101:
            self.headers = []  # an interim response (100 Continue): the real one follows
            return
        self.headers_done = True
        self.keep_alive = self.parser.should_keep_alive()  # only meaningful before the body is parsed
        lower = {k.lower() for k, _ in self.headers}
        self.close_delimited = b"content-length" not in lower and b"transfer-encoding" not in lower
        if self.head_only or self.status in (204, 304):
            self.complete = True

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)

    def on_message_complete(self) -> None:
        if self.headers_done:
            self.complete = True

    # -- helpers -----------------------------------------------------------------------------

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self, timeout: float | None) -> None:
        """Wait until more data, the end of the response, or the end of the connection."""
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await _wait_at_most(self._waiter, timeout)
        except _Expired:
            raise httpx.ReadTimeout("the upstream did not send data in time") from None
        finally:
            self._waiter = None

    async def write(self, data: bytes, timeout: float | None) -> None:
        assert self.transport is not None
        self.transport.write(data)
        if self._write_paused and not self.closed:
            self._drain = asyncio.get_running_loop().create_future()
            try:
                await _wait_at_most(self._drain, timeout)
            except _Expired:
                raise httpx.WriteTimeout("the upstream did not accept the request body in time") from None
            finally:
                self._drain = None
        if self.closed and self.error is not None:
            raise httpx.WriteError(str(self.error))

    def resume_if_drained(self) -> None:
        if self.read_paused and self.buffered < _LOW_WATER and self.transport is not None and not self.closed:
            self.transport.resume_reading()
            self.read_paused = False

    def reusable(self) -> bool:
        return (not self.closed and self.error is None and self.complete and not self.head_only
                and self.keep_alive and not self.chunks)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class _Pool:
    def __init__(self, max_connections: int) -> None:
        self.idle: list[_Connection] = []
        self.slots = asyncio.Semaphore(max_connections)


class _Body(httpx.AsyncByteStream):
    """A response body read from the connection as it arrives; returns the connection to the
    pool when the response was read to its end, closes it otherwise."""

    def __init__(self, owner: UpstreamTransport, pool: _Pool, conn: _Connection, read_timeout: float | None) -> None:
        self.owner = owner
        self.pool = pool
        self.conn = conn
        self.read_timeout = read_timeout
        self.done = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        conn = self.conn
        try:
            while True:
                while conn.chunks:
                    chunk = conn.chunks.popleft()
                    conn.buffered -= len(chunk)
                    conn.resume_if_drained()
                    yield chunk
                if conn.complete:
                    break
                if conn.error is not None:
                    raise conn.error
                if conn.closed:
                    if conn.close_delimited:
                        conn.complete = True
                        break
                    raise httpx.RemoteProtocolError("the upstream closed the connection before the body ended")
                await conn.wait(self.read_timeout)
        except BaseException:
            self._finish()
            raise
        self._finish()

    def _finish(self) -> None:
        if self.done:
            return
        self.done = True
        self.owner._release(self.pool, self.conn)

    async def aclose(self) -> None:
        self._finish()


def _has_news(conn: _Connection) -> bool:
    """Whether an idle connection's socket has something to read -- the upstream closed it (its
    keep-alive over: uvicorn's, vLLM's, after 5 s) and the event loop has not seen it yet. A
    request sent on it then is read by nobody: a ReadError, a 502 for a POST, which is never
    re-sent (above). One poll of the socket, no wait."""
    sock = conn.transport.get_extra_info("socket") if conn.transport is not None else None
    if sock is None:
        return False
    try:
        return bool(select.select([sock], [], [], 0)[0])
    except (OSError, ValueError):  # (closed under us)
        return True


class UpstreamTransport(httpx.AsyncBaseTransport):
    def __init__(self, *, max_connections: int = 512, keepalive_expiry: float = 30.0,
                 ssl_context: ssl.SSLContext | None = None, max_head_bytes: int = 65536,
                 max_headers: int = 100) -> None:
        self.max_connections = max_connections
        self.max_head_bytes = max_head_bytes
        self.max_headers = max_headers
        self.keepalive_expiry = keepalive_expiry
        self._ssl = ssl_context
        self._pools: dict[tuple[str, str, int], _Pool] = {}
        self._closed = False
        self.connects = 0  # connections opened (keep-alive reuse keeps this low)

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = httpx.create_ssl_context()
        return self._ssl

    async def _connect(self, key: tuple[str, str, int], timeout: float | None) -> _Connection:
        scheme, host, port = key
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                _, conn = await loop.create_connection(
                    lambda: _Connection(key, self.max_head_bytes, self.max_headers), host, port,
                    ssl=self._ssl_context() if scheme == "https" else None,
                    server_hostname=host if scheme == "https" else None,
                )
        except TimeoutError:
            raise httpx.ConnectTimeout(f"connecting to {host}:{port} timed out") from None
        except (OSError, ssl.SSLError) as exc:
            raise httpx.ConnectError(f"cannot connect to {host}:{port}: {exc}") from exc
        self.connects += 1
        return conn

    def _checkout(self, pool: _Pool) -> _Connection | None:
        now = time.monotonic()
        while pool.idle:
            conn = pool.idle.pop()
            if not conn.closed and now - conn.idle_since < self.keepalive_expiry and not _has_news(conn):
                return conn
            conn.close()
        return None

    def _release(self, pool: _Pool, conn: _Connection) -> None:
        if conn.reusable() and not self._closed:
            conn._reset(head_only=False, active=False)
            conn.idle_since = time.monotonic()
            pool.idle.append(conn)
        else:
            conn.close()
        pool.slots.release()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self._closed:
            raise httpx.ConnectError("the transport is closed")
        timeouts = request.extensions.get("timeout") or {}
        url = request.url
        scheme = url.scheme
        if scheme not in _DEFAULT_PORTS:
            raise httpx.UnsupportedProtocol(f"unsupported URL scheme {scheme!r}")
        key = (scheme, url.host, url.port or _DEFAULT_PORTS[scheme])
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = _Pool(self.max_connections)

        if pool.slots.locked():  # all connections busy: wait, for at most the pool timeout
            try:
                async with asyncio.timeout(timeouts.get("pool")):
                    await pool.slots.acquire()
            except TimeoutError:
                raise httpx.PoolTimeout("no upstream connection became free in time") from None
        else:
            await pool.slots.acquire()  # a free slot is taken at once

        try:
            body = request.content
        except httpx.RequestNotRead:
            body = await request.aread()
        head = self._head(request, body)
        retry_allowed = request.method in _IDEMPOTENT
        try:
            while True:
                conn = self._checkout(pool)
                reused = conn is not None
                if conn is None:
                    conn = await self._connect(key, timeouts.get("connect"))
                try:
                    conn.begin(head_only=request.method == "HEAD")
                    await conn.write(head + body if len(body) < 65536 else head, timeouts.get("write"))
                    if len(body) >= 65536:
                        await conn.write(body, timeouts.get("write"))
                    while not conn.headers_done:
                        if conn.error is not None:
                            raise conn.error
                        if conn.closed:
                            raise httpx.RemoteProtocolError("the upstream closed the connection without a response")
                        await conn.wait(timeouts.get("read"))
                except ResponseHeadTooLarge:
                    conn.close()  # (never retried: any connection would get the same answer)
                    raise
                except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError):
                    conn.close()
                    if reused and retry_allowed and not conn.headers and not conn.chunks:
                        retry_allowed = False
                        continue
                    raise
                except BaseException:
                    conn.close()
                    raise
                break
        except BaseException:
            pool.slots.release()
            raise

        return httpx.Response(
            status_code=conn.status,
            headers=conn.headers,
            stream=_Body(self, pool, conn, timeouts.get("read")),
            extensions={"http_version": b"HTTP/1.1"},
        )

    @staticmethod
    def _head(request: httpx.Request, body: bytes) -> bytes:
        target = request.url.raw_path
        lines = [request.method.encode("ascii"), b" ", target, b" HTTP/1.1\r\n"]
        has_length = False
        for name, value in request.headers.raw:
            lname = name.lower()
            if lname == b"content-length":
                has_length = True
            elif lname == b"transfer-encoding":
                continue  # the body is sent with a length
            lines += (name, b": ", value, b"\r\n")
        if not has_length and (body or request.method in ("POST", "PUT", "PATCH")):
            lines += (b"content-length: ", str(len(body)).encode(), b"\r\n")
        lines.append(b"\r\n")
        return b"".join(lines)

    async def aclose(self) -> None:
        self._closed = True
        for pool in self._pools.values():
            for conn in pool.idle:
                conn.close()
            pool.idle.clear()

    def idle_connections(self) -> int:
        return sum(len(p.idle) for p in self._pools.values())

    def __repr__(self) -> str:  # pragma: no cover
        return f"<UpstreamTransport pools={len(self._pools)} idle={self.idle_connections()}>"
