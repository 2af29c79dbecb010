"""The admin API's objects (docs/behaviour.md#admin-api): the msgspec shapes of conversations,
nodes, paths, trees and usage reports, how stored rows become them, and the range of a usage
report -- shared by the admin routes (``proxy.routes.admin``) and the command line (an export's
lines, ``branchpoint usage``), so neither reaches into the other."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec

from storage import ConversationRow, NodeRow, TreeRow
from storage.model import NodeFields

from .errors import InvalidRequest

__all__ = [
    "Conversation",
    "ConversationList",
    "Deleted",
    "ExportedConversation",
    "ExportedNode",
    "Node",
    "NodeList",
    "NodeOnPath",
    "PathList",
    "TreeList",
    "TreeNode",
    "Usage",
    "UsageLine",
    "UsageReport",
    "conversation_of",
    "exported",
    "in_utc",
    "node_of",
    "tree_node_of",
    "usage_window",
]


class Usage(msgspec.Struct):
    """Tokens the upstreams reported for every call of a conversation (side calls, failed calls
    that reported usage and compaction's summaries included)."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    cached_tokens: int = 0  # of the prompt tokens, those a provider's prompt cache served


class Match(msgspec.Struct):
    """Where a conversation matched a search (``GET /admin/conversations?q=``): its best node."""

    node_id: uuid.UUID
    snippet: str  # the words found, between « and », with what surrounds them
    rank: float


class Conversation(msgspec.Struct, omit_defaults=True):
    id: str
    head_node_id: uuid.UUID | None
    node_count: int
    busy: bool
    created_at: datetime
    updated_at: datetime
    object: str
    usage: Usage | None = None
    forked_from: str | None = None  # set on forks
    fork_node_id: uuid.UUID | None = None
    tenant: str | None = None  # shown to admin keys only
    match: Match | None = None  # a search's best node in it
    metadata: dict[str, str] | None = None  # the Conversations API's, when it has any


class UsageLine(msgspec.Struct, omit_defaults=True):
    model: str | None
    calls: int
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    cached_tokens: int = 0  # of the prompt tokens, those a provider's prompt cache served
    tenant: str | None = None  # shown to admin keys only


class UsageReport(msgspec.Struct):
    since: datetime
    until: datetime
    data: list[UsageLine]  # by model (and tenant, for an admin key)
    calls: int
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    cached_tokens: int = 0
    object: str = "usage_report"


class ConversationList(msgspec.Struct):
    data: list[Conversation]
    next_cursor: str | None
    object: str = "list"


class Node(NodeFields, frozen=False):  # the stored call's fields, then the API's
    api: str  # the format of sent/received: "chat" messages, or "responses" items
    object: str = "node"
    method: str | None = None  # a compaction node's: "summary" or "clear_tool_results" (context editing)


class NodeOnPath(Node):
    """A node of the head path with its place among its siblings (``storage.PathRow`` shown)."""

    sibling_index: int = 1
    sibling_count: int = 1


class NodeList(msgspec.Struct):
    data: list[Node]
    next_cursor: str | None = None
    object: str = "list"


class _HeadPage(msgspec.Struct):
    """A page of a conversation's nodes and where its head is (``PathList``'s, ``TreeList``'s)."""

    data: list[Any]  # (of the subclass's node)
    head_node_id: uuid.UUID | None
    next_cursor: str | None = None
    object: str = "list"


class PathList(_HeadPage):
    data: list[NodeOnPath]


class TreeNode(TreeRow, frozen=False):  # the stored row as it is
    object: str = "node"


class TreeList(_HeadPage):
    data: list[TreeNode]


class Deleted(msgspec.Struct):
    id: str
    deleted: bool
    nodes_deleted: int
    nodes_kept: int
    object: str = "conversation.deleted"


_NODE_FIELDS = tuple(f for f in Node.__struct_fields__ if f not in ("object", "method"))


def compaction_method(row: NodeRow) -> str | None:
    """How a compaction node was made (None for any other node): "summary" -- also every
    compaction stored before there were two methods -- or "clear_tool_results"."""
    if row.kind != "compaction":
        return None
    method = row.params.get("method") if isinstance(row.params, dict) else None
    return method if isinstance(method, str) else "summary"


def node_of(row: NodeRow, cls: type[Node] = Node, **extra: Any) -> Node:
    """The API's node (or a subclass of it: ``extra`` fills its own fields) of a stored row."""
    return cls(**{f: getattr(row, f) for f in _NODE_FIELDS}, method=compaction_method(row), **extra)


class ExportedConversation(msgspec.Struct, omit_defaults=True):
    """The conversation's own fields, on an export's first line: when it was made, its head and
    how many nodes the export holds as it begins (an import refuses a file cut short), and the
    Conversations API's metadata when it was given any."""

    created_at: datetime
    head_node_id: uuid.UUID | None
    node_count: int
    metadata: dict[str, str] | None = None


class ExportedNode(Node, omit_defaults=False):
    """A line of an export (``GET .../export``, ``branchpoint conversations export``): every field
    of the node, and whether it is the conversation's head -- what an import needs: also whether
    its response was withdrawn, the hash of the request it sent (hex), a compaction's summariser
    request as sent, whether it is a node of the fork's source (``inherited``: its calls counted
    there), and on the first line the conversation's own fields."""

    head: bool = False
    response_deleted: bool = False
    request_hash: str | None = None
    summariser_request: str | None = None
    inherited: bool = False
    conversation: ExportedConversation | None = None


def exported(row: NodeRow, head: uuid.UUID | None, conversation_id: str, *, summariser_request: bytes | None = None,
             conversation: ExportedConversation | None = None) -> ExportedNode:
    return node_of(row, ExportedNode, head=row.id == head,  # type: ignore[return-value]
                   inherited=row.conversation_id != conversation_id, response_deleted=row.response_deleted,
                   request_hash=row.request_hash.hex() if row.request_hash is not None else None,
                   summariser_request=summariser_request.decode("utf-8", "replace") if summariser_request else None,
                   conversation=conversation)


def tree_node_of(row: TreeRow) -> TreeNode:
    return TreeNode(*msgspec.structs.astuple(row))


def conversation_of(row: ConversationRow, *, show_tenant: bool) -> Conversation:
    """The API's conversation of a stored row; its tenant shown to admin keys only."""
    usage = Usage(row.prompt_tokens, row.completion_tokens, row.total_tokens, row.cached_tokens)
    return Conversation(id=row.id, head_node_id=row.head_node_id, node_count=row.node_count, busy=row.busy,
                        created_at=row.created_at, updated_at=row.updated_at, object="conversation", usage=usage,
                        forked_from=row.forked_from, fork_node_id=row.fork_node_id,
                        tenant=row.tenant if show_tenant else None, metadata=row.metadata or None)


def in_utc(moment: datetime) -> datetime | None:
    """``moment`` in UTC (a time without a zone is UTC), or None when it is outside what both a
    Python datetime and PostgreSQL's timestamptz hold: the years 1 to 9999 in UTC (e.g.
    ``9999-12-31T23:59:59-14:00`` is already year 10000 there, which the database would take and
    no reader could read back)."""
    try:
        return (moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)).astimezone(UTC)
    except OverflowError:
        return None


