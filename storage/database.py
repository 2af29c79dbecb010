"""The asyncpg pool: one per app (its lifespan opens and closes it), JSON codecs set up on every
connection, and every query run through ``map_db_errors`` so callers only see storage errors.

``Database()`` is made unopened, so everything that uses it can be built before the event loop
runs; ``open()`` connects it (starting the embedded PostgreSQL when no URL is configured).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import msgspec

from .embedded import EmbeddedServer
from .errors import StorageError, map_db_errors

__all__ = ["Database", "open_database"]

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode


def _jsonb_encode(value: Any) -> bytes:
    return b"\x01" + _encode(value)  # jsonb binary format: version byte 1, then JSON text


def _jsonb_decode(data: bytes) -> Any:
    return _decode(memoryview(data)[1:])


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Pool reset hook: nothing to undo. Pooled connections never change session state (no SET,
    LISTEN, advisory locks or open cursors outside a transaction -- migrations use a connection of
    their own), so the default reset query would only cost a round trip on every release."""


async def _init_connection(conn: asyncpg.Connection) -> None:
    await conn.set_type_codec("jsonb", schema="pg_catalog", encoder=_jsonb_encode, decoder=_jsonb_decode, format="binary")
    await conn.set_type_codec("json", schema="pg_catalog", encoder=lambda v: _encode(v).decode(), decoder=_decode, format="text")


class Database:
    """A pool of connections; each method borrows one connection for one statement."""

    def __init__(self) -> None:
        self._pool: asyncpg.Pool | None = None
        self.embedded: EmbeddedServer | None = None  # started by open() when no URL was given
        self.statements = 0  # round trips made through this pool (exported as a metric)
        self.acquire_timeout = 10.0

    @property
    def pool(self) -> asyncpg.Pool:
        if self._pool is None:
            raise StorageError("the database is not open")
        return self._pool

    async def open(self, url: str, data_dir: str | None = None, *, migrate_first: bool = False,
                   min_size: int = 2, max_size: int = 20, command_timeout: float = 10.0,
                   connect_timeout: float = 3.0) -> Database:
        """Connect to ``url`` -- or, when it is empty, to the embedded PostgreSQL of ``data_dir``
        (started, or attached to when already running) -- migrating first if asked."""
        from .embedded import start_embedded
        from .migrate import migrate

        if not url:
            self.embedded = await asyncio.to_thread(start_embedded, data_dir or None)
            url = self.embedded.uri
        try:
            if migrate_first:
                await migrate(url)
            with map_db_errors():
                self._pool = await asyncpg.create_pool(
                    url, min_size=min_size, max_size=max_size, command_timeout=command_timeout,
                    timeout=connect_timeout, init=_init_connection, reset=_keep_session,
                    max_inactive_connection_lifetime=300.0,
                )
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
            async with self.pool.acquire(timeout=self.acquire_timeout) as conn:
                yield conn

    async def fetch(self, query: str, *args: Any) -> list[asyncpg.Record]:
        self.statements += 1
        with map_db_errors():
            async with self.pool.acquire(timeout=self.acquire_timeout) as conn:
                return await conn.fetch(query, *args)

    async def fetchrow(self, query: str, *args: Any) -> asyncpg.Record | None:
        self.statements += 1
        with map_db_errors():
            async with self.pool.acquire(timeout=self.acquire_timeout) as conn:
                return await conn.fetchrow(query, *args)

    async def fetchval(self, query: str, *args: Any) -> Any:
        self.statements += 1
        with map_db_errors():
            async with self.pool.acquire(timeout=self.acquire_timeout) as conn:
                return await conn.fetchval(query, *args)

    async def execute(self, query: str, *args: Any) -> str:
        self.statements += 1
        with map_db_errors():
            async with self.pool.acquire(timeout=self.acquire_timeout) as conn:
                return await conn.execute(query, *args)


async def open_database(url: str, data_dir: str | None = None, **options: Any) -> Database:
    """A new, open ``Database`` (see ``Database.open``); ``close()`` it (it stops an embedded
    server it started)."""
    return await Database().open(url, data_dir, **options)
