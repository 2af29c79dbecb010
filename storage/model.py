"""What storage hands out: typed rows (msgspec Structs, built from query rows by position) and the
``Outcome`` of a call -- the enum shared with SQL (``nodes.outcome``'s CHECK constraint lists the
same values; ``tests/test_schema.py`` keeps them equal)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import datetime
from enum import StrEnum
from typing import Any, TypeVar

import msgspec

__all__ = [
    "ConversationRow",
    "NodeHit",
    "NodeRow",
    "Outcome",
    "PathNode",
    "PathRow",
    "Pruned",
    "SearchHit",
    "TreeRow",
    "UsageRow",
    "columns",
    "rows",
]


class Outcome(StrEnum):
    """How a call ended -- the row of the failure table that applied (docs/behaviour.md)."""

    SUCCESS = "success"
    TRANSIENT = "transient"  # upstream 5xx/429/408, timeout, connection error, cut stream, disconnect
    OVERFLOW = "overflow"  # the context did not fit
    INVALID = "invalid"  # the request itself was refused (other 4xx)


class PathNode(msgspec.Struct, frozen=True):
    """One node of a path, as assembly reads it (the ``bp_path_node`` SQL type, same order)."""

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
    api: str = "chat"  # the format of sent/received: chat messages, or Responses items


class ConversationRow(msgspec.Struct, frozen=True):
    tenant: str
    id: str
    tree_id: uuid.UUID
    head_node_id: uuid.UUID | None
    forked_from: str | None
    fork_node_id: uuid.UUID | None
    compactions: int
    created_at: datetime
    updated_at: datetime
    metadata: dict[str, str] | None  # the Conversations API's (null: made by a call, never given any)
    busy: bool  # a turn call holds a live lease
    node_count: int  # nodes this conversation made
    prompt_tokens: int  # summed over those nodes' reported usage (input tokens of Responses calls)
    completion_tokens: int  # (output tokens of Responses calls)
    cached_tokens: int  # of the prompt tokens, those a provider's prompt cache served

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class NodeBase(msgspec.Struct, frozen=True):
    """The fields every row of a node begins with (``NodeRow``'s, ``TreeRow``'s)."""

    id: uuid.UUID
    conversation_id: str
    parent_id: uuid.UUID | None
    kind: str
    status: str
    outcome: str | None  # success | transient | overflow | invalid (null while pending)


class NodeFields(NodeBase, frozen=True):
    """A node's call: ``NodeRow`` less what only storage reads (the admin API's node shows these)."""

    sent: list[Any]
    received: list[Any] | None
    model: str | None
    provider: str | None
    params: dict[str, Any]
    usage: dict[str, Any] | None
    finish_reason: str | None
    error: dict[str, Any] | None
    compacted_from: uuid.UUID | None
    depth: int
    created_at: datetime
    finished_at: datetime | None


class NodeRow(NodeFields, frozen=True):
    tenant: str
    tree_id: uuid.UUID
    request_hash: bytes | None
    api: str
    response_deleted: bool


class PathRow(NodeRow, frozen=True):
    """A node of the head path with its place among its siblings (the "2/3" of branch arrows)."""

    sibling_index: int = 1
    sibling_count: int = 1


class TreeRow(NodeBase, frozen=True):
    model: str | None
    usage: dict[str, Any] | None
    finish_reason: str | None
    compacted_from: uuid.UUID | None
    depth: int
    created_at: datetime
    finished_at: datetime | None
    api: str
    method: str | None  # a compaction node's: "summary" or "clear_tool_results"
    preview: str | None


class Pruned(msgspec.Struct, frozen=True):
    """What retention did (``bp_prune``): conversations deleted, their nodes deleted and those kept
    because a fork still reaches them."""

    conversations: int = 0
    deleted: int = 0
    kept: int = 0

    def __add__(self, other: Pruned) -> Pruned:
        return Pruned(self.conversations + other.conversations, self.deleted + other.deleted, self.kept + other.kept)


class SearchHit(msgspec.Struct, frozen=True):
    """A node whose messages hold the words searched for (``AdminStore.search``), and a
    conversation whose context holds it."""

    tenant: str
    conversation_id: str
    node_id: uuid.UUID
    created_at: datetime
    rank: float
    snippet: str


class NodeHit(msgspec.Struct, frozen=True):
    """A search's row: the conversation that made the node, or None when it was deleted (the node
    kept for forks)."""

    tenant: str
    conversation_id: str | None
    node_id: uuid.UUID
    created_at: datetime
    tree_id: uuid.UUID
    rank: float
    snippet: str


class UsageRow(msgspec.Struct, frozen=True):
    """Token usage of one tenant's calls of one model over a time range (``total_of``: of several rows,
    every tenant and model together)."""

    tenant: str
    model: str | None
    calls: int
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0  # of the prompt tokens, those a provider's prompt cache served

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @classmethod
    def total_of(cls, rows: list[UsageRow]) -> UsageRow:
        return cls("", None, sum(r.calls for r in rows), sum(r.prompt_tokens for r in rows),
                   sum(r.completion_tokens for r in rows), sum(r.cached_tokens for r in rows))


S = TypeVar("S", bound=msgspec.Struct)


def columns(struct: type[msgspec.Struct], alias: str, *, skip: Iterable[str] = ()) -> str:
    """``alias.field, ...`` in the struct's field order: a query selects exactly what the struct holds."""
    skipped = set(skip)
    return ", ".join(f"{alias}.{name}" for name in struct.__struct_fields__ if name not in skipped)


def rows(struct: type[S], records: Iterable[Any]) -> list[S]:
    """Structs from query rows whose columns are in the struct's field order."""
    return [struct(*r) for r in records]
