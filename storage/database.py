"""The database: one connection pool per app (its lifespan opens and closes it; ``pool.py``), JSON
codecs set up on every connection, and every query run through ``map_db_errors`` so callers only
see storage errors.

``Database()`` is made unopened, so everything that uses it can be built before the event loop
runs; ``open()`` connects it (starting the embedded PostgreSQL when no URL is configured).
"""

from __future__ import annotations

import asyncio
import base64
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import msgspec

from .embedded import EmbeddedServer
from .errors import StorageError, map_db_errors
from .pool import ConnectionPool
from .walk import rebuilt

__all__ = ["Database", "Unstorable", "open_database"]

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode


# PostgreSQL's jsonb cannot hold the character U+0000, which an upstream (or a client) may well
# send. Such values are kept losslessly: a string holding it -- or an object with such a key --
# is stored as {MARK: base64 of its JSON}, and turned back on the way out. An object of that very
# shape sent by a client or an upstream is marked the same way, so it comes back as it was sent
# (never read as a mark); and a mark that does not decode is read as the object it is.
# Everything else is stored as it is, so SQL still sees roles, arrays and the rest of the structure.
_MARK = "$branchpoint:json"
_NUL = b"\\u0000"
_MARK_BYTES = b'"$branchpoint:json"'


def _needs_shield(data: bytes | bytearray) -> bool:
    """Does this JSON text hold what jsonb cannot (NUL), or an object that would read as a mark?"""
    return _NUL in data or _MARK_BYTES in data


def _kept_marked(value: dict[str, Any]) -> bool:
    """An object stored marked: one with a NUL in a key, or one that looks like a mark itself."""
    return (len(value) == 1 and _MARK in value) or any("\x00" in k for k in value)


def _marked(value: Any) -> dict[str, str]:
    return {_MARK: base64.b64encode(_encode(value)).decode()}


def _shield(value: Any) -> Any:
    """``value`` with every string holding NUL -- and every object with such a key -- replaced by
    its marked form."""
    return rebuilt(value, lambda text: _marked(text) if "\x00" in text else text,
                   whole=lambda obj: _marked(obj) if _kept_marked(obj) else None)


def _unmark(value: Any) -> Any | None:
    """The value a marked object stands for; None when ``value`` is not one (a marked value is
    never None: it is a string or an object). One that does not decode was never ours: a
    client's object stored before such objects were marked -- it is what it is."""
    if isinstance(value, dict) and len(value) == 1 and isinstance(mark := value.get(_MARK), str):
        try:
            return _decode(base64.b64decode(mark, validate=True))
        except (ValueError, msgspec.DecodeError):
            return None
    return None


def _unshield(value: Any) -> Any:
    """``value`` with every marked object turned back, in place (the value is freshly decoded and
    nobody else's), without recursion -- see ``_shield``."""
    if not isinstance(value, (list, dict)):
        return value
    original = _unmark(value)
    if original is not None:
        return original
    stack: list[Any] = [value]
    while stack:
        container = stack.pop()
        items = enumerate(container) if isinstance(container, list) else container.items()
        for k, v in items:
            if isinstance(v, (list, dict)):
                original = _unmark(v)
                if original is not None:
                    container[k] = original  # (replacing a value while iterating: the keys stay)
                else:
                    stack.append(v)
    return value


def _on_a_fresh_stack(fn: Callable[[Any], Any], arg: Any) -> Any:
    """``fn(arg)`` in a thread of its own: msgspec's encoder and decoder count nesting against
    Python's recursion limit, so a value that was read at the top of a stack may be too deep
    to write (or read back) further down one. A new thread starts at the top again."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append((True, fn(arg)))
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
            out.append((False, exc))

    thread = threading.Thread(target=run, name="branchpoint-deep-json")
    thread.start()
    thread.join()
    ok, result = out[0]
    if not ok:
        raise result
    return result


_encode_into = msgspec.json.Encoder().encode_into


def _encode_shielded(value: Any) -> bytearray:
    """jsonb's binary format: version byte 1, then the JSON text -- written after the byte in one
    buffer (asyncpg takes any buffer), so a large value is not copied once more to prefix it. An
    argument already encoded (``msgspec.Raw``: the call contracts, storage/tree.py) is copied once."""
    data = bytearray(b"\x01")
    if isinstance(value, msgspec.Raw):
        data += memoryview(value)
        return data
    _encode_into(value, data, 1)
    if _needs_shield(data):
        del data[1:]
        _encode_into(_shield(value), data, 1)
    return data


def _jsonb_encode(value: Any) -> bytearray:
    try:
        return _encode_shielded(value)
    except RecursionError:
        return _on_a_fresh_stack(_encode_shielded, value)


def _decode_unshielded(data: bytes) -> Any:
    value = _decode(memoryview(data)[1:])
    return _unshield(value) if _MARK_BYTES in data else value


def _jsonb_decode(data: bytes) -> Any:
    try:
        return _decode_unshielded(data)
    except RecursionError:
        return _on_a_fresh_stack(_decode_unshielded, data)


async def _init_connection(conn: asyncpg.Connection) -> None:
    await conn.set_type_codec("jsonb", schema="pg_catalog", encoder=_jsonb_encode, decoder=_jsonb_decode, format="binary")
    await conn.set_type_codec("json", schema="pg_catalog", encoder=lambda v: _encode(v).decode(), decoder=_decode, format="text")


# asyncpg's own "invalid input for query argument": an argument its codecs could not encode (the
# statement was never sent). An InterfaceError -- which ``map_db_errors`` reads as the database
# being away -- though nothing is wrong with the database: the value is.
_ArgumentError = asyncpg.exceptions._base.DataError


class Unstorable(StorageError):
    """A value the database cannot take, whatever the moment: a permanent refusal, not an outage.
    Its message names only the cause's type -- asyncpg's own quotes the value, which may be a
    client's message."""

    def __init__(self, exc: BaseException) -> None:
        cause = exc.__cause__ or exc
        super().__init__(f"a value the database cannot take: {type(cause).__name__}")


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
        self.distributed = False  # the schema is distributed by tree (Citus): asked by open() (storage.distribute)

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
        from .distribute import is_distributed
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
                async with self._borrow() as conn:
                    self.distributed = await is_distributed(conn, timeout=connect_timeout)  # (part of connecting)
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
            try:
                async with self._borrow() as conn:
                    yield conn
            except _ArgumentError as exc:
                raise Unstorable(exc) from None

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
        except _ArgumentError as exc:
            raise Unstorable(exc) from None
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
