"""Retention (docs/behaviour.md#retention): conversations idle for ``[retention] idle_days`` are
deleted with their nodes -- as ``DELETE /admin/conversations/{id}`` deletes them, so what a fork
still reaches stays. Every process runs a pass every ``interval_seconds``; passes running at once
skip each other's conversations (``bp_prune``). ``branchpoint conversations prune`` runs one pass
from the command line.

Whatever deleted the nodes (retention, an admin delete, a response deleted), a shared item
(``storage.shared``) no node refers to any more is removed by the sweep every process runs every
``SWEEP_SECONDS`` -- once nobody has seen it for ``storage.shared.GRACE``."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from storage import OpsStore, Pruned, SharedItems

from .background import periodically
from .metrics import Metrics

__all__ = ["SWEEP_SECONDS", "Retention", "idle_since", "prune"]

SWEEP_SECONDS = 300.0  # how often a process sweeps the shared items no node refers to

log = logging.getLogger("branchpoint.retention")


def idle_since(idle_days: float) -> datetime:
    """The cutoff: a conversation with nothing done since is idle."""
    return datetime.now(UTC) - timedelta(days=idle_days)


async def prune(ops: OpsStore, idle_days: float, batch: int, *, scan: int = 5000,
                on_batch: Callable[[Pruned], None] | None = None) -> Pruned:
    """One pass: delete every conversation idle for ``idle_days``, ``batch`` per transaction
    (``on_batch`` hears of each); returns the totals. Candidates are read ``scan`` at a time in
    the order of their last update (one scan of the conversations table each), so a pass costs a
    few scans however many are idle."""
    cutoff = idle_since(idle_days)
    done = Pruned()
    after = None
    while True:
        candidates = await ops.idle_candidates(cutoff, after, scan)
        for i in range(0, len(candidates), batch):
            step = await ops.prune(cutoff, candidates[i:i + batch])
            if on_batch is not None:
                on_batch(step)
            done += step
        if len(candidates) < scan:
            return done
        after = candidates[-1]


class Retention:
    def __init__(self, ops: OpsStore, metrics: Metrics, *, idle_days: float, interval: float, batch: int,
                 shared: SharedItems | None = None) -> None:
        self.ops = ops
        self.metrics = metrics
        self.idle_days = idle_days
        self.interval = interval
        self.batch = batch
        self.shared = shared
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        if self.idle_days > 0:
            self._tasks.append(asyncio.create_task(self._loop(), name="branchpoint-retention"))
        if self.shared is not None:
            self._tasks.append(asyncio.create_task(
                periodically(self.sweep, SWEEP_SECONDS, what="the shared items' sweep", log=log),
                name="branchpoint-shared-sweep"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    async def sweep(self) -> int:
        """Remove the shared items no node refers to any more (``SharedItems.sweep``)."""
        assert self.shared is not None
        removed = await self.shared.sweep()
        if removed:
            self.metrics.pruned.labels("shared_items").inc(removed)
            log.info("removed shared items no node refers to", extra={"shared_items": removed})
        return removed

    def _count(self, step: Pruned) -> None:
        self.metrics.pruned.labels("conversations").inc(step.conversations)
        self.metrics.pruned.labels("nodes").inc(step.deleted)

    async def run_once(self) -> Pruned:
        done = await prune(self.ops, self.idle_days, self.batch, on_batch=self._count)
        if done.conversations:
            log.info("deleted idle conversations", extra={
                "conversations": done.conversations, "nodes_deleted": done.deleted, "nodes_kept": done.kept,
                "idle_days": self.idle_days})
        return done

    async def _loop(self) -> None:
        await periodically(self.run_once, self.interval, what="retention", log=log, at_once=True)
