"""What exactly is sent upstream: the one place a call's upstream body is built -- for the live
call and for ``GET /admin/nodes/{id}/request`` alike, so the replay can be checked byte for byte
against the hash stored with the node.

    path (from storage)  ->  readable()  ->  assemble()  ->  build_body()
                             unfold opaque      pure: system rule, pairing,
                             compactions        provider shaping

A live call whose path is in the path cache takes a shortcut with the same result: the kept
nodes' encoded items are spliced into the body (``proxy.splice``). The replay always takes the
long way, so ``/request`` checks the shortcut too. A chat client's ``cache_control`` markers are
the call's own only (``dialects.chat.markers``): a call that has some, or a path that holds an
earlier call's, takes the long way.

What a call assembles is bounded (docs/behaviour.md#limits-and-hostile-peers): ``readable``
counts the path's size (about its JSON's) against ``[server] max_bytes_in_flight`` for the rest of
the request -- waiting for room like a large body, else 503 ``server_busy`` --, and ``build``
refuses (413 ``payload_too_large``) a request that would be larger than that bound by itself.
A finished path's size is measured once (``path_size``: nodes never change).
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from storage import NodeRow, PathNode, TreeStore

from .assembly import READABLE_REASONING, SYSTEM_AT, Target, assemble, build_body, unkept
from .dialects import INHERITED, Crossing, crossing, dialect, message_path
from .dialects.chat.markers import MARKERS as CHAT_MARKERS
from .dialects.chat.markers import apply_markers
from .limits import ContextTooLarge, bytes_bound, hold
from .splice import EMPTY, Prefix, Segment, segment, splice

__all__ = ["Built", "RequestBuilder", "path_weight", "weight"]


@dataclass(frozen=True, slots=True)
class Built:
    payload: bytes  # the exact body sent upstream
    dropped: list[dict[str, Any]]  # what the pairing check removed (a defect somewhere: logged)
    endpoint: str = "chat/completions"  # the upstream path it goes to
    # what the history added to the call's params (``Crossing.history_params``): its answer is read with them too
    history: dict[str, Any] = field(default_factory=dict)

    @property
    def sha256(self) -> bytes:
        return hashlib.sha256(self.payload).digest()


def _messages(path: Sequence[PathNode], new_items: Sequence[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """The messages of a call's history as assembly reads them (path first, then its new ones)."""
    for node in path:
        yield from node.sent
        if node.status == "success" and node.received:
            yield from node.received
    yield from new_items


def weight(items: Any) -> int:
    """About the bytes of ``items`` as JSON (characters of strings and keys, a few per scalar and
    container), walked without recursion."""
    total = 0
    stack = [items]
    while stack:
        value = stack.pop()
        t = type(value)
        if t is str:
            total += len(value) + 2
        elif t is dict:
            total += 2
            for k, v in value.items():
                total += len(k) + 4 if type(k) is str else 8
                stack.append(v)
        elif t is list or t is tuple:
            total += 2 + len(value)
            stack.extend(value)
        else:
            total += 8
    return total


def path_weight(path: Sequence[PathNode]) -> int:
    """About the bytes ``path`` adds to a request (``RequestBuilder.path_size``, unremembered)."""
    return sum(weight(n.sent) + (weight(n.received) if n.status == "success" and n.received else 0) for n in path)


def _as_of(node: NodeRow, path: Sequence[NodeRow]) -> list[PathNode]:
    """``path`` as it was when ``node`` was created: an ancestor that finished later pending."""
    as_of = []
    for r in path:
        status = r.status
        if status == "success" and (r.finished_at is None or r.finished_at > node.created_at):
            status = "pending"
        as_of.append(PathNode(id=r.id, parent_id=r.parent_id, kind=r.kind, status=status, sent=r.sent,
                              received=r.received, provider=r.provider, model=r.model, usage=r.usage,
                              compacted_from=r.compacted_from, api=r.api))
    return as_of


_SIZES_KEPT = 50_000  # path sizes remembered (then forgotten all at once)


