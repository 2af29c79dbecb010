"""The connection pool: asyncpg connections lent out one at a time (docs/architecture.md#the-connection-pool).

Why not asyncpg's own ``Pool``: a stored call borrows a connection twice (its start and its
finish), and each borrow through asyncpg's pool ran a task (the ``asyncio.shield`` around every
release), a timer (the idle-connection callback), a proxy object, a queue and two futures -- a
fifth of the proxy's CPU per stored call (bench/README.md). Lending a connection here is popping it
from a list; giving it back is appending it, or handing it straight to the longest waiter.

Rules:
- idle connections are lent last-in first-out (the warmest one; the rest can age out), each
  checked for being open first -- a connection the server dropped is forgotten, not lent;
- when all ``max_size`` connections are lent, ``acquire`` waits, first come first served, at most
  ``timeout`` seconds (``TimeoutError``); a connection given back goes to the first waiter;
- a borrow that did not end cleanly -- cancelled or timed out mid-statement, a broken connection,
  a transaction left open -- ``discard``\\ s its connection: it is closed, never lent again, and
  a waiter is woken to open a new one. An error the server reported (``PostgresError``) is
  clean: the statement failed, the connection is fine;
- connections idle for longer than ``max_idle`` seconds are closed, down to ``min_size``;
- nothing is reset on the way back: lent connections never change session state (no SET,
  LISTEN, advisory locks or cursors outside a transaction -- migrations use a connection of
  their own).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Awaitable, Callable

import asyncpg

__all__ = ["ConnectionPool", "PoolClosed"]


class PoolClosed(Exception):
    """The pool was closed."""


def _expire(waiter: asyncio.Future[asyncpg.Connection | None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError("no database connection became free in time"))


class ConnectionPool:
    def __init__(self, connect: Callable[[], Awaitable[asyncpg.Connection]], *, min_size: int, max_size: int,
                 max_idle: float = 300.0) -> None:
        if max_size < 1 or not 0 <= min_size <= max_size:
            raise ValueError("need 0 <= min_size <= max_size and max_size >= 1")
        self._connect = connect
        self.min_size = min_size
        self.max_size = max_size
        self.max_idle = max_idle
        self._idle: list[tuple[asyncpg.Connection, float]] = []  # (connection, idle since), newest last
        self._open: set[asyncpg.Connection] = set()  # every connection made and not yet closed: lent or idle
        self._opening = 0  # connections being made
        self._waiters: deque[asyncio.Future[asyncpg.Connection | None]] = deque()
        self._closing: set[asyncio.Task[None]] = set()
        self._closed = False

    async def open(self) -> ConnectionPool:
        """Open ``min_size`` connections (at least one: a pool that cannot connect fails here)."""
        for _ in range(max(1, self.min_size)):
            try:
                conn = await self._new()
            except BaseException:
                await self.close()
                raise
            self._idle.append((conn, time.monotonic()))
        return self

    async def _new(self) -> asyncpg.Connection:
        self._opening += 1  # (before the first await: it counts against max_size at once)
        try:
            conn = await self._connect()
        finally:
            self._opening -= 1
        self._open.add(conn)
        return conn

    @property
    def size(self) -> int:
        """Connections open or being opened, lent or idle."""
        return len(self._open) + self._opening

    @property
    def idle(self) -> int:
        return len(self._idle)

    @property
    def lent(self) -> int:
        return len(self._open) - len(self._idle)

    @property
    def waiting(self) -> int:
        """Callers waiting for a connection."""
        return sum(1 for waiter in self._waiters if not waiter.done())

    async def acquire(self, timeout: float) -> asyncpg.Connection:
        """A connection for the caller alone, until it is given back (``release`` or ``discard``)."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            if self._closed:
                raise PoolClosed("the database pool is closed")
            while self._idle:
                conn, _ = self._idle.pop()
                if not conn.is_closed():
                    return conn
                self._open.discard(conn)  # dropped by the server while idle
            if self.size < self.max_size:
                try:
                    return await self._new()
                except BaseException:
                    self._wake_one()  # the room is free again: someone else may try
                    raise
            conn = await self._wait(deadline)
            if conn is not None:
                return conn
            # None: a connection was discarded -- there is room to open one; go round again

    async def _wait(self, deadline: float) -> asyncpg.Connection | None:
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[asyncpg.Connection | None] = loop.create_future()
        self._waiters.append(waiter)
        timer = loop.call_at(deadline, _expire, waiter)
        try:
            return await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                # served, then cancelled before it ran: pass the connection (or the room) on
                conn = waiter.result()
                if conn is not None:
                    self.release(conn)
                else:
                    self._wake_one()
            else:  # gave up (timed out, cancelled) or the pool closed: out of the line now
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
            raise
        finally:
            timer.cancel()

    def release(self, conn: asyncpg.Connection) -> None:
        """Give back a connection whose borrow ended cleanly."""
        if self._closed or conn.is_closed() or conn.is_in_transaction():
            self.discard(conn)
            return
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        now = time.monotonic()
        self._idle.append((conn, now))
        if len(self._idle) > self.min_size and now - self._idle[0][1] > self.max_idle:
            self._retire(now)

    def discard(self, conn: asyncpg.Connection) -> None:
        """Give back a connection whose borrow did not end cleanly: it is closed at once."""
        conn.terminate()
        self._open.discard(conn)  # (gone already when terminate() closed it)
        self._wake_one()

    def _wake_one(self) -> None:
        """Tell the first waiter there is room to open a connection."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _retire(self, now: float) -> None:
        """Close the connections idle for longer than ``max_idle`` (the oldest come first)."""
        while len(self._idle) > self.min_size and now - self._idle[0][1] > self.max_idle:
            conn, _ = self._idle.pop(0)
            self._open.discard(conn)
            self._close_later(conn)

    def _close_later(self, conn: asyncpg.Connection) -> None:
        task = asyncio.ensure_future(self._close_one(conn))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    @staticmethod
    async def _close_one(conn: asyncpg.Connection) -> None:
        try:
            await conn.close(timeout=5)
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError):
            conn.terminate()

    async def close(self) -> None:
        """Close the idle connections and refuse new borrows; lent ones are closed when given back."""
        self._closed = True
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(PoolClosed("the database pool is closed"))
        idle, self._idle = self._idle, []
        self._open.difference_update(conn for conn, _ in idle)
        await asyncio.gather(*(self._close_one(conn) for conn, _ in idle), *self._closing)

    def terminate(self) -> None:
        """Close every connection at once, lent ones too, without waiting for the server."""
        self._closed = True
        for conn in self._open:
            conn.terminate()
        self._open.clear()
        self._idle = []
