"""The asyncpg pool: created once per app (the lifespan owns it), JSON codecs set up on every
connection, and every query run through ``map_db_errors`` so callers only see storage errors."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import msgspec

from .errors import map_db_errors

__all__ = ["Database", "open_database"]

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode


def _jsonb_encode(value: Any) -> bytes:
    return b"\x01" + _encode(value)  # jsonb binary format: version byte 1, then JSON text


def _jsonb_decode(data: bytes) -> Any:
    return _decode(memoryview(data)[1:])


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Pool reset hook: nothing to undo. Pooled connections never change session state (no SET,
    LISTEN, advisory locks or open cursors -- migrations use a connection of their own), so the
    default reset query would only cost a round trip on every release."""


async def _init_connection(conn: asyncpg.Connection) -> None:
    await conn.set_type_codec("jsonb", schema="pg_catalog", encoder=_jsonb_encode, decoder=_jsonb_decode, format="binary")
    await conn.set_type_codec("json", schema="pg_catalog", encoder=lambda v: _encode(v).decode(), decoder=_decode, format="text")


class Database:
    """A pool of connections; each method borrows one connection for one statement."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        self.statements = 0  # round trips made through this pool (exported as a metric)

    @classmethod
    async def connect(
        cls,
        dsn: str,
        *,
        min_size: int = 2,
        max_size: int = 20,
        command_timeout: float = 10.0,
        connect_timeout: float = 3.0,
    ) -> Database:
        with map_db_errors():
            pool = await asyncpg.create_pool(
                dsn,
                min_size=min_size,
                max_size=max_size,
                command_timeout=command_timeout,
                timeout=connect_timeout,
                init=_init_connection,
                reset=_keep_session,
                max_inactive_connection_lifetime=300.0,
            )
        db = cls(pool)
        # waiting for a free connection is load, not an outage: allow as long as a statement may take
        db.acquire_timeout = command_timeout
        return db

    acquire_timeout: float = 10.0

    async def close(self) -> None:
        try:
            await asyncio.wait_for(self.pool.close(), timeout=10)
        except (TimeoutError, OSError):
            self.pool.terminate()

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


async def open_database(url: str, data_dir: str | None = None, *, migrate_first: bool = False,
                        **pool: Any) -> tuple[Database, Any]:
    """The pool on ``url`` -- or, when ``url`` is empty, on the embedded PostgreSQL of
    ``data_dir`` (started, or attached to when already running). Returns (database, embedded
    server or None); stop the server after closing the pool."""
    from .embedded import start_embedded
    from .migrate import migrate

    embedded = None
    if not url:
        embedded = await asyncio.to_thread(start_embedded, data_dir or None)
        url = embedded.uri
    try:
        if migrate_first:
            await migrate(url)
        return await Database.connect(url, **pool), embedded
    except BaseException:
        if embedded:
            embedded.stop()
        raise
