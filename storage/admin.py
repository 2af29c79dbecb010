"""The conversation tree as the admin API and the CLI read and move it. Every method is scoped to a
tenant; an id of another tenant is simply not found. Refusals raise ``storage.Refused``
subclasses (``Busy``, ``ConversationMissing``, ``NodeMissing``, ``NodePending``,
``ConversationExists``)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

from . import queries
from .database import Database
from .ids import uuid7
from .model import ConversationRow, NodeHit, NodeRow, PathRow, SearchHit, TreeRow, UsageRow, rows
from .shared import SharedItems

__all__ = ["AdminStore"]


class AdminStore:
    """``shared``: large items stored once per tenant -- the nodes read here come back whole."""

    def __init__(self, db: Database, shared: SharedItems | None = None) -> None:
        self.db = db
        self.shared = shared if shared is not None else SharedItems(db, min_bytes=0)

    async def conversation(self, tenant: str, conversation_id: str) -> ConversationRow | None:
        found = rows(ConversationRow, await self.db.fetch(queries.CONVERSATION, tenant, conversation_id))
        return found[0] if found else None

    async def conversations(self, tenant: str | None, *, after: tuple[datetime, str] | None,
                            limit: int, search: str | None = None) -> list[ConversationRow]:
        """Newest first; ``search`` keeps ids containing it (case-insensitive)."""
        created, cid = after if after else (None, None)
        return rows(ConversationRow,
                    await self.db.fetch(queries.CONVERSATIONS_PAGE, tenant, created, cid, limit, search or None))

    async def tenants_of(self, conversation_id: str) -> list[str]:
        return [r["tenant"] for r in await self.db.fetch(queries.TENANTS_OF, conversation_id)]

    async def set_head(self, tenant: str, conversation_id: str, node_id: uuid.UUID | None) -> None:
        await self.db.fetchval(queries.SET_HEAD, tenant, conversation_id, node_id)

    async def switch(self, tenant: str, conversation_id: str, node_id: uuid.UUID) -> uuid.UUID:
        """Move the head down from ``node_id`` to its newest leaf; returns the new head."""
        return await self.db.fetchval(queries.SWITCH, tenant, conversation_id, node_id)

    async def fork(self, tenant: str, source: str, new_id: str, node_id: uuid.UUID | None) -> uuid.UUID | None:
        """A new conversation starting at ``node_id`` (None: the source's head); returns its head."""
        return await self.db.fetchval(queries.FORK, tenant, source, new_id, node_id, node_id is None)

    async def fork_into_empty(self, tenant: str, source: str, target: str, node_id: uuid.UUID) -> uuid.UUID | None:
        """``fork`` into a conversation that exists but holds no node yet; refused
        (``ConversationExists``) when it holds one."""
        return await self.db.fetchval(queries.FORK_INTO_EMPTY, tenant, source, target, node_id)

    async def delete(self, tenant: str, conversation_id: str) -> tuple[int, int]:
        """Delete a conversation; returns (nodes deleted, nodes kept because a fork reaches them)."""
        row = await self.db.fetchrow(queries.DELETE_CONVERSATION, tenant, conversation_id)
        assert row is not None
        return row["deleted"], row["kept"]

    async def add_items(self, tenant: str, conversation_id: str, nodes: list[dict[str, Any]], *,
                        create: bool = False, metadata: dict[str, str] | None = None,
                        parent: uuid.UUID | None = None, replace_from: bool = False,
                        expected_head: uuid.UUID | None = None) -> uuid.UUID:
        """Nodes of kind 'items' (each ``{id, sent, digests, system_hash, answered, params}``), each under
        the one before, the first under the head -- or, ``replace_from``, under ``parent`` (None: a
        root) while the head still is ``expected_head``; the head moves to the last. ``create``:
        the conversation is made if it does not exist (with ``metadata``). Returns its tree."""
        nodes = [{**n, "sent": (await self.shared.prepare(tenant, n["sent"], {}))[0]} for n in nodes]
        return await self.db.fetchval(queries.ADD_ITEMS, tenant, conversation_id, uuid7(), create, metadata,
                                      "node" if replace_from else "head", parent, expected_head, nodes)

    async def set_metadata(self, tenant: str, conversation_id: str, metadata: dict[str, str]) -> None:
        await self.db.fetchval(queries.SET_METADATA, tenant, conversation_id, metadata)

    async def conversation_metadata(self, tenant: str, conversation_id: str) -> tuple[dict[str, str] | None, datetime] | None:
        """(metadata, created_at) of a conversation, or None when there is none."""
        row = await self.db.fetchrow(queries.CONVERSATION_METADATA, tenant, conversation_id)
        return None if row is None else (row["metadata"], row["created_at"])

    async def search(self, tenant: str | None, words: str, limit: int) -> list[SearchHit]:
        """The ``limit`` nodes whose messages best match ``words`` (full-text, migration 0027: bp_search_vector), in
        the conversations of ``tenant`` (None: every tenant), each with the conversation that made
        it -- or, when that one was deleted, each fork that still reaches it."""
        hits: list[SearchHit] = []
        forks: dict[tuple[uuid.UUID, str], list[tuple[str, set[uuid.UUID]]]] = {}
        for row in rows(NodeHit, await self.db.fetch(queries.SEARCH, tenant, words, limit)):
            if row.conversation_id is not None:
                owners = [row.conversation_id]
            else:
                # the conversation that made it was deleted, the node kept because forks reach it:
                # it is in their context, so a search finds them (rare: read only then)
                key = (row.tree_id, row.tenant)
                if key not in forks:
                    forks[key] = [(fork, set(await self.db.fetchval(queries.VISIBLE_FOREIGN, row.tree_id, row.tenant, fork)))
                                  for fork in [r["id"] for r in await self.db.fetch(queries.FORKS_OF_TREE, *key)]]
                owners = [fork for fork, seen in forks[key] if row.node_id in seen]
            hits.extend(SearchHit(row.tenant, owner, row.node_id, row.created_at, row.rank, row.snippet) for owner in owners)
        return hits[:limit]

    async def usage(self, tenant: str | None, since: datetime, until: datetime) -> list[UsageRow]:
        """Token usage by tenant and model of the calls made in ``[since, until)`` in the
        conversations of ``tenant`` (None: every tenant)."""
        return rows(UsageRow, await self.db.fetch(queries.USAGE, tenant, since, until))

    async def visible_foreign(self, conv: ConversationRow) -> list[uuid.UUID]:
        if conv.fork_node_id is None:
            return []  # only forks see nodes of another conversation
        return list(await self.db.fetchval(queries.VISIBLE_FOREIGN, conv.tree_id, conv.tenant, conv.id))

    async def path(self, conv: ConversationRow) -> list[PathRow]:
        if conv.head_node_id is None:
            return []
        visible = await self.visible_foreign(conv)
        return await self.shared.resolve_rows(rows(PathRow, await self.db.fetch(
            queries.PATH_WITH_SIBLINGS, conv.tree_id, conv.head_node_id, conv.id, visible)))

    async def path_rows(self, tree_id: uuid.UUID, node_id: uuid.UUID) -> list[NodeRow]:
        """A path, root first, whole rows (with their times: replay needs them)."""
        return await self.shared.resolve_rows(rows(NodeRow, await self.db.fetch(queries.PATH, tree_id, node_id)))

    async def tree(self, conv: ConversationRow) -> list[TreeRow]:
        visible = await self.visible_foreign(conv)
        return rows(TreeRow, await self.db.fetch(queries.TREE, conv.tree_id, conv.tenant, conv.id, visible))

    async def node(self, tenant: str | None, node_id: uuid.UUID) -> NodeRow | None:
        found = rows(NodeRow, await self.db.fetch(queries.NODE, node_id, tenant))
        return (await self.shared.resolve_rows(found))[0] if found else None

    async def delete_response(self, tenant: str, node_id: uuid.UUID) -> str:
        """'deleted' (the node went), 'withdrawn' (other nodes need it: kept, hidden from the
        Responses API) or 'not_found'."""
        return await self.db.fetchval(queries.DELETE_RESPONSE, tenant, node_id)

    async def summariser_request(self, node: NodeRow) -> bytes | None:
        value = await self.db.fetchval(queries.SUMMARISER_REQUEST, node.tree_id, node.id)
        return bytes(value) if value is not None else None

    async def children(self, node: NodeRow) -> list[NodeRow]:
        return await self.shared.resolve_rows(rows(NodeRow, await self.db.fetch(queries.CHILDREN, node.tree_id, node.id,
                                                                                 node.tenant)))

    async def export(self, conv: ConversationRow, batch: int = 500) -> AsyncIterator[NodeRow]:
        """Every node of the conversation, oldest first, read ``batch`` at a time: no connection
        is held while the caller writes a page out (to a slow client, say). A node made meanwhile
        comes at the end, as it would have had the export started later."""
        visible = await self.visible_foreign(conv)
        after: tuple[datetime | None, uuid.UUID | None] = (None, None)
        while True:
            page = await self.shared.resolve_rows(rows(NodeRow, await self.db.fetch(
                queries.EXPORT, conv.tree_id, conv.tenant, conv.id, visible, *after, batch)))
            for row in page:
                yield row
            if len(page) < batch:
                return
            after = (page[-1].created_at, page[-1].id)

    async def import_tree(self, tenant: str, conversation_id: str, nodes: list[dict[str, Any]],
                          head: uuid.UUID | None, compactions: int, *, metadata: dict[str, str] | None = None,
                          created_at: datetime | None = None) -> int | None:
        """Insert an exported tree (ids already remapped) as a new conversation, in one statement
        (``metadata`` and ``created_at``: the conversation's own, as exported). Returns the number
        of nodes written, or None when the conversation id is taken."""
        shared = []
        for node in nodes:
            given = node.get("params")
            sent, params = await self.shared.prepare(tenant, node["sent"], given or {})
            shared.append({**node, "sent": sent, "params": params if given is not None else given})
        nodes = shared
        row = await self.db.fetchrow(queries.IMPORT_TREE, tenant, conversation_id, uuid7(), head, compactions, nodes,
                                     metadata, created_at)
        assert row is not None
        return row["nodes"] if row["created"] else None
