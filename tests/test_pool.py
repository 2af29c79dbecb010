"""The connection pool (storage/pool.py) against a real PostgreSQL: lending, waiting, giving up,
and what happens to connections whose use was interrupted or that the server dropped."""

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
import pytest

from storage import StorageError, StorageUnavailable
from storage.database import Database
from storage.pool import ConnectionPool, PoolClosed

from .conftest import run


def pool_for(url: str, *, min_size: int = 1, max_size: int = 2, max_idle: float = 300.0) -> ConnectionPool:
    opened: list[asyncpg.Connection] = []

    async def connect() -> asyncpg.Connection:
        conn = await asyncpg.connect(url)
        opened.append(conn)
        return conn

    pool = ConnectionPool(connect, min_size=min_size, max_size=max_size, max_idle=max_idle)
    pool.opened = opened  # type: ignore[attr-defined]  (what the test may look at)
    return pool


@asynccontextmanager
async def opened(url: str, **sizes: float) -> AsyncIterator[ConnectionPool]:
    """A pool, open for the block, closed after it."""
    pool = await pool_for(url, **sizes).open()  # type: ignore[arg-type]
    try:
        yield pool
    finally:
        await pool.close()


async def pid(conn: asyncpg.Connection) -> int:
    return await conn.fetchval("SELECT pg_backend_pid()")


def test_lends_the_warmest_connection_and_opens_no_more_than_needed(database_url):
    async def scenario():
        async with opened(database_url, min_size=1, max_size=3) as pool:
            assert (pool.size, pool.idle) == (1, 1)
            a = await pool.acquire(1)
            b = await pool.acquire(1)  # none idle: a second one is opened
            assert pool.size == 2 and a is not b
            pool.release(a)
            pool.release(b)
            for _ in range(5):  # one at a time: always the one given back last, nothing new opened
                conn = await pool.acquire(1)
                assert conn is b
                pool.release(conn)
            assert len(pool.opened) == 2 and pool.size == 2
        assert all(conn.is_closed() for conn in pool.opened)

    run(scenario())


def test_waiters_are_served_in_order_and_give_up_after_their_timeout(database_url):
    async def scenario():
        async with opened(database_url, min_size=1, max_size=1) as pool:
            held = await pool.acquire(1)
            order: list[int] = []

            async def borrow(i: int) -> None:
                conn = await pool.acquire(5)
                order.append(i)
                await asyncio.sleep(0.01)
                pool.release(conn)

            waiting = [asyncio.ensure_future(borrow(i)) for i in range(3)]
            await asyncio.sleep(0.05)
            with pytest.raises(TimeoutError):  # a fourth gives up after its own timeout
                await pool.acquire(0.1)
            assert order == [] and pool.waiting == 3
            pool.release(held)
            await asyncio.gather(*waiting)
            assert order == [0, 1, 2]
            assert (pool.size, pool.idle) == (1, 1) and len(pool.opened) == 1

    run(scenario())


def test_a_waiter_cancelled_as_it_is_served_passes_the_connection_on(database_url):
    async def scenario():
        async with opened(database_url, min_size=1, max_size=1) as pool:
            held = await pool.acquire(1)
            first = asyncio.ensure_future(pool.acquire(5))
            second = asyncio.ensure_future(pool.acquire(5))
            await asyncio.sleep(0.05)
            pool.release(held)  # handed to the first waiter ...
            first.cancel()  # ... which is cancelled before it runs again
            with pytest.raises(asyncio.CancelledError):
                await first
            conn = await asyncio.wait_for(second, 2)  # the second gets it instead
            assert conn is held
            pool.release(conn)
            assert (pool.size, pool.idle) == (1, 1)

    run(scenario())


