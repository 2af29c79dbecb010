"""The conversation tree as the call path uses it: start a call, finish it, keep its lease alive,
reap calls whose process died, write compactions. One method, one statement, one round trip --
shared, for starts and finishes, with the other calls' that reach the database at the same time
(``storage.batching``)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from . import queries
from .batching import Batch
from .database import Database
from .model import Outcome, PathNode, rows
from .pathcache import PathCache
from .transcript import digests, system_hash

__all__ = ["Begun", "ContextMode", "ParentMode", "TreeStore"]

ParentMode = Literal["head", "root", "node"]


ContextMode = Literal["delta", "full", "window"]  # window: the window did not suffice, nothing written


@dataclass(frozen=True, slots=True)
class Begun:
    """A started call: its conversation and tree, the parent it hangs under (None: a root) and that
    parent's path; the mode that handled it, how many of its non-system messages matched stored
    nodes (full mode) and how many of them the new node does not repeat (``start``)."""

    conversation_id: str
    tree_id: uuid.UUID
    parent_id: uuid.UUID | None
    mode: ContextMode
    matched: int = 0
    start: int = 0
    with_system: bool = False
    path: list[PathNode] = field(default_factory=list)


class TreeStore:
    """``batch``: starts and finishes reaching the database together share a round trip
    (``storage.batching``)."""

    def __init__(self, db: Database, cache: PathCache | None = None, *, batch: bool = True) -> None:
        self.db = db
        self.cache = cache if cache is not None else PathCache(0)
        # tag: the position of the node's id among the arguments ($5 and $2), which the rows repeat
        self._begins = Batch(db, queries.BEGIN_CALL, tag=4, enabled=batch)
        self._finishes = Batch(db, queries.FINISH_CALL, tag=1, enabled=batch)

    async def begin_call(
        self,
        *,
        tenant: str,
        conversation_id: str | None,
        node_id: uuid.UUID,
        new_tree_id: uuid.UUID,
        kind: str,
        mode: ContextMode,
        parent_mode: ParentMode,
        parent_id: uuid.UUID | None,
        sent: list[Any],
        digests: list[bytes],
        prefixes: list[bytes],
        system_hash: bytes | None,
        lease_seconds: float,
        model: str | None,
        provider: str | None,
        params: dict[str, Any],
        new_conversation_id: str | None = None,
        prefix_offset: int = 0,
        ordinals: list[int] | None = None,
        api: str = "chat",
    ) -> Begun:
        """Start a call (``bp_begin_call`` in functions.sql says how each argument is used).
        Raises ``Busy``, ``NodeMissing`` or ``BeforeCompaction`` when a rule refuses it.

        The parent's path is read only below the nodes this process keeps (``PathCache``)
        and completed from them."""
        known = self.cache.known(tenant, conversation_id, parent_id if parent_mode == "node" else None)
        records = await self._begins.fetch(
            (tenant, conversation_id or ""),
            tenant, conversation_id, new_conversation_id, new_tree_id, node_id, kind, mode, parent_mode, parent_id,
            sent, digests, prefixes, prefix_offset, system_hash, lease_seconds, model, provider, params, ordinals, api,
            known,
        )
        first = records[0]
        fresh = rows(PathNode, (r["node"] for r in records)) if first["node"] is not None else []
        parent = first["parent_id"]
        path: list[PathNode] = []
        if parent is not None:
            # the read stopped above a kept node (or the parent itself is kept), or reached the root
            stop = fresh[0].parent_id if fresh else parent
            completed = self.cache.complete(tenant, first["conversation_id"], first["tree_id"], stop, fresh)
            if completed is None:  # the kept part was evicted meanwhile: read it all
                completed = await self.path(first["tree_id"], parent)
                self.cache.complete(tenant, first["conversation_id"], first["tree_id"], None, completed)
            path = completed
        elif first["conversation_id"] is not None:
            self.cache.complete(tenant, first["conversation_id"], first["tree_id"], None, [])
        return Begun(first["conversation_id"], first["tree_id"], parent, first["mode"], first["matched"],
                     first["start"], first["with_system"], path)

    async def finish_call(
        self,
        *,
        tree_id: uuid.UUID,
        node_id: uuid.UUID,
        outcome: Outcome,
        received: list[Any] | None,
        usage: dict[str, Any] | None,
        finish_reason: str | None,
        error: Any,
        request_hash: bytes | None,
        leased: bool,
        received_digests: list[bytes] | None = None,
        tenant: str = "",
        conversation_id: str = "",
    ) -> bool:
        """Store the outcome; the head follows the head rule. False: the node was reaped meanwhile.
        ``received_digests``: the transcript digests of the answer (default: of ``received`` read
        as chat messages). ``tenant`` and ``conversation_id`` order a batch (``storage.batching``)."""
        if received_digests is None:
            received_digests = digests(received or ())
        records = await self._finishes.fetch(
            (tenant, conversation_id),
            tree_id, node_id, outcome.value, received, received_digests, usage, finish_reason, error,
            request_hash, leased,
        )
        return bool(records[0]["finished"])

    async def renew(self, tree_id: uuid.UUID, node_id: uuid.UUID, lease_seconds: float) -> bool:
        return bool(await self.db.fetchval(queries.RENEW_LEASE, tree_id, node_id, lease_seconds))

    async def reap_expired(self, limit: int = 100) -> int:
        """Reap every pending node whose lease ran out; returns how many were reaped."""
        reaped = 0
        for row in await self.db.fetch(queries.EXPIRED_PENDING, limit):
            if await self.db.fetchval(queries.REAP_NODE, row["tree_id"], row["id"]):
                reaped += 1
        return reaped

    async def abandon(self, node_id: uuid.UUID) -> str:
        """'reaped', 'missing' or 'finished' (``bp_abandon``)."""
        return await self.db.fetchval(queries.ABANDON, node_id)

    async def path(self, tree_id: uuid.UUID, node_id: uuid.UUID) -> list[PathNode]:
        return rows(PathNode, await self.db.fetch(queries.PATH_NODES, tree_id, node_id))

    async def apply_compaction(self, *, tenant: str, conversation_id: str, tree_id: uuid.UUID, node_id: uuid.UUID,
                               compacted_from: uuid.UUID, sent: list[Any], model: str,
                               provider: str, params: dict[str, Any], usage: dict[str, Any] | None, mode: str,
                               call_node: uuid.UUID | None, request: bytes) -> str:
        """'ok', or why nothing was written: 'moved', 'busy', 'lost_lease', 'conversation_not_found'."""
        return await self.db.fetchval(
            queries.APPLY_COMPACTION, tenant, conversation_id, tree_id, node_id, compacted_from, sent, system_hash(sent),
            model, provider, params, usage, mode, call_node, request,
        )

    async def node_params(self, tree_id: uuid.UUID, node_id: uuid.UUID) -> dict[str, Any]:
        return await self.db.fetchval(queries.NODE_PARAMS, tree_id, node_id) or {}

    async def conversation_state(self, tenant: str, conversation_id: str) -> tuple[uuid.UUID | None, bool] | None:
        """(head, busy) of a conversation, or None when it does not exist."""
        row = await self.db.fetchrow(queries.CONVERSATION_STATE, tenant, conversation_id)
        return None if row is None else (row["head_node_id"], row["busy"])
