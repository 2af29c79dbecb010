"""What exactly is sent upstream: the one place a call's upstream body is built -- for the live
call and for ``GET /admin/nodes/{id}/request`` alike, so the replay can be checked byte for byte
against the hash stored with the node.

    path (from storage)  ->  readable()  ->  assemble()  ->  build_body()
                             unfold opaque      pure: system rule, pairing,
                             compactions        provider shaping

A live call whose path is in the path cache takes a shortcut with the same result: the kept
nodes' encoded items are spliced into the body (``proxy.splice``). The replay always takes the
long way, so ``/request`` checks the shortcut too.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from storage import NodeRow, PathNode, TreeStore

from .assembly import Target, assemble, build_body
from .responses import for_chat, translate
from .responses import items as responses_items
from .splice import EMPTY, Prefix, Segment, segment, splice

__all__ = ["Built", "RequestBuilder"]


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

    def build(self, path: Sequence[PathNode], new_items: Sequence[dict[str, Any]], params: dict[str, Any],
              target: Target, *, stream: bool, api: str = "chat", tree_id: uuid.UUID | None = None) -> Built:
        """The upstream body of a call of ``api`` (the client's) for ``target``: a chat call goes
        to chat completions, a Responses call to the Responses endpoint -- each translated
        (``proxy.responses``) when the upstream speaks the other API. ``tree_id``: the path is
        the tree's stored chain (as ``readable`` returns it), so kept nodes may be spliced in."""
        if target.api == "responses":
            assembled = assemble(path, new_items, target)
            fields = translate.native_params(params) if api == "responses" else for_chat.request_fields(params)
            body = responses_items.request_body(fields, assembled.messages, target.provider, stream=stream)
            return Built(body, assembled.dropped, "responses")
        chat = translate.chat_params(params) if api == "responses" else params
        if tree_id is not None and path:
            spliced = self._spliced(tree_id, path, new_items, target)
            if spliced is not None:
                messages, dropped = spliced
                return Built(build_body(chat, messages, stream=stream), dropped)
        assembled = assemble(path, new_items, target)
        messages = responses_items.strip(assembled.messages)
        return Built(build_body(chat, messages, stream=stream), assembled.dropped)

    def _spliced(self, tree_id: uuid.UUID, path: Sequence[PathNode], new_items: Sequence[dict[str, Any]],
                 target: Target) -> tuple[list[Any], list[dict[str, Any]]] | None:
        """Messages from the kept nodes' encoded items (``proxy.splice``), or None when a node is
        not kept, the path is not one chain of the tree, or its pairing needs the long way.
        Work is proportional to the nodes since the last path this process spliced in the tree:
        the encoded prefix of the last few paths is kept with their last node."""
        cache = self.tree.cache
        key = (target.provider, target.accepts_reasoning)
        i = len(path) - 1
        prefix: Prefix | None = None
        while i >= 0:
            prefix = cache.tip_memo(tree_id, (path[i].id, key))
            if prefix is not None:
                break
            i -= 1
        start, prefix = (i + 1, prefix) if prefix is not None else (0, EMPTY)
        before: Segment | None = None
        if start > 0:
            entry = cache.entry(tree_id, path[start - 1].id)
            before = entry.memo.get(key) if entry is not None else None
            if before is None:
                return None
        parent = path[start - 1].id if start > 0 else None
        added = 0
        for node in path[start:]:
            entry = cache.entry(tree_id, node.id)
            if entry is None or node.parent_id != parent:
                return None
            seg = entry.memo.get(key)
            if seg is None:
                seg = entry.memo[key] = segment(node, before, target)
                added += 200 + 3 * sum(len(r) for r in seg.tail_raws) + 3 * sum(len(r) for r in seg.settled)
            prefix = prefix.extend(seg.settled)
            before, parent = seg, node.id
        if added:
            cache.charge(tree_id, added)
        assert before is not None
        if start < len(path):
            cache.set_tip_memo(tree_id, (path[-1].id, key), prefix, len(prefix.joined))
        return splice(prefix, before, new_items)

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
