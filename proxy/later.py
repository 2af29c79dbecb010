"""What a call must still tell the database when it is away right now: retried in the background
with a growing pause, for ``lease_seconds`` -- after that the reaper finishes what is left
(docs/behaviour.md#failures)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from storage import StorageError, StorageUnavailable, TreeStore

__all__ = ["Later"]

log = logging.getLogger("branchpoint.call")


class Later:
    def __init__(self, tree: TreeStore, lease_seconds: float) -> None:
        self.tree = tree
        self.lease_seconds = lease_seconds

    async def _attempts(self) -> AsyncIterator[None]:
        """One attempt after 0.1 s, then doubling up to 5 s, for ``lease_seconds``."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self.lease_seconds
        delay = 0.1
        while loop.time() < give_up:
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
            yield

    async def abandon(self, node_id: uuid.UUID) -> None:
        """Reap the node of a call whose start was not confirmed, if the database did create it.
        Tried until it is found reaped or finished, or for ``lease_seconds`` (the reaper's turn)."""
        async for _ in self._attempts():
            try:
                outcome = await self.tree.abandon(node_id)
            except StorageError:
                continue
            if outcome != "missing":  # reaped now, or finished some other way
                if outcome == "reaped":
                    log.warning("released the node of a call whose start was not confirmed", extra={"node_id": str(node_id)})
                return
            # missing: the start never committed -- or has not yet; look again a little later

    async def store(self, node_id: uuid.UUID, store: Callable[[], Awaitable[Any]]) -> bool:
        """Store a call's outcome once the database is back: True when it was stored, False when
        it was still away after ``lease_seconds``. Only the database being away is waited out:
        any other error (a refusal that would come again) is raised at once."""
        async for _ in self._attempts():
            try:
                await store()
            except StorageUnavailable:
                continue
            log.info("stored a call's outcome after the database came back", extra={"node_id": str(node_id)})
            return True
        return False
