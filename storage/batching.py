"""Statements that reach the database together share one round trip and one transaction
(docs/architecture.md#batched-round-trips).

A call is two statements: its start (``bp_begin_call``) and its finish (``bp_finish_call``). Under
load many calls reach the same statement in the same turn of the event loop -- their upstream
answers arrived in the same poll, say. A ``Batch`` sends those together: asyncpg's ``fetchmany``
binds and executes each, then syncs once, so the server runs them in one implicit transaction
with one commit, and the process waits once. Both sides spend less per statement (the protocol,
the transaction, the commit, the wake-ups), which is most of a stored call's database cost
(bench/README.md).

Rules:
- nothing waits to fill a batch: the first call to reach the statement in a turn of the event loop
  lets the tasks already woken in that turn run (one ``sleep(0)``), and those that reach the
  statement meanwhile join it; a call that found none goes alone, exactly as without batching;
- at most ``limit`` statements per round trip; a longer queue goes as several round trips;
- a batch runs in the order of its statements' keys (tenant, conversation): batches lock
  conversation rows in one global order, so two of them cannot deadlock on those;
- a batch is all or nothing. When one of its statements fails (a rule refused a start, a
  constraint, a deadlock, an argument that cannot be sent), nothing of it was carried out and every
  statement runs again alone, so each caller gets its own answer or its own refusal as if no batch
  had been formed. When the database fails (unreachable; or the batch timed out or lost its
  connection once sent, so it may have been carried out), every caller gets that error, as each
  would have alone -- and a batch waits as long as its slowest statement: a conversation row held
  by a long transaction holds up the calls sharing its round trip;
- a caller cancelled while it waits for its batch does not stop the batch: its statement still
  runs -- the call lifecycle already treats an interrupted start or finish as possibly carried out.
  (The first caller of a turn, cancelled while it gathers the others, sends nothing of its own.)

Each caller names its statement's ``key`` (the node of the call), and the statement's rows repeat
it as their first column: that is how a batch's rows are handed back to their callers -- whatever
the statement's arguments are.

Batches take rows of several trees in one transaction; on a PostgreSQL distributed by tree
(Citus, ``branchpoint distribute``) that would be a distributed transaction across shards, so a
``Batch`` sends every statement alone when the database said, as it was opened, that the schema
is distributed (``Database.distributed``, ``storage.distribute.is_distributed``) -- no setting to
remember (``[database] batch_calls = false`` turns batching off anywhere). A process started
before the schema was distributed goes on batching until it is restarted
(docs/scaling.md#past-one-postgresql).
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from typing import Any

import asyncpg

from .database import Database
from .errors import StorageUnavailable

__all__ = ["Batch"]

# (order, key, args, waiter)
_Item = tuple[tuple[str, str], Hashable, tuple[Any, ...], "asyncio.Future[list[asyncpg.Record]]"]

# the statements' own failures that PostgreSQL reports as the database's (storage.errors): the
# batch was rolled back, and alone they may well pass (a lock wait past lock_timeout: one
# statement's row held by another session)
_ROLLED_BACK = (asyncpg.DeadlockDetectedError, asyncpg.SerializationError, asyncpg.LockNotAvailableError,
                asyncpg.DataError)


def _retry_alone(exc: BaseException) -> bool:
    """Was the batch's failure one of its statements' (nothing carried out: run each alone), rather
    than the database's (unreachable, or gone quiet once the batch was sent: it may have been
    carried out, and each caller gets the error it would have got alone)?"""
    if isinstance(exc, StorageUnavailable):
        return isinstance(exc.__cause__, _ROLLED_BACK)
    return True  # a refusal, a statement's error, an argument that could not be sent


class Batch:
    """One statement, run for many callers; see the module docstring. ``enabled=False``: each
    call is its own round trip."""

    def __init__(self, db: Database, query: str, *, enabled: bool = True, limit: int = 32) -> None:
        self.db = db
        self.query = query
        self.enabled = enabled
        self.limit = limit
        self._gathering: list[_Item] | None = None  # the calls joining this turn's first one
        self._tasks: set[asyncio.Task[None]] = set()

    def batching(self) -> bool:
        """Does this batch gather statements: enabled, and the schema not distributed (as the
        database said when it was opened: ``Database.distributed``)?"""
        return self.enabled and not self.db.distributed

    async def fetch(self, order: tuple[str, str], key: Hashable, *args: Any) -> list[asyncpg.Record]:
        """The statement's rows for ``args``: those whose first column is ``key`` (the call's
        node). ``order``: (tenant, conversation) -- the order a batch runs in."""
        if not self.batching():
            return await self.db.fetch(self.query, *args)
        loop = asyncio.get_running_loop()
        if self._gathering is not None:  # the first call of this turn gathers the others: join it
            waiter: asyncio.Future[list[asyncpg.Record]] = loop.create_future()
            self._gathering.append((order, key, args, waiter))
            return await waiter
        others = self._gathering = []
        try:
            await asyncio.sleep(0)  # every task already woken in this turn has its go first
        except asyncio.CancelledError:
            self._send_soon(others)
            raise
        finally:
            self._gathering = None
        if not others:  # alone: exactly as without batching
            return await self.db.fetch(self.query, *args)
        waiter = loop.create_future()
        self._send_soon([(order, key, args, waiter), *others])  # in a task: no one caller's cancellation stops it
        return await waiter

    def _send_soon(self, items: list[_Item]) -> None:
        items.sort(key=lambda item: item[0])  # (stable: one conversation's statements keep their order)
        for start in range(0, len(items), self.limit):
            task = asyncio.get_running_loop().create_task(self._send(items[start:start + self.limit]))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send(self, items: list[_Item]) -> None:
        if len(items) == 1:
            await self._alone(items[0])
            return
        try:
            records = await self.db.fetchmany(self.query, [args for _, _, args, _ in items])
        except asyncio.CancelledError:
            for *_, waiter in items:
                waiter.cancel()
            raise
        except Exception as exc:  # noqa: BLE001 - handed to the callers, whatever it is
            if _retry_alone(exc):
                await asyncio.gather(*(self._alone(item) for item in items))
            else:
                for *_, waiter in items:
                    if not waiter.done():
                        waiter.set_exception(exc)
            return
        rows: dict[Hashable, list[asyncpg.Record]] = {}
        for record in records:
            rows.setdefault(record[0], []).append(record)
        for _, key, _, waiter in items:
            if not waiter.done():
                waiter.set_result(rows.get(key, []))

    async def _alone(self, item: _Item) -> None:
        _, _, args, waiter = item
        try:
            records = await self.db.fetch(self.query, *args)
        except asyncio.CancelledError:
            waiter.cancel()
            raise
        except Exception as exc:  # noqa: BLE001 - handed to the caller, whatever it is
            if not waiter.done():
                waiter.set_exception(exc)
            return
        if not waiter.done():
            waiter.set_result(records)
