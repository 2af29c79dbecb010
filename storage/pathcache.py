"""The path cache (docs/architecture.md#the-path-cache): finished nodes of recently used paths,
kept in this process so that a call reads from the database only the nodes below them.

A finished node never changes (its items, its parent, its outcome), and a path is a chain of
parent links, so the finished part of a path read once stays right for as long as the node
exists. Only nodes whose whole chain up to the root is finished are kept (a pending ancestor
is read again each time until it is finished). Whole trees are evicted, least recently used
first, when the byte budget is exceeded.

The proxy layer hangs derived data off an entry (``Entry.memo``: the encoded upstream form of
the node for one target) and reports its size with ``charge``.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict, deque
from collections.abc import Iterable
from typing import Any

import msgspec

from .model import PathNode

__all__ = ["Entry", "PathCache"]

_encode = msgspec.json.Encoder().encode
_TIPS = 8  # per tree: the deepest nodes of the paths used last -- where the next read stops
_OVERHEAD = 400  # bytes per entry besides its items (the Python objects around them)
_CONVERSATIONS = 100_000  # (tenant, conversation) -> tree ids remembered


class Entry:
    """One finished node; ``memo`` is for derived data (keyed by whoever derives it)."""

    __slots__ = ("memo", "node")

    def __init__(self, node: PathNode) -> None:
        self.node = node
        self.memo: dict[Any, Any] = {}


class _Tree:
    __slots__ = ("entries", "last", "nbytes", "tip_memos", "tips")

    def __init__(self) -> None:
        self.entries: dict[uuid.UUID, Entry] = {}
        self.tips: deque[uuid.UUID] = deque(maxlen=_TIPS)
        self.tip_memos: OrderedDict[Any, tuple[Any, int]] = OrderedDict()
        self.last: tuple[uuid.UUID, list[PathNode]] | None = None  # the last path handed out
        self.nbytes = 0


def _size(node: PathNode) -> int:
    # JSON length times two: decoded dicts and strings take about twice their JSON text
    return _OVERHEAD + 2 * (len(_encode(node.sent)) + (len(_encode(node.received)) if node.received else 0))


class PathCache:
    """Per process, not thread-safe (one event loop). ``max_bytes`` 0 turns it off."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._trees: OrderedDict[uuid.UUID, _Tree] = OrderedDict()
        self._conversations: OrderedDict[tuple[str, str], uuid.UUID] = OrderedDict()
        self.hits = 0  # nodes a call took from the cache instead of the database
        self.reads = 0  # nodes a call read from the database

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def tree(self, tenant: str, conversation_id: str) -> uuid.UUID | None:
        """The tree this conversation was last seen in (None: not remembered) -- where its next
        start is sent first on a distributed schema (storage.tree)."""
        return self._conversations.get((tenant, conversation_id))

    # -- what a read may stop at --------------------------------------------------------------

    def known(self, tenant: str, conversation_id: str | None, parent_id: uuid.UUID | None) -> list[uuid.UUID]:
        """Node ids a path read of this conversation may stop at: the tips of its tree's recent
        paths, and the given parent if it is kept."""
        if not self.enabled or conversation_id is None:
            return []
        tree_id = self._conversations.get((tenant, conversation_id))
        tree = self._trees.get(tree_id) if tree_id is not None else None
        if tree is None:
            return []
        known = list(tree.tips)
        if parent_id is not None and parent_id in tree.entries and parent_id not in known:
            known.append(parent_id)
        return known

    # -- completing a read ---------------------------------------------------------------------

    def complete(self, tenant: str, conversation_id: str, tree_id: uuid.UUID, stop: uuid.UUID | None,
                 rows: list[PathNode]) -> list[PathNode] | None:
        """The whole path (root first): the kept chain ending at ``stop`` (None: ``rows`` start at
        the root), then ``rows``. Keeps what of ``rows`` may be kept. None when the chain is no
        longer kept (evicted meanwhile): read the path again without stopping."""
        self._remember(tenant, conversation_id, tree_id)  # (even when off: where its next start goes, ``tree``)
        if not self.enabled:
            return rows if stop is None else None
        tree = self._trees.get(tree_id)
        if stop is None:
            prefix: list[PathNode] = []
        else:
            chain = self.chain(tree_id, stop)
            if chain is None:
                return None
            prefix = chain
        self.hits += len(prefix)
        self.reads += len(rows)
        if rows:
            tree = self._keep(tree_id, tree, rows)
        path = prefix + rows if prefix else rows
        if tree is not None:
            self._trees.move_to_end(tree_id)
            tip = rows[-1].id if rows else stop
            if tip is not None and tip in tree.entries:  # the whole path is kept
                if tip not in tree.tips:
                    tree.tips.append(tip)
                tree.last = (tip, path)
                path = list(path)  # the caller's copy
        self._evict(keep=tree_id)
        return path

    def chain(self, tree_id: uuid.UUID, node_id: uuid.UUID) -> list[PathNode] | None:
        """The kept path ending at ``node_id``, root first, or None."""
        tree = self._trees.get(tree_id)
        if tree is None:
            return None
        if tree.last is not None and tree.last[0] == node_id:
            return list(tree.last[1])
        entries = tree.entries
        out: list[PathNode] = []
        current: uuid.UUID | None = node_id
        while current is not None:
            entry = entries.get(current)
            if entry is None:
                return None
            out.append(entry.node)
            current = entry.node.parent_id
        out.reverse()
        return out

    def entry(self, tree_id: uuid.UUID, node_id: uuid.UUID) -> Entry | None:
        tree = self._trees.get(tree_id)
        return tree.entries.get(node_id) if tree is not None else None

    def tip_memo(self, tree_id: uuid.UUID, key: Any) -> Any:
        """Derived data about a whole path, kept for the last few paths of a tree only (it grows
        with the path: one per node would be quadratic)."""
        tree = self._trees.get(tree_id)
        found = tree.tip_memos.get(key) if tree is not None else None
        return found[0] if found is not None else None

    def set_tip_memo(self, tree_id: uuid.UUID, key: Any, value: Any, nbytes: int) -> None:
        tree = self._trees.get(tree_id)
        if tree is None:
            return
        old = tree.tip_memos.pop(key, None)
        if old is not None:
            tree.nbytes -= old[1]
            self.nbytes -= old[1]
        tree.tip_memos[key] = (value, nbytes)
        tree.nbytes += nbytes
        self.nbytes += nbytes
        while len(tree.tip_memos) > _TIPS:
            _, (_, size) = tree.tip_memos.popitem(last=False)
            tree.nbytes -= size
            self.nbytes -= size
        self._evict(keep=tree_id)

    def charge(self, tree_id: uuid.UUID, nbytes: int) -> None:
        """Count ``nbytes`` of derived data hung off entries of ``tree_id``."""
        tree = self._trees.get(tree_id)
        if tree is not None:
            tree.nbytes += nbytes
            self.nbytes += nbytes
            self._evict(keep=tree_id)

    def forget(self, tree_id: uuid.UUID) -> None:
        tree = self._trees.pop(tree_id, None)
        if tree is not None:
            self.nbytes -= tree.nbytes

    # -- internals ------------------------------------------------------------------------------

    def _remember(self, tenant: str, conversation_id: str, tree_id: uuid.UUID) -> None:
        key = (tenant, conversation_id)
        self._conversations[key] = tree_id
        self._conversations.move_to_end(key)
        if len(self._conversations) > _CONVERSATIONS:
            self._conversations.popitem(last=False)

    def _keep(self, tree_id: uuid.UUID, tree: _Tree | None, rows: Iterable[PathNode]) -> _Tree | None:
        for node in rows:
            if node.status == "pending":
                break  # below a pending node nothing is kept: its chain is not final
            if tree is None:
                tree = self._trees[tree_id] = _Tree()
            if node.id in tree.entries:
                continue
            if node.parent_id is not None and node.parent_id not in tree.entries:
                break
            tree.entries[node.id] = Entry(node)
            size = _size(node)
            tree.nbytes += size
            self.nbytes += size
        return tree

    def _evict(self, keep: uuid.UUID) -> None:
        while self.nbytes > self.max_bytes and self._trees:
            oldest = next(iter(self._trees))
            if oldest == keep:
                if len(self._trees) == 1:  # one tree above the whole budget: not kept
                    self.forget(oldest)
                    return
                self._trees.move_to_end(oldest)
                continue
            self.forget(oldest)
