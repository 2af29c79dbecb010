"""In-flight lease upkeep (docs/behaviour.md#leases): keep the leases of this process's running calls
alive, however long they take, and reap the calls of processes that died.

One renewal loop for all calls of the process, and one reaper loop; both only talk to PostgreSQL,
so any number of proxy processes sharing a database cooperate without knowing of each other.

The renewal loop wakes every third of ``lease_seconds`` (the interval) and renews only the leases
set at least an interval ago: a call shorter than the interval -- nearly every call -- costs
nothing extra, and a longer one is renewed once per interval. A lease is renewed at the latest two
intervals after it was set, with an interval (a third of the lease) to spare before it runs out.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

from storage import StorageError, TreeStore

from .background import periodically
from .metrics import Metrics

__all__ = ["LeaseKeeper"]

log = logging.getLogger("branchpoint.leases")


class LeaseKeeper:
    def __init__(self, tree: TreeStore, metrics: Metrics, *, lease_seconds: float, reaper_interval: float) -> None:
        self.tree = tree
        self.metrics = metrics
        self.lease_seconds = lease_seconds
        self.reaper_interval = reaper_interval
        self.interval = max(0.05, lease_seconds / 3)  # between renewal passes
        # node id -> (tree id, when its lease was last set: before the statement that set it was sent)
        self.inflight: dict[uuid.UUID, tuple[uuid.UUID, float]] = {}
        self.lapsed: set[uuid.UUID] = set()  # tracked calls whose lease may have run out: for good
        self.spare = min(1.0, lease_seconds / 10)  # (for clocks that do not quite agree)
        self._tasks: list[asyncio.Task[None]] = []

    def track(self, tree_id: uuid.UUID, node_id: uuid.UUID, since: float) -> None:
        """A started call of this process; ``since``: ``time.monotonic()`` taken before its start
        was sent -- the lease the start set runs out no earlier than ``lease_seconds`` later."""
        self.inflight[node_id] = (tree_id, since)

    def untrack(self, node_id: uuid.UUID) -> None:
        self.inflight.pop(node_id, None)
        self.lapsed.discard(node_id)

    def held(self, node_id: uuid.UUID) -> bool:
        """Does this call surely still hold its lease: set (by its start or a renewal that found the
        node pending) less than ``lease_seconds`` ago, and never seen run out? Once it may have,
        another process may have reaped the node and a delete taken it: its finish must not write
        it again as a start the database lost (docs/architecture.md#durability)."""
        entry = self.inflight.get(node_id)
        return (entry is not None and node_id not in self.lapsed
                and time.monotonic() - entry[1] < self.lease_seconds - self.spare)

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._renew_loop(), name="branchpoint-lease-renewal"),
            asyncio.create_task(self._reap_loop(), name="branchpoint-reaper"),
        ]

    async def settle(self, timeout: float) -> None:
        """Wait until every call of this process has stored its outcome, at most ``timeout``: at
        shutdown, the calls the server has just stopped are still storing theirs (an outcome the
        database refuses for now is retried in the background, which the shutdown waits for too)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.inflight and loop.time() < deadline:
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    async def renew_due(self) -> None:
        """Renew the leases set at least an interval ago (module docstring). A renewal that finds
        the node no longer pending, or missing, renews nothing: while the lease was surely held
        when it was sent, nobody can have reaped the node -- a start the database lost, which the
        finish writes again; after that, the lease ran out for good (``held``)."""
        for node_id, (tree_id, since) in list(self.inflight.items()):
            if time.monotonic() - since < self.interval:
                continue
            held = self.held(node_id)
            sent = time.monotonic()
            try:
                renewed = await self.tree.renew(tree_id, node_id, self.lease_seconds)
            except StorageError as exc:
                log.warning("lease renewal failed", extra={"node_id": str(node_id), "error": str(exc)})
                continue
            if node_id not in self.inflight:  # (finished meanwhile)
                continue
            if renewed:
                self.inflight[node_id] = (tree_id, sent)
            elif not held:
                self.lapsed.add(node_id)

    async def reap(self) -> int:
        reaped = await self.tree.reap_expired()
        if reaped:
            self.metrics.reaped.inc(reaped)
            log.warning("reaped interrupted calls", extra={"count": reaped})
        return reaped

    async def _renew_loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self.renew_due()

    async def _reap_loop(self) -> None:
        await periodically(self.reap, self.reaper_interval, what="reaper", log=log)
