"""What operations ask the database: readiness, gauges, and the storage invariants that
``branchpoint check`` and the fault tests verify (the rules themselves: ``proxy.invariants``)."""

from __future__ import annotations

from typing import Any

import asyncpg

from . import queries
from .database import Database
from .model import PathNode, rows

__all__ = ["OpsStore"]


class OpsStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def schema_version(self) -> int:
        return await self.db.fetchval(queries.SCHEMA_VERSION)

    async def pending_count(self) -> int:
        return await self.db.fetchval(queries.PENDING_COUNT)

    async def heads_outside_tree(self) -> list[asyncpg.Record]:
        return await self.db.fetch(queries.HEADS_OUTSIDE_TREE)

    async def successes_without_received(self) -> list[asyncpg.Record]:
        return await self.db.fetch(queries.SUCCESS_WITHOUT_RECEIVED)

    async def stale_pending(self, grace: float) -> list[asyncpg.Record]:
        return await self.db.fetch(queries.STALE_PENDING, grace)

    async def stale_leases(self, grace: float) -> list[asyncpg.Record]:
        return await self.db.fetch(queries.STALE_LEASES, grace)

    async def head_paths(self, limit: int) -> list[tuple[Any, list[PathNode]]]:
        """(conversation id, its head path) for up to ``limit`` conversations."""
        out = []
        for head in await self.db.fetch(queries.HEADS, limit):
            path = rows(PathNode, await self.db.fetch(queries.PATH_NODES, head["tree_id"], head["head_node_id"]))
            out.append((head["id"], path))
        return out
