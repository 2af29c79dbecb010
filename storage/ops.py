"""What operations ask the database: readiness, gauges, retention, and the storage invariants
that ``branchpoint check`` and the fault tests verify (the rules themselves: ``proxy.invariants``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import asyncpg

from . import queries
from .database import Database
from .model import PathNode, Pruned, rows
from .shared import SharedItems

__all__ = ["OpsStore"]

# Nodes no conversation of their tree reaches (storage/functions/retention.sql).  $1 limit
_UNREACHED_NODES = "SELECT tree_id, id, tenant, conversation_id FROM bp_unreached_nodes($1)"


class OpsStore:
    def __init__(self, db: Database) -> None:
        self.db = db
        self._shared = SharedItems(db, min_bytes=0)  # (reads paths whole: ``head_paths``)

    async def readiness(self) -> tuple[int, bool]:
        """(the schema version the database is at, whether it takes writes): one cheap query."""
        row = await self.db.fetchrow(queries.READINESS)
        return row["version"], row["writable"]

    async def pending_count(self) -> int:
        return await self.db.fetchval(queries.PENDING_COUNT)

    async def idle_candidates(self, cutoff: datetime, after: asyncpg.Record | None, limit: int) -> list[asyncpg.Record]:
        """The next ``limit`` conversations not updated since ``cutoff`` after ``after`` (a row
        this returned), oldest first: (tree_id, tenant, id, updated_at)."""
        key = (after["updated_at"], after["tenant"], after["id"]) if after is not None else (None, None, None)
        return await self.db.fetch(queries.IDLE_CANDIDATES, cutoff, *key, limit)

    async def prune(self, cutoff: datetime, candidates: list[asyncpg.Record]) -> Pruned:
        """Delete those of ``candidates`` idle since ``cutoff`` (one transaction)."""
        trees, tenants, ids = ([c[f] for c in candidates] for f in ("tree_id", "tenant", "id"))
        return Pruned(*await self.db.fetchrow(queries.PRUNE, cutoff, trees, tenants, ids))

    async def idle(self, cutoff: datetime) -> tuple[int, int]:
        """(conversations idle since ``cutoff``, the nodes they made): what pruning would take."""
        row = await self.db.fetchrow(queries.IDLE_COUNT, cutoff)
        return row["conversations"], row["nodes"]

    async def heads_outside_tree(self) -> list[asyncpg.Record]:
        return await self.db.fetch(queries.HEADS_OUTSIDE_TREE)

    async def successes_without_received(self) -> list[asyncpg.Record]:
        return await self.db.fetch(queries.SUCCESS_WITHOUT_RECEIVED)

    async def unreached_nodes(self, limit: int) -> list[asyncpg.Record]:
        """Up to ``limit`` nodes no conversation of their tree reaches (a delete left them):
        (tree_id, id, tenant, conversation_id)."""
        return await self.db.fetch(_UNREACHED_NODES, limit)

    async def stale_pending(self, grace: float) -> list[asyncpg.Record]:
        return await self.db.fetch(queries.STALE_PENDING, grace)

    async def stale_leases(self, grace: float) -> list[asyncpg.Record]:
        return await self.db.fetch(queries.STALE_LEASES, grace)

    async def head_paths(self, limit: int) -> list[tuple[Any, list[PathNode]]]:
        """(conversation id, its head path) for up to ``limit`` conversations."""
        out = []
        for head in await self.db.fetch(queries.HEADS, limit):
            path = rows(PathNode, await self.db.fetch(queries.PATH_NODES, head["tree_id"], head["head_node_id"]))
            out.append((head["id"], await self._shared.resolve(head["tenant"], path)))
        return out
