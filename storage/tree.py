"""The conversation tree as the proxy's call path uses it: start a call, finish it, keep its
lease alive, reap calls whose process died. One method, one statement, one round trip."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from . import queries
from .database import Database

__all__ = ["BeginResult", "PathNode", "TreeStore"]

ParentMode = Literal["head", "root", "node"]


class PathNode(msgspec.Struct, frozen=True):
    """One node of a path, as assembly needs it."""

    id: uuid.UUID
    parent_id: uuid.UUID | None
    kind: str
    status: str
    sent: list[dict[str, Any]]
    received: list[dict[str, Any]] | None = None
    provider: str | None = None
    model: str | None = None
    usage: dict[str, Any] | None = None
    compacted_from: uuid.UUID | None = None


@dataclass(frozen=True)
class BeginResult:
    """``outcome`` is 'ok', 'busy', 'parent_not_found' or 'parent_before_compaction'."""

    outcome: str
    tree_id: uuid.UUID | None = None
    parent_id: uuid.UUID | None = None
    path: list[PathNode] = field(default_factory=list)


def _path_node(r: Any) -> PathNode:
    return PathNode(
        id=r["id"],
        parent_id=r["node_parent_id"] if "node_parent_id" in r else r["parent_id"],
        kind=r["kind"],
        status=r["status"],
        sent=r["sent"],
        received=r["received"],
        provider=r["provider"],
        model=r["model"],
        usage=r["usage"],
        compacted_from=r["compacted_from"],
    )


class TreeStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def begin_call(
        self,
        *,
        tenant: str,
        conversation_id: str,
        node_id: uuid.UUID,
        new_tree_id: uuid.UUID,
        kind: str,
        parent_mode: ParentMode,
        parent_id: uuid.UUID | None,
        sent: list[Any],
        sent_hash: bytes,
        lease_seconds: float,
        model: str | None,
        provider: str | None,
        params: dict[str, Any],
    ) -> BeginResult:
        rows = await self.db.fetch(
            queries.BEGIN_CALL,
            tenant, conversation_id, new_tree_id, node_id, kind, parent_mode, parent_id,
            sent, sent_hash, lease_seconds, model, provider, params,
        )
        first = rows[0]
        if first["outcome"] != "ok":
            return BeginResult(first["outcome"], first["tree_id"])
        path = [_path_node(r) for r in rows] if first["id"] is not None else []
        return BeginResult("ok", first["tree_id"], first["parent_id"], path)

    async def finish_call(
        self,
        *,
        tree_id: uuid.UUID,
        node_id: uuid.UUID,
        status: str,
        received: list[Any] | None,
        usage: dict[str, Any] | None,
        finish_reason: str | None,
        error: dict[str, Any] | None,
        request_hash: bytes | None,
        move_head: bool,
    ) -> bool:
        return bool(
            await self.db.fetchval(
                queries.FINISH_CALL,
                tree_id, node_id, status, received, usage, finish_reason, error, request_hash, move_head,
            )
        )

    async def renew(self, tree_id: uuid.UUID, node_id: uuid.UUID, lease_seconds: float) -> bool:
        return bool(await self.db.fetchval(queries.RENEW_LEASE, tree_id, node_id, lease_seconds))

    async def reap_expired(self, limit: int = 100) -> int:
        """Reap every pending node whose lease ran out; returns how many were reaped."""
        reaped = 0
        for row in await self.db.fetch(queries.EXPIRED_PENDING, limit):
            if await self.db.fetchval(queries.REAP_NODE, row["tree_id"], row["id"]):
                reaped += 1
        return reaped

    async def path(self, tree_id: uuid.UUID, node_id: uuid.UUID) -> list[PathNode]:
        return [_path_node(r) for r in await self.db.fetch(queries.PATH, tree_id, node_id)]

    async def apply_compaction(self, *, tenant: str, conversation_id: str, tree_id: uuid.UUID, node_id: uuid.UUID,
                               compacted_from: uuid.UUID, sent: list[Any], sent_hash: bytes, model: str,
                               provider: str, params: dict[str, Any], usage: dict[str, Any] | None, mode: str,
                               call_node: uuid.UUID | None, request: bytes) -> str:
        return await self.db.fetchval(
            queries.APPLY_COMPACTION, tenant, conversation_id, tree_id, node_id, compacted_from, sent, sent_hash,
            model, provider, params, usage, mode, call_node, request,
        )

    async def node_params(self, tree_id: uuid.UUID, node_id: uuid.UUID) -> dict[str, Any]:
        return await self.db.fetchval(queries.NODE_PARAMS, tree_id, node_id) or {}

    async def conversation_state(self, tenant: str, conversation_id: str) -> tuple[uuid.UUID | None, bool] | None:
        row = await self.db.fetchrow(queries.CONVERSATION_STATE, tenant, conversation_id)
        return None if row is None else (row["head_node_id"], row["busy"])
