"""The database: one connection pool per app (its lifespan opens and closes it; ``pool.py``), JSON
codecs set up on every connection, and every query run through ``map_db_errors`` so callers only
see storage errors.

``Database()`` is made unopened, so everything that uses it can be built before the event loop
runs; ``open()`` connects it (starting the embedded PostgreSQL when no URL is configured).
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import msgspec

from .embedded import EmbeddedServer
from .errors import StorageError, map_db_errors
from .pool import ConnectionPool

__all__ = ["Database", "open_database"]

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode


# PostgreSQL's jsonb cannot hold the character U+0000, which an upstream (or a client) may well
# send. Such values are kept losslessly: a string holding it -- or an object with such a key --
# is stored as {MARK: base64 of its JSON}, and turned back on the way out. Everything else is
# stored as it is, so SQL still sees roles, arrays and the rest of the structure.
_MARK = "$branchpoint:json"
_NUL = b"\\u0000"


def _shield(value: Any) -> Any:
    if isinstance(value, str):
        return {_MARK: base64.b64encode(_encode(value)).decode()} if "\x00" in value else value
    if isinstance(value, list):
        return [_shield(v) for v in value]
    if isinstance(value, dict):
        if any("\x00" in k for k in value):
            return {_MARK: base64.b64encode(_encode(value)).decode()}
        return {k: _shield(v) for k, v in value.items()}
    return value


def _unshield(value: Any) -> Any:
    if isinstance(value, list):
        return [_unshield(v) for v in value]
    if isinstance(value, dict):
        if len(value) == 1 and _MARK in value:
            return _decode(base64.b64decode(value[_MARK]))
        return {k: _unshield(v) for k, v in value.items()}
    return value


def _jsonb_encode(value: Any) -> bytes:
    data = _encode(value)
    if _NUL in data:
        data = _encode(_shield(value))
    return b"\x01" + data  # jsonb binary format: version byte 1, then JSON text


def _jsonb_decode(data: bytes) -> Any:
    value = _decode(memoryview(data)[1:])
    return _unshield(value) if b"$branchpoint:json" in data else value


async def _init_connection(conn: asyncpg.Connection) -> None:
    await conn.set_type_codec("jsonb", schema="pg_catalog", encoder=_jsonb_encode, decoder=_jsonb_decode, format="binary")
    await conn.set_type_codec("json", schema="pg_catalog", encoder=lambda v: _encode(v).decode(), decoder=_decode, format="text")


class Database:
    """A pool of connections; each method borrows one connection for one statement."""

    def __init__(self) -> None:
        self._pool: ConnectionPool | None = None
        self.embedded: EmbeddedServer | None = None  # started by open() when no URL was given
        self.dsn = ""  # what open() connected to (the embedded server's URI when no URL was given)
        self.statements = 0  # round trips made through this pool (exported as a metric)
        self.batches = 0  # round trips that carried several statements (``fetchmany``; batching.py)
        self.batched = 0  # the statements they carried
        self.acquire_timeout = 10.0

    @property
    def pool(self) -> ConnectionPool:
        if self._pool is None:
            raise StorageError("the database is not open")
        return self._pool

    def pool_state(self) -> tuple[int, int, int] | None:
        """(idle, lent, waiting): the pool's connections and the callers waiting for one; None
        while the database is not open."""
        pool = self._pool
        return None if pool is None else (pool.idle, pool.lent, pool.waiting)

    async def open(self, url: str, data_dir: str | None = None, *, migrate_first: bool = False,
                   min_size: int = 2, max_size: int = 20, command_timeout: float = 10.0,
                   connect_timeout: float = 3.0, batch_scheduling: bool = True) -> Database:
        """Connect to ``url`` -- or, when it is empty, to the embedded PostgreSQL of ``data_dir``
        (started, or attached to when already running; ``batch_scheduling``: see
        ``start_embedded``) -- migrating first if asked."""
        from .embedded import start_embedded
        from .migrate import migrate

        if not url:
            self.embedded = await asyncio.to_thread(start_embedded, data_dir or None, batch_scheduling=batch_scheduling)
            url = self.embedded.uri
        self.dsn = url
        try:
            if migrate_first:
                await migrate(url)
            async def connect() -> asyncpg.Connection:
                conn = await asyncpg.connect(url, command_timeout=command_timeout, timeout=connect_timeout)
                try:
                    await _init_connection(conn)
                except BaseException:
                    conn.terminate()
                    raise
                return conn

            with map_db_errors():
                self._pool = await ConnectionPool(connect, min_size=min_size, max_size=max_size, max_idle=300.0).open()
        except BaseException:
            await self._stop_embedded()
            raise
        # waiting for a free connection is load, not an outage: allow as long as a statement may take
        self.acquire_timeout = command_timeout
        return self

    async def close(self) -> None:
        if self._pool is not None:
            pool, self._pool = self._pool, None
            try:
                await asyncio.wait_for(pool.close(), timeout=10)
            except (TimeoutError, OSError):
                pool.terminate()
        await self._stop_embedded()

    async def _stop_embedded(self) -> None:
        if self.embedded is not None:
            embedded, self.embedded = self.embedded, None
            await asyncio.to_thread(embedded.stop)

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[asyncpg.Connection]:
        """One pooled connection for several statements (a transaction, a cursor)."""
        self.statements += 1
        with map_db_errors():
            async with self._borrow() as conn:
                yield conn

    @asynccontextmanager
    async def _borrow(self) -> AsyncIterator[asyncpg.Connection]:
        """A pooled connection, waited for at most ``acquire_timeout``, given back afterwards --
        closed instead when its use was interrupted (cancelled, timed out) or broke it."""
        pool = self.pool
        conn = await pool.acquire(self.acquire_timeout)
        try:
            yield conn
        except (asyncpg.PostgresError, StorageError):
            pool.release(conn)  # the server refused a statement: the connection is fine
            raise
        except BaseException:
            pool.discard(conn)
            raise
        pool.release(conn)

    async def _run(self, method: str, query: str, args: tuple[Any, ...]) -> Any:
        """One statement on a pooled connection. A failure after it was sent (even one that
        surfaces while the connection goes back to the pool) is ``StorageUnavailable(sent=True)``:
        the database may have carried it out."""
        sent = False
        try:
            async with self._borrow() as conn:
                sent = True
                return await getattr(conn, method)(query, *args)
        except BaseException:
            with map_db_errors(sent=sent):
                raise

    async def fetch(self, query: str, *args: Any) -> list[asyncpg.Record]:
        self.statements += 1
        return await self._run("fetch", query, args)

    async def fetchrow(self, query: str, *args: Any) -> asyncpg.Record | None:
        self.statements += 1
        return await self._run("fetchrow", query, args)

    async def fetchval(self, query: str, *args: Any) -> Any:
        self.statements += 1
        return await self._run("fetchval", query, args)

    async def fetchmany(self, query: str, args: list[tuple[Any, ...]]) -> list[asyncpg.Record]:
        """``query`` once per argument tuple in one round trip and one transaction (all or
        nothing); the rows of all of them, in order."""
        self.statements += 1
        self.batches += 1
        self.batched += len(args)
        return await self._run("fetchmany", query, (args,))

    async def execute(self, query: str, *args: Any) -> str:
        self.statements += 1
        return await self._run("execute", query, args)


async def open_database(url: str, data_dir: str | None = None, **options: Any) -> Database:
    """A new, open ``Database`` (see ``Database.open``); ``close()`` it (it stops an embedded
    server it started)."""
    return await Database().open(url, data_dir, **options)
