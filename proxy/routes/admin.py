"""The admin API (docs/behaviour.md#admin-api): read the tree, move the head, switch branches,
fork, delete, compact, replay a node's request, export and import a tree (``proxy.transfer``).

Same auth as the chat endpoint, scoped to the caller's tenant: an id of another tenant answers 404
exactly like an id that does not exist. Lists use OpenAI's list shape with a ``next_cursor``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar

import msgspec
from litestar import Controller, Request, delete, get, post, put
from litestar.di import NamedDependency, Provide
from litestar.params import FromPath, JSONBody, Parameter
from litestar.response import Stream
from litestar.types import ASGIApp

from storage import AdminStore, ConversationRow, NodeRow, UsageRow, uuid7

from ..admin_objects import (
    Conversation,
    ConversationList,
    Deleted,
    Match,
    Node,
    NodeList,
    NodeOnPath,
    PathList,
    TreeList,
    UsageLine,
    UsageReport,
    conversation_of,
    in_utc,
    node_of,
    tree_node_of,
    usage_window,
)
from ..auth import Caller
from ..builder import RequestBuilder
from ..compaction import Compactor
from ..errors import Conflict, ConversationNotFound, InvalidConversationId, InvalidRequest, NodeNotFound
from ..http import RawResponse
from ..ids import valid_conversation_id
from ..transfer import NotAnExport, export_lines, prepare_import, reverify
from ..upstream import UpstreamClient
from .docs import errors

__all__ = ["AdminController"]

_encode = msgspec.json.Encoder().encode


# -- payloads ---------------------------------------------------------------------------------


class HeadMove(msgspec.Struct, forbid_unknown_fields=True):
    """Body of ``PUT .../head`` and ``POST .../switch``; ``node_id: null`` clears the head."""

    node_id: uuid.UUID | None


class SwitchRequest(msgspec.Struct, forbid_unknown_fields=True):
    node_id: uuid.UUID


class ForkRequest(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    conversation_id: str | None = None
    node_id: uuid.UUID | None = None


class CompactRequest(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """Body of ``POST .../compact`` (optional): how -- a summary, or old tool results cleared."""

    method: str = "summary"


_COMPACT_METHODS = ("summary", "clear_tool_results")


# -- helpers ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reach:
    """Whose data a request may see. Everyone sees their own tenant; an admin key (keys mode)
    names another with ``?tenant=``, and without it lists and node lookups span every tenant."""

    caller: Caller
    tenant: str  # conversations are keyed (tenant, id): this tenant's
    any_tenant: bool = False

    @property
    def node_tenant(self) -> str | None:
        return None if self.any_tenant else self.tenant


def _reach(request: Request[Any, Any, Any], caller: NamedDependency[Caller]) -> Reach:
    if caller.admin:
        named = request.query_params.get("tenant")
        if named and "\x00" in named:  # (no tenant is named so: PostgreSQL's text cannot hold it)
            raise InvalidRequest("tenant must not contain NUL characters", param="tenant")
        return Reach(caller, named or caller.tenant, any_tenant=not named)
    return Reach(caller, caller.tenant)


def _conversation(row: ConversationRow, reach: Reach) -> Conversation:
    return conversation_of(row, show_tenant=reach.caller.admin)


def _cid(value: str) -> str:
    return valid_conversation_id(value, source="conversation_id")


def _node_id(value: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise InvalidRequest("node_id is not a node id (a UUID)", param="node_id") from None


def _encode_cursor(created_at: datetime, cid: str) -> str:
    return base64.urlsafe_b64encode(_encode([created_at.isoformat(), cid])).decode().rstrip("=")


def _decode_cursor(cursor: str) -> tuple[datetime, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created, cid = msgspec.json.decode(raw, type=tuple[str, str])
        moment = datetime.fromisoformat(created)
        if in_utc(moment) is None:  # the database could not be asked for it
            raise ValueError(created)
        return moment, valid_conversation_id(cid, source="cursor")
    except (binascii.Error, ValueError, msgspec.DecodeError, msgspec.ValidationError, InvalidConversationId):
        raise InvalidRequest("invalid cursor", param="cursor") from None


async def _conversation_row(admin: AdminStore, reach: Reach, conversation_id: str) -> ConversationRow:
    row = await admin.conversation(reach.tenant, _cid(conversation_id))
    if row is None:
        raise ConversationNotFound(f"conversation {conversation_id!r} not found")
    return row


async def _moved(move: Callable[[str, str, Any], Awaitable[object]], admin: AdminStore, reach: Reach, conversation_id: str,
                 node_id: uuid.UUID | None) -> Conversation:
    """``PUT .../head`` and ``POST .../switch``: the head moved by ``move`` (``admin.set_head`` or
    ``admin.switch``) from ``node_id``, then the conversation as it is now."""
    await move(reach.tenant, _cid(conversation_id), node_id)
    return _conversation(await _conversation_row(admin, reach, conversation_id), reach)


async def _node_row(admin: AdminStore, reach: Reach, node_id: str) -> NodeRow:
    row = await admin.node(reach.node_tenant, _node_id(node_id))
    if row is None:
        raise NodeNotFound(f"node {node_id} not found", param="node_id")
    return row


_SEARCH_MOST = 2_000  # node hits read at most for one search (each read ranks them all: a few reads at most)


async def _found(admin: AdminStore, reach: Reach, words: str, limit: int) -> ConversationList:
    """The conversations whose messages best match ``words``, each once, at its best node."""
    tenant = None if reach.any_tenant else reach.tenant
    best: dict[tuple[str, str], Any] = {}  # (an admin key's: conversations of one id in several tenants)
    fetch = 5 * limit
    while True:  # several hits may share a conversation: fetch more until ``limit`` conversations or no more
        hits = await admin.search(tenant, words, fetch)
        for hit in hits:
            best.setdefault((hit.tenant, hit.conversation_id), hit)
            if len(best) == limit:
                break
        if len(best) == limit or len(hits) < fetch or fetch >= _SEARCH_MOST:
            break
        best.clear()
        fetch = min(4 * fetch, _SEARCH_MOST)
    out = []
    for (owner, cid), hit in best.items():
        row = await admin.conversation(owner, cid)
        if row is None:  # (deleted meanwhile)
            continue
        found = _conversation(row, reach)
        found.match = Match(node_id=hit.node_id, snippet=hit.snippet, rank=round(hit.rank, 6))
        out.append(found)
    return ConversationList(data=out, next_cursor=None)


# -- routes -----------------------------------------------------------------------------------


class AdminController(Controller):
    path = "/admin"
    tags: ClassVar[list[str]] = ["admin"]
    dependencies: ClassVar[dict[str, Provide]] = {"reach": Provide(_reach, sync_to_thread=False)}

    @get("/conversations", summary="List conversations, newest first", responses=errors())
    async def list_conversations(
        self,
        reach: NamedDependency[Reach],
        admin: NamedDependency[AdminStore],
        limit: int = Parameter(default=20, ge=1, le=100),
        cursor: str | None = Parameter(default=None, max_length=512),
        search: str | None = Parameter(default=None, max_length=256,
                                       description="only ids containing this (case-insensitive)"),
        q: str | None = Parameter(default=None, max_length=256,
                                  description="only conversations whose messages hold these words, best match first "
                                              "(each with its best node and a snippet; no cursor)"),
    ) -> ConversationList:
        for name, value in (("search", search), ("q", q)):
            if value is not None and "\x00" in value:  # no id holds one, and PostgreSQL's text cannot
                raise InvalidRequest(f"{name} must not contain NUL characters", param=name)
        if q is not None and q.strip():
            return await _found(admin, reach, q, limit)
        rows = await admin.conversations(None if reach.any_tenant else reach.tenant,
                                         after=_decode_cursor(cursor) if cursor else None, limit=limit + 1,
                                         search=search)
        page = rows[:limit]
        next_cursor = _encode_cursor(page[-1].created_at, page[-1].id) if len(rows) > limit else None
        return ConversationList(data=[_conversation(r, reach) for r in page], next_cursor=next_cursor)

    @get("/usage", summary="Tokens by model of the calls made in a time range", responses=errors())
    async def usage(
        self,
        reach: NamedDependency[Reach],
        admin: NamedDependency[AdminStore],
        since: str | None = Parameter(default=None, description="from (inclusive; ISO 8601, a date alone is its "
                                      "midnight, no zone is UTC; default: 30 days before until)"),
        until: str | None = Parameter(default=None, description="to (exclusive; as since; default: now)"),
    ) -> UsageReport:
        start, end = usage_window(since, until)
        rows = await admin.usage(None if reach.any_tenant else reach.tenant, start, end)
        lines = [UsageLine(r.model, r.calls, r.prompt_tokens, r.completion_tokens, r.total_tokens, r.cached_tokens,
                           tenant=r.tenant if reach.caller.admin else None) for r in rows]
        total = UsageRow.total_of(rows)
        return UsageReport(since=start, until=end, data=lines, calls=total.calls, prompt_tokens=total.prompt_tokens,
                           completion_tokens=total.completion_tokens, total_tokens=total.total_tokens,
                           cached_tokens=total.cached_tokens)

    @get("/conversations/{conversation_id:str}", summary="One conversation", responses=errors())
    async def get_conversation(self, reach: NamedDependency[Reach], admin: NamedDependency[AdminStore], conversation_id: FromPath[str]) -> Conversation:
        return _conversation(await _conversation_row(admin, reach, conversation_id), reach)

    @delete("/conversations/{conversation_id:str}", status_code=200,
            summary="Delete a conversation (nodes a fork still reaches are kept)", responses=errors())
    async def delete_conversation(self, reach: NamedDependency[Reach], admin: NamedDependency[AdminStore], conversation_id: FromPath[str]) -> Deleted:
        deleted, kept = await admin.delete(reach.tenant, _cid(conversation_id))
        return Deleted(id=conversation_id, deleted=True, nodes_deleted=deleted, nodes_kept=kept)

    @put("/conversations/{conversation_id:str}/head", summary="Move the head (null clears the context)", responses=errors())
    async def put_head(self, reach: NamedDependency[Reach], admin: NamedDependency[AdminStore], conversation_id: FromPath[str], data: JSONBody[HeadMove]) -> Conversation:
        return await _moved(admin.set_head, admin, reach, conversation_id, data.node_id)

    @post("/conversations/{conversation_id:str}/switch", status_code=200,
          summary="Branch arrows: move the head down from a node to its newest leaf", responses=errors())
    async def switch(self, reach: NamedDependency[Reach], admin: NamedDependency[AdminStore], conversation_id: FromPath[str], data: JSONBody[SwitchRequest]) -> Conversation:
        return await _moved(admin.switch, admin, reach, conversation_id, data.node_id)

    @post("/conversations/{conversation_id:str}/fork", status_code=200,
          summary="A new conversation starting at a node of this one (nothing is copied)", responses=errors())
    async def fork(self, reach: NamedDependency[Reach], admin: NamedDependency[AdminStore], conversation_id: FromPath[str],
                   data: JSONBody[ForkRequest | None] = None) -> Conversation:
        data = data or ForkRequest()  # (no body: both fields left out -- a fork at the head, under a new id)
        source = _cid(conversation_id)
        new_id = _cid(data.conversation_id) if data.conversation_id is not None else f"{source[:90]}.fork-{uuid7().hex[-12:]}"
        await admin.fork(reach.tenant, source, new_id, data.node_id)
        return _conversation(await _conversation_row(admin, reach, new_id), reach)

    @post("/conversations/{conversation_id:str}/import", status_code=201, responses=errors(),
          summary="Re-create an export (JSON Lines) as a new conversation of this id (new node ids)")
    async def import_conversation(self, request: Request[Any, Any, Any], reach: NamedDependency[Reach],
                                  admin: NamedDependency[AdminStore], builder: NamedDependency[RequestBuilder],
                                  upstream: NamedDependency[UpstreamClient], conversation_id: FromPath[str]) -> Conversation:
        cid = _cid(conversation_id)
        body = await request.body()
        try:  # (in a thread: a big export takes a while to check, and calls go on meanwhile)
            prepared = await asyncio.to_thread(prepare_import, body)
        except NotAnExport as exc:
            raise InvalidRequest(f"not an export this proxy can import: {exc}", param="body") from None
        await asyncio.to_thread(reverify, prepared, builder, upstream)
        if await admin.import_tree(reach.tenant, cid, prepared.nodes, prepared.head, prepared.compactions,
                                   metadata=prepared.metadata, created_at=prepared.created_at) is None:
            raise Conflict(f"conversation {cid!r} already exists", code="conversation_exists", param="conversation_id")
        return _conversation(await _conversation_row(admin, reach, cid), reach)

    @post("/conversations/{conversation_id:str}/compact", status_code=200, summary="Compact the head path now", responses=errors())
    async def compact(self, request: Request[Any, Any, Any], reach: NamedDependency[Reach], admin: NamedDependency[AdminStore],
                      compactor: NamedDependency[Compactor], conversation_id: FromPath[str]) -> dict[str, Any]:
        raw = await request.body()
        try:
            method = msgspec.json.decode(raw, type=CompactRequest).method if raw.strip() else "summary"
        except msgspec.DecodeError as exc:
            raise InvalidRequest(f"invalid body: {exc}", param="method") from None
        if method not in _COMPACT_METHODS:
            raise InvalidRequest(f"method must be one of {', '.join(_COMPACT_METHODS)}", param="method")
        conv = await _conversation_row(admin, reach, conversation_id)
        result = await compactor.compact_now(conv, reach.caller.client_key, default_model="gpt-4o-mini", method=method)
        return result.as_dict()

    @get("/conversations/{conversation_id:str}/path", summary="The head path, root first, with sibling positions", responses=errors())
    async def head_path(self, reach: NamedDependency[Reach], admin: NamedDependency[AdminStore], conversation_id: FromPath[str]) -> PathList:
        conv = await _conversation_row(admin, reach, conversation_id)
        rows = await admin.path(conv)
        return PathList(
            data=[node_of(r, NodeOnPath, sibling_index=r.sibling_index, sibling_count=r.sibling_count) for r in rows],
            head_node_id=conv.head_node_id,
        )

    @get("/conversations/{conversation_id:str}/export", responses=errors(),
         summary="The whole tree as JSON Lines, oldest first (what `branchpoint conversations import` reads)")
    async def export_conversation(self, reach: NamedDependency[Reach], admin: NamedDependency[AdminStore],
                                  conversation_id: FromPath[str]) -> Stream:
        conv = await _conversation_row(admin, reach, conversation_id)

        return Stream(export_lines(admin, conv), media_type="application/jsonl",
                      headers={"content-disposition": f'attachment; filename="{conv.id}.jsonl"'})

    @get("/conversations/{conversation_id:str}/tree", summary="Every node of the conversation", responses=errors())
    async def whole_tree(self, reach: NamedDependency[Reach], admin: NamedDependency[AdminStore], conversation_id: FromPath[str]) -> TreeList:
        conv = await _conversation_row(admin, reach, conversation_id)
        rows = await admin.tree(conv)
        return TreeList(data=[tree_node_of(r) for r in rows],
                        head_node_id=conv.head_node_id)

    @get("/nodes/{node_id:str}", summary="One node, all fields", responses=errors())
    async def get_node(self, reach: NamedDependency[Reach], admin: NamedDependency[AdminStore], node_id: FromPath[str]) -> Node:
        return node_of(await _node_row(admin, reach, node_id))

    @get("/nodes/{node_id:str}/children", summary="A node's children, oldest first", responses=errors())
    async def node_children(self, reach: NamedDependency[Reach], admin: NamedDependency[AdminStore], node_id: FromPath[str]) -> NodeList:
        row = await _node_row(admin, reach, node_id)
        return NodeList(data=[node_of(r) for r in await admin.children(row)])

    @get("/nodes/{node_id:str}/request", summary="The exact request body sent upstream for this node", responses=errors())
    async def node_request(self, reach: NamedDependency[Reach], admin: NamedDependency[AdminStore], builder: NamedDependency[RequestBuilder], upstream: NamedDependency[UpstreamClient],
                           node_id: FromPath[str]) -> ASGIApp:
        row = await _node_row(admin, reach, node_id)
        if row.kind == "compaction":  # its summariser request, kept with it
            body = await admin.summariser_request(row) or b"{}"
        else:
            path = await admin.path_rows(row.tree_id, row.parent_id) if row.parent_id is not None else []
            body = (await builder.replay(row, path, upstream.replay_target(row.provider, row.model))).payload
        stored = row.request_hash
        verified = "unknown" if stored is None else ("true" if hashlib.sha256(body).digest() == bytes(stored) else "false")
        return RawResponse(200, body, [("x-node-id", str(row.id)), ("x-request-verified", verified)])