def usage_window(since: datetime | str | None, until: datetime | str | None) -> tuple[datetime, datetime]:
    """The range of a usage report (``GET /admin/usage``'s and ``branchpoint usage``'s): until now and since
    30 days before until, unless given. A query gives ISO 8601 text: a date alone is its midnight, a
    time without a zone is UTC. ``InvalidRequest`` when it is empty or cannot be (text that is no
    such time, or a time outside the years 1 to 9999 in UTC: ``in_utc``)."""
    def aware(moment: datetime | str, param: str) -> datetime:
        if isinstance(moment, str):
            try:
                moment = datetime.fromisoformat(moment.strip())
            except ValueError:
                raise InvalidRequest(f"{param} must be an ISO 8601 date or time, e.g. 2026-12-01 or "
                                     "2026-12-01T09:30:00Z", param=param) from None
        if in_utc(moment) is None:
            raise InvalidRequest(f"{param} is outside the years 1 to 9999 (UTC)", param=param)
        return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)

    end = aware(until, "until") if until is not None else datetime.now(UTC)
    try:
        start = aware(since, "since") if since is not None else end - timedelta(days=30)
    except OverflowError:  # an until in the first days of year 1
        raise InvalidRequest("until is too early", param="until") from None
    if start >= end:
        raise InvalidRequest("since must be before until", param="since")
    return start, end
