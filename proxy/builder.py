"""What exactly is sent upstream: the one place a call's upstream body is built -- for the live
call and for ``GET /admin/nodes/{id}/request`` alike, so the replay can be checked byte for byte
against the hash stored with the node.

    path (from storage)  ->  readable()  ->  assemble()  ->  build_body()
                             unfold opaque      pure: system rule, pairing,
                             compactions        provider shaping
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from storage import NodeRow, PathNode, TreeStore

from .assembly import Target, assemble, build_body

__all__ = ["Built", "RequestBuilder"]


@dataclass(frozen=True, slots=True)
class Built:
    payload: bytes  # the exact body sent upstream
    dropped: list[dict[str, Any]]  # what the pairing check removed (a defect somewhere: logged)

    @property
    def sha256(self) -> bytes:
        return hashlib.sha256(self.payload).digest()


class RequestBuilder:
    def __init__(self, tree: TreeStore) -> None:
        self.tree = tree

    async def readable(self, tree_id: uuid.UUID, path: list[PathNode], target: Target) -> list[PathNode]:
        """A compaction in a provider-specific (opaque) form that the target cannot read is
        unfolded: assembly follows ``compacted_from`` and uses the original path instead."""
        while path and path[0].kind == "compaction" and path[0].provider != target.provider:
            params = await self.tree.node_params(tree_id, path[0].id)
            if params.get("format", "text") != "opaque" or path[0].compacted_from is None:
                break
            original = await self.tree.path(tree_id, path[0].compacted_from)
            path = original + path[1:]
        return path

    @staticmethod
    def build(path: Sequence[PathNode], new_items: Sequence[dict[str, Any]], params: dict[str, Any],
              target: Target, *, stream: bool) -> Built:
        assembled = assemble(path, new_items, target)
        return Built(build_body(params, assembled.messages, stream=stream), assembled.dropped)

    async def replay(self, node: NodeRow, path: Sequence[NodeRow], target: Target) -> Built:
        """Rebuild the body sent for ``node`` from the path of its parent (``path``, root first) as
        it was when the node was created: an ancestor that finished later counted as pending."""
        as_of = []
        for r in path:
            status = r.status
            if status == "success" and (r.finished_at is None or r.finished_at > node.created_at):
                status = "pending"
            as_of.append(PathNode(id=r.id, parent_id=r.parent_id, kind=r.kind, status=status, sent=r.sent,
                                  received=r.received, provider=r.provider, model=r.model, usage=r.usage,
                                  compacted_from=r.compacted_from))
        readable = await self.readable(node.tree_id, as_of, target)
        params = dict(node.params)
        return self.build(readable, node.sent, params, target, stream=params.get("stream") is True)
