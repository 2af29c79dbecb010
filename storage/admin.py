"""The conversation tree as the admin API reads and moves it (SPEC §6). Every method is scoped to
a tenant; an id of another tenant is simply not found."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from . import queries
from .database import Database

__all__ = ["AdminStore", "Outcome"]


@dataclass(frozen=True)
class Outcome:
    """``status`` is 'ok' or one of the refusal codes of the functions in functions.sql."""

    status: str
    head: uuid.UUID | None = None
    deleted: int = 0
    kept: int = 0


class AdminStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def conversation(self, tenant: str, conversation_id: str) -> asyncpg.Record | None:
        return await self.db.fetchrow(queries.CONVERSATION, tenant, conversation_id)

    async def conversations(self, tenant: str | None, *, after: tuple[datetime, str] | None, limit: int) -> list[asyncpg.Record]:
        created, cid = after if after else (None, None)
        return await self.db.fetch(queries.CONVERSATIONS_PAGE, tenant, created, cid, limit)

    async def set_head(self, tenant: str, conversation_id: str, node_id: uuid.UUID | None) -> Outcome:
        return Outcome(await self.db.fetchval(queries.SET_HEAD, tenant, conversation_id, node_id), node_id)

    async def switch(self, tenant: str, conversation_id: str, node_id: uuid.UUID) -> Outcome:
        row = await self.db.fetchrow(queries.SWITCH, tenant, conversation_id, node_id)
        assert row is not None
        return Outcome(row["outcome"], row["head"])

    async def fork(self, tenant: str, source: str, new_id: str, node_id: uuid.UUID | None, use_head: bool) -> Outcome:
        row = await self.db.fetchrow(queries.FORK, tenant, source, new_id, node_id, use_head)
        assert row is not None
        return Outcome(row["outcome"], row["head"])

    async def delete(self, tenant: str, conversation_id: str) -> Outcome:
        row = await self.db.fetchrow(queries.DELETE_CONVERSATION, tenant, conversation_id)
        assert row is not None
        return Outcome(row["outcome"], deleted=row["deleted"], kept=row["kept"])

    async def visible_foreign(self, conv: asyncpg.Record, tenant: str) -> list[uuid.UUID]:
        if conv["fork_node_id"] is None:
            return []  # only forks see nodes of another conversation
        return list(await self.db.fetchval(queries.VISIBLE_FOREIGN, conv["tree_id"], tenant, conv["id"]))

    async def path(self, conv: asyncpg.Record, tenant: str) -> list[asyncpg.Record]:
        if conv["head_node_id"] is None:
            return []
        visible = await self.visible_foreign(conv, tenant)
        return await self.db.fetch(queries.PATH_WITH_SIBLINGS, conv["tree_id"], conv["head_node_id"], conv["id"], visible)

    async def tree(self, conv: asyncpg.Record, tenant: str) -> list[asyncpg.Record]:
        visible = await self.visible_foreign(conv, tenant)
        return await self.db.fetch(queries.TREE, conv["tree_id"], tenant, conv["id"], visible)

    async def node(self, tenant: str | None, node_id: uuid.UUID) -> asyncpg.Record | None:
        return await self.db.fetchrow(queries.NODE, node_id, tenant)

    async def children(self, tenant: str, tree_id: uuid.UUID, node_id: uuid.UUID) -> list[asyncpg.Record]:
        return await self.db.fetch(queries.CHILDREN, tree_id, node_id, tenant)

    async def path_as_of(self, tree_id: uuid.UUID, node_id: uuid.UUID) -> list[Any]:
        return await self.db.fetch(queries.PATH, tree_id, node_id)  # rows carry the times for replay

    async def export(self, conv: asyncpg.Record, tenant: str, batch: int = 500) -> AsyncIterator[asyncpg.Record]:
        """Every node of the conversation, oldest first, streamed through a cursor."""
        visible = await self.visible_foreign(conv, tenant)
        async with self.db.pool.acquire() as conn, conn.transaction():
            async for row in conn.cursor(queries.EXPORT, conv["tree_id"], tenant, conv["id"], visible, prefetch=batch):
                yield row

    async def import_tree(self, tenant: str, conversation_id: str, nodes: list[dict[str, Any]],
                          head: uuid.UUID | None, compactions: int) -> int | None:
        """Insert an exported tree (ids already remapped) as a new conversation, in one statement.
        Returns the number of nodes written, or None when the conversation id is taken."""
        from .ids import uuid7

        row = await self.db.fetchrow(queries.IMPORT_TREE, tenant, conversation_id, uuid7(), head, compactions, nodes)
        assert row is not None
        return row["nodes"] if row["created"] else None
