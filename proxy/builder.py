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

import msgspec

from storage import NodeRow, PathNode, TreeStore

from .assembly import Target, assemble, build_body
from .responses import items as responses_items
from .responses import translate

__all__ = ["Built", "RequestBuilder"]


_encode_sorted = msgspec.json.Encoder(order="sorted").encode


@dataclass(frozen=True, slots=True)
class Built:
    payload: bytes  # the exact body sent upstream
    dropped: list[dict[str, Any]]  # what the pairing check removed (a defect somewhere: logged)
    endpoint: str = "chat/completions"  # the upstream path it goes to

    @property
    def sha256(self) -> bytes:
        return hashlib.sha256(self.payload).digest()


class RequestBuilder:
    def __init__(self, tree: TreeStore) -> None:
        self.tree = tree

    async def readable(self, tree_id: uuid.UUID, path: list[PathNode], target: Target) -> list[PathNode]:
        """The path as assembly reads it: chat messages (nodes of Responses calls converted), and a
        compaction in a provider-specific (opaque) form that the target cannot read unfolded --
        assembly follows ``compacted_from`` and uses the original path instead."""
        while path and path[0].kind == "compaction" and path[0].provider != target.provider:
            params = await self.tree.node_params(tree_id, path[0].id)
            if params.get("format", "text") != "opaque" or path[0].compacted_from is None:
                break
            original = await self.tree.path(tree_id, path[0].compacted_from)
            path = original + path[1:]
        return responses_items.message_path(path)

    @staticmethod
    def build(path: Sequence[PathNode], new_items: Sequence[dict[str, Any]], params: dict[str, Any],
              target: Target, *, stream: bool, api: str = "chat") -> Built:
        """The upstream body of a call of ``api`` (the client's) for ``target``: a chat call goes
        to chat completions; a Responses call goes natively to a Responses upstream, or is
        translated for a chat one."""
        assembled = assemble(path, new_items, target)
        if api == "responses" and target.api == "responses":
            body = {**translate.native_params(params), "input": responses_items.to_items(assembled.messages, target.provider)}
            if stream:
                body["stream"] = True
            return Built(_encode_sorted(body), assembled.dropped, "responses")
        messages = responses_items.strip(assembled.messages)
        chat = translate.chat_params(params) if api == "responses" else params
        return Built(build_body(chat, messages, stream=stream), assembled.dropped)

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
                                  compacted_from=r.compacted_from, api=r.api))
        readable = await self.readable(node.tree_id, as_of, target)
        params = dict(node.params)
        new_items = responses_items.to_messages(node.sent, node.provider) if node.api == "responses" else node.sent
        return self.build(readable, new_items, params, target, stream=params.get("stream") is True, api=node.api)