class RequestBuilder:
    def __init__(self, tree: TreeStore) -> None:
        self.tree = tree
        self._sizes: dict[tuple[uuid.UUID, uuid.UUID], int] = {}  # (first node, node) -> the path's size up to it

    def path_size(self, path: Sequence[PathNode]) -> int:
        """About the bytes ``path`` adds to a request: each node's ``sent``, and its ``received``
        when it succeeded (as assembly reads them). A finished path never changes, so the size up
        to each of its nodes is remembered (keyed by the path's first node and that node: an
        unfolded compaction starts elsewhere): a call measures only the nodes since the last one
        measured in its tree -- one or two, not the whole path."""
        if not path:
            return 0
        sizes = self._sizes
        root = path[0].id
        i = len(path)
        total = 0
        while i > 0:
            known = sizes.get((root, path[i - 1].id))
            if known is not None:
                total = known
                break
            i -= 1
        finished = True  # (what follows a pending node may still change: not remembered)
        for node in path[i:]:
            total += weight(node.sent)
            if node.status == "success" and node.received:
                total += weight(node.received)
            if node.status == "pending":
                finished = False
            if finished:
                if len(sizes) >= _SIZES_KEPT:
                    sizes.clear()
                sizes[(root, node.id)] = total
        return total

    async def readable(self, tree_id: uuid.UUID, path: list[PathNode], target: Target, *, tenant: str) -> list[PathNode]:
        """The path as assembly reads it: chat messages (nodes of other dialects converted), and a
        compaction in a provider-specific (opaque) form that the target cannot read unfolded --
        assembly follows ``compacted_from`` and uses the original path instead."""
        while path and path[0].kind == "compaction" and path[0].provider != target.provider:
            params = await self.tree.node_params(tree_id, path[0].id)
            if params.get("format", "text") != "opaque" or path[0].compacted_from is None:
                break
            original = await self.tree.path(tree_id, path[0].compacted_from, tenant=tenant)
            path = original + path[1:]
        path = message_path(path)
        await hold(self.path_size(path))  # (the path is the call's to hold until its request ends)
        return path

    def build(self, path: Sequence[PathNode], new_items: Sequence[dict[str, Any]], params: dict[str, Any],
              target: Target, *, stream: bool, way: Crossing | None = None, tree_id: uuid.UUID | None = None) -> Built:
        """The upstream body of a call for ``target``: the request's other fields as the
        upstream's dialect takes them (``way``: translated when the client speaks another; default
        a chat client's),
        and the assembled messages in its format. ``tree_id``: the path is the tree's stored
        chain (as ``readable`` returns it), so kept nodes may be spliced in -- towards a chat
        upstream, whose messages are the path cache's own encoding."""
        bound = bytes_bound()
        if bound:
            size = self.path_size(path) + weight(new_items)
            if size > bound:
                raise ContextTooLarge(size, bound)
        way = way or crossing("chat", target.api)
        upstream = way.upstream
        new_items = unkept(list(new_items), target)  # (what a client's resent answer kept: to its producer only)
        history = way.history_params(params, _messages(path, new_items))
        if history:
            params = {**params, **history}
        fields = way.fields(params, max_output=target.max_output)
        system_at = params.get(SYSTEM_AT)  # (a full-history call's system messages: where it had them)
        marked = params.get(CHAT_MARKERS)  # (a chat client's cache_control markers: the call's own only)
        # (a client's own edit of its reasoning -- Messages' clear_thinking -- where reasoning goes back)
        thinking_turns = way.reasoning_turns(params, accepts_reasoning=target.accepts_reasoning)
        if upstream.name == "chat" and tree_id is not None and path and not system_at and marked is None \
                and thinking_turns is None:
            spliced = self._spliced(tree_id, path, new_items, target, system_at)
            if spliced is not None:
                messages, dropped = spliced
                return Built(build_body(fields, messages, stream=stream), dropped, upstream.endpoint, history)
        assembled = assemble(path, new_items, target, system_at)
        # (a chat client's markers are its call's own; towards a chat upstream no stored one is sent,
        # whichever client continues the path: only chat clients' calls store them)
        chat_markers = way.client.name == "chat" or upstream.name == "chat"
        messages = apply_markers(assembled.messages, marked or ()) if chat_markers else assembled.messages
        if thinking_turns is not None:
            messages = _without_old_reasoning(messages, thinking_turns)
        return Built(upstream.request_body(fields, messages, target.provider, stream=stream), assembled.dropped,
                     upstream.endpoint, history)

    def _spliced(self, tree_id: uuid.UUID, path: Sequence[PathNode], new_items: Sequence[dict[str, Any]],
                 target: Target, system_at: Sequence[int] | None = None) -> tuple[list[Any], list[dict[str, Any]]] | None:
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
        return splice(prefix, before, new_items, system_at=system_at)

    async def replay(self, node: NodeRow, path: Sequence[NodeRow], target: Target) -> Built:
        """Rebuild the body sent for ``node`` from the path of its parent (``path``, root first) as
        it was when the node was created: an ancestor that finished later counted as pending."""
        readable = await self.readable(node.tree_id, _as_of(node, path), target, tenant=node.tenant)
        return self._rebuilt(node, readable, target)

    def replay_unstored(self, node: NodeRow, path: Sequence[NodeRow], target: Target) -> Built:
        """``replay`` for a node not stored yet (an import's, whose request hash is checked before
        it is written): the path read as given -- an opaque compaction is not unfolded -- and
        nothing held against the bytes in flight."""
        return self._rebuilt(node, message_path(_as_of(node, path)), target)

    def _rebuilt(self, node: NodeRow, readable: Sequence[PathNode], target: Target) -> Built:
        params = {k: v for k, v in node.params.items() if k != INHERITED}  # (an import's mark: never sent)
        client = dialect(node.api)
        return self.build(readable, client.to_messages(node.sent, node.provider), params, target,
                          stream=params.get("stream") is True, way=crossing(client, target.api))


def _without_old_reasoning(messages: list[Any], turns: int) -> list[Any]:
    """``messages`` (a chat request's) with the readable reasoning of every assistant message but
    the ``turns`` most recent that hold some left out -- Anthropic's ``clear_thinking`` edit (its
    ``thinking_turns``: assistant turns with thinking), carried out for a chat upstream that takes
    reasoning back."""
    holding = [i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "assistant"
               and any(m.get(k) for k in READABLE_REASONING)]
    cleared = set(holding[:max(0, len(holding) - turns)])
    return [{k: v for k, v in m.items() if k not in READABLE_REASONING} if i in cleared else m
            for i, m in enumerate(messages)]