def test_an_interrupted_statement_closes_its_connection_and_a_waiter_opens_a_new_one(database_url):
    async def scenario():
        db = await Database().open(database_url, min_size=1, max_size=1)
        try:
            before = await db.fetchval("SELECT pg_backend_pid()")
            # an error the server reports leaves the connection as it was
            with pytest.raises(StorageError):
                await db.fetchval("SELECT 1 / 0")
            assert await db.fetchval("SELECT pg_backend_pid()") == before
            # a statement cancelled in flight: its connection is closed, not lent again
            sleeping = asyncio.ensure_future(db.fetchval("SELECT pg_sleep(5)"))
            waiter = asyncio.ensure_future(db.fetchval("SELECT pg_backend_pid()"))
            await asyncio.sleep(0.3)
            sleeping.cancel()
            with pytest.raises(asyncio.CancelledError):
                await sleeping
            after = await asyncio.wait_for(waiter, 5)  # woken to open a connection of its own
            assert after != before
            assert (db.pool.size, db.pool.idle) == (1, 1)
        finally:
            await db.close()

    run(scenario())


def test_connections_dropped_by_the_server_or_left_in_a_transaction_are_never_lent(database_url):
    async def scenario():
        async with opened(database_url, min_size=2, max_size=2) as pool:
            admin = await asyncpg.connect(database_url)
            try:
                a, b = await pool.acquire(1), await pool.acquire(1)
                pids = {await pid(a), await pid(b)}
                await a.execute("BEGIN")  # given back inside a transaction
                pool.release(a)
                pool.release(b)
                assert a.is_closed() and pool.size == 1
                await admin.fetchval("SELECT pg_terminate_backend($1)", await pid(b))  # the server drops it
                for _ in range(50):
                    if b.is_closed():
                        break
                    await asyncio.sleep(0.05)
                conn = await pool.acquire(1)
                assert await pid(conn) not in pids  # neither: a new connection
                pool.release(conn)
                assert (pool.size, pool.idle) == (1, 1)
            finally:
                await admin.close()

    run(scenario())


def test_idle_connections_age_out_down_to_the_minimum(database_url):
    async def scenario():
        async with opened(database_url, min_size=1, max_size=3, max_idle=0.2) as pool:
            conns = [await pool.acquire(1) for _ in range(3)]
            for conn in conns:
                pool.release(conn)
            assert pool.idle == 3
            await asyncio.sleep(0.3)
            conn = await pool.acquire(1)
            pool.release(conn)  # giving one back closes those idle for too long
            assert pool.size == 1 and pool.idle == 1
            for _ in range(100):  # the two retired ones are closed in the background
                if sum(c.is_closed() for c in conns) == 2:
                    break
                await asyncio.sleep(0.02)
            assert sum(c.is_closed() for c in conns) == 2

    run(scenario())


def test_a_closed_pool_refuses_and_closes_what_comes_back(database_url):
    async def scenario():
        db = await Database().open(database_url, min_size=1, max_size=1)
        pool = db.pool
        lent = await pool.acquire(1)
        waiting = asyncio.ensure_future(db.fetchval("SELECT 1"))  # waits for the only connection
        await asyncio.sleep(0.05)
        await db.close()
        with pytest.raises(StorageUnavailable) as refused:  # like an outage, and never sent
            await waiting
        assert refused.value.sent is False
        with pytest.raises(PoolClosed):
            await pool.acquire(1)
        pool.release(lent)
        assert lent.is_closed() and pool.size == 0

    run(scenario())


def test_terminate_closes_lent_connections_too(database_url):
    async def scenario():
        pool = await pool_for(database_url, min_size=1, max_size=3).open()
        lent = [await pool.acquire(1), await pool.acquire(1)]
        pool.release(lent.pop())
        pool.terminate()
        assert all(conn.is_closed() for conn in pool.opened) and pool.size == 0
        pool.release(lent[0])  # coming back afterwards changes nothing
        assert pool.size == 0 and pool.idle == 0
        with pytest.raises(PoolClosed):
            await pool.acquire(1)

    run(scenario())
