"""The admin API (SPEC §6): read the tree, move the head, switch branches, fork, delete.

Same auth as the chat endpoint, scoped to the caller's tenant: an id of another tenant answers 404
exactly like an id that does not exist. Lists use OpenAI's list shape with a ``next_cursor``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar

import msgspec
from litestar import Controller, Request, delete, get, post, put
from litestar.params import FromPath, JSONBody, Parameter
from litestar.types import ASGIApp

from storage import uuid7
from storage.admin import AdminStore

from ..assembly import Target, assemble, build_body
from ..auth import Caller
from ..errors import (
    Conflict,
    ConversationBusy,
    ConversationNotFound,
    InvalidRequest,
    NodeNotFound,
)
from ..http import RawResponse
from ..services import Services
from .common import RequestHeaders, services, valid_conversation_id
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


class Conversation(msgspec.Struct, omit_defaults=True):
    id: str
    head_node_id: uuid.UUID | None
    node_count: int
    busy: bool
    created_at: datetime
    updated_at: datetime
    object: str
    forked_from: str | None = None  # set on forks
    fork_node_id: uuid.UUID | None = None
    tenant: str | None = None  # shown to admin keys only


class ConversationList(msgspec.Struct):
    data: list[Conversation]
    next_cursor: str | None
    object: str = "list"


class Node(msgspec.Struct):
    id: uuid.UUID
    conversation_id: str
    parent_id: uuid.UUID | None
    kind: str
    status: str
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
    object: str = "node"


class PathNode(Node):
    sibling_index: int = 1
    sibling_count: int = 1


class NodeList(msgspec.Struct):
    data: list[Node]
    next_cursor: str | None = None
    object: str = "list"


class PathList(msgspec.Struct):
    data: list[PathNode]
    head_node_id: uuid.UUID | None
    next_cursor: str | None = None
    object: str = "list"


class TreeNode(msgspec.Struct):
    id: uuid.UUID
    conversation_id: str
    parent_id: uuid.UUID | None
    kind: str
    status: str
    model: str | None
    usage: dict[str, Any] | None
    finish_reason: str | None
    compacted_from: uuid.UUID | None
    created_at: datetime
    preview: str | None
    object: str = "node"


class TreeList(msgspec.Struct):
    data: list[TreeNode]
    head_node_id: uuid.UUID | None
    next_cursor: str | None = None
    object: str = "list"


class Deleted(msgspec.Struct):
    id: str
    deleted: bool
    nodes_deleted: int
    nodes_kept: int
    object: str = "conversation.deleted"


_NODE_FIELDS = tuple(f for f in Node.__struct_fields__ if f != "object")
_TREE_FIELDS = tuple(f for f in TreeNode.__struct_fields__ if f != "object")


def _node(row: Any, cls: type[Node] = Node, **extra: Any) -> Node:
    return cls(**{f: row[f] for f in _NODE_FIELDS}, **extra)


def _conversation(row: Any, scope: Any = None) -> Conversation:
    return Conversation(id=row["id"], head_node_id=row["head_node_id"], node_count=row["node_count"],
                        busy=row["busy"], created_at=row["created_at"], updated_at=row["updated_at"],
                        object="conversation", forked_from=row["forked_from"], fork_node_id=row["fork_node_id"],
                        tenant=row["tenant"] if scope is not None and scope.caller.admin else None)


# -- helpers ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Scope:
    """Whose data a request may see. Everyone sees their own tenant; an admin key (keys mode)
    names another with ``?tenant=``, and without it lists and node lookups span every tenant."""

    caller: Caller
    tenant: str  # conversations are keyed (tenant, id): this tenant's
    any_tenant: bool = False

    @property
    def node_tenant(self) -> str | None:
        return None if self.any_tenant else self.tenant

    # the compactor reads these two like a Caller
    @property
    def client_key(self) -> str | None:
        return self.caller.client_key


def _who(request: Request[Any, Any, Any]) -> tuple[Services, _Scope, AdminStore]:
    s = services(request)
    caller = s.auth(RequestHeaders(request.scope).get("authorization"))
    if caller.admin:
        named = request.query_params.get("tenant")
        scope = _Scope(caller, named or caller.tenant, any_tenant=not named)
    else:
        scope = _Scope(caller, caller.tenant)
    return s, scope, AdminStore(s.db)


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
        return datetime.fromisoformat(created), cid
    except (binascii.Error, ValueError, msgspec.DecodeError, msgspec.ValidationError):
        raise InvalidRequest("invalid cursor", param="cursor") from None


def _refusal(outcome: str, conversation_id: str, node_id: Any = None) -> Exception:
    if outcome == "busy":
        return ConversationBusy(f"conversation {conversation_id!r} has a call in flight; retry when it has finished")
    if outcome == "conversation_not_found":
        return ConversationNotFound(f"conversation {conversation_id!r} not found")
    if outcome == "node_not_found":
        return NodeNotFound(f"node {node_id} is not part of conversation {conversation_id!r}", param="node_id")
    if outcome == "node_pending":
        return Conflict(f"node {node_id} is still in flight", code="node_pending", param="node_id")
    if outcome == "exists":
        return Conflict(f"conversation {conversation_id!r} already exists", code="conversation_exists",
                        param="conversation_id")
    return InvalidRequest(f"refused: {outcome}")


async def _conversation_row(store: AdminStore, tenant: str, conversation_id: FromPath[str]) -> Any:
    row = await store.conversation(tenant, _cid(conversation_id))
    if row is None:
        raise ConversationNotFound(f"conversation {conversation_id!r} not found")
    return row


# -- routes -----------------------------------------------------------------------------------


class AdminController(Controller):
    path = "/admin"
    tags: ClassVar[list[str]] = ["admin"]

    @get("/conversations", summary="List conversations, newest first", responses=errors())
    async def list_conversations(
        self,
        request: Request[Any, Any, Any],
        limit: int = Parameter(default=20, ge=1, le=100),
        cursor: str | None = Parameter(default=None, max_length=512),
    ) -> ConversationList:
        _, caller, store = _who(request)
        rows = await store.conversations(None if caller.any_tenant else caller.tenant,
                                         after=_decode_cursor(cursor) if cursor else None, limit=limit + 1)
        page = rows[:limit]
        next_cursor = _encode_cursor(page[-1]["created_at"], page[-1]["id"]) if len(rows) > limit else None
        return ConversationList(data=[_conversation(r, caller) for r in page], next_cursor=next_cursor)

    @get("/conversations/{conversation_id:str}", summary="One conversation", responses=errors())
    async def get_conversation(self, request: Request[Any, Any, Any], conversation_id: FromPath[str]) -> Conversation:
        _, caller, store = _who(request)
        return _conversation(await _conversation_row(store, caller.tenant, conversation_id), caller)

    @delete("/conversations/{conversation_id:str}", status_code=200,
            summary="Delete a conversation (nodes a fork still reaches are kept)", responses=errors())
    async def delete_conversation(self, request: Request[Any, Any, Any], conversation_id: FromPath[str]) -> Deleted:
        _, caller, store = _who(request)
        outcome = await store.delete(caller.tenant, _cid(conversation_id))
        if outcome.status != "ok":
            raise _refusal(outcome.status, conversation_id)
        return Deleted(id=conversation_id, deleted=True, nodes_deleted=outcome.deleted, nodes_kept=outcome.kept)

    @put("/conversations/{conversation_id:str}/head", summary="Move the head (null clears the context)", responses=errors())
    async def put_head(self, request: Request[Any, Any, Any], conversation_id: FromPath[str], data: JSONBody[HeadMove]) -> Conversation:
        _, caller, store = _who(request)
        outcome = await store.set_head(caller.tenant, _cid(conversation_id), data.node_id)
        if outcome.status != "ok":
            raise _refusal(outcome.status, conversation_id, data.node_id)
        return _conversation(await _conversation_row(store, caller.tenant, conversation_id), caller)

    @post("/conversations/{conversation_id:str}/switch", status_code=200,
          summary="Branch arrows: move the head down from a node to its newest leaf", responses=errors())
    async def switch(self, request: Request[Any, Any, Any], conversation_id: FromPath[str], data: JSONBody[SwitchRequest]) -> Conversation:
        _, caller, store = _who(request)
        outcome = await store.switch(caller.tenant, _cid(conversation_id), data.node_id)
        if outcome.status != "ok":
            raise _refusal(outcome.status, conversation_id, data.node_id)
        return _conversation(await _conversation_row(store, caller.tenant, conversation_id), caller)

    @post("/conversations/{conversation_id:str}/fork", status_code=200,
          summary="A new conversation starting at a node of this one (nothing is copied)", responses=errors())
    async def fork(self, request: Request[Any, Any, Any], conversation_id: FromPath[str], data: JSONBody[ForkRequest]) -> Conversation:
        _, caller, store = _who(request)
        source = _cid(conversation_id)
        new_id = _cid(data.conversation_id) if data.conversation_id is not None else f"{source[:90]}.fork-{uuid7().hex[-12:]}"
        outcome = await store.fork(caller.tenant, source, new_id, data.node_id, data.node_id is None)
        if outcome.status != "ok":
            raise _refusal(outcome.status, new_id if outcome.status == "exists" else source, data.node_id)
        return _conversation(await _conversation_row(store, caller.tenant, new_id), caller)

    @post("/conversations/{conversation_id:str}/compact", status_code=200, summary="Compact the head path now", responses=errors())
    async def compact(self, request: Request[Any, Any, Any], conversation_id: FromPath[str]) -> dict[str, Any]:
        s, caller, store = _who(request)
        conv = await _conversation_row(store, caller.tenant, conversation_id)
        return await s.compactor.compact_now(caller, conv)

    @get("/conversations/{conversation_id:str}/path", summary="The head path, root first, with sibling positions", responses=errors())
    async def head_path(self, request: Request[Any, Any, Any], conversation_id: FromPath[str]) -> PathList:
        _, caller, store = _who(request)
        conv = await _conversation_row(store, caller.tenant, conversation_id)
        rows = await store.path(conv, caller.tenant)
        return PathList(
            data=[_node(r, PathNode, sibling_index=r["sibling_index"], sibling_count=r["sibling_count"]) for r in rows],
            head_node_id=conv["head_node_id"],
        )

    @get("/conversations/{conversation_id:str}/tree", summary="Every node of the conversation", responses=errors())
    async def whole_tree(self, request: Request[Any, Any, Any], conversation_id: FromPath[str]) -> TreeList:
        _, caller, store = _who(request)
        conv = await _conversation_row(store, caller.tenant, conversation_id)
        rows = await store.tree(conv, caller.tenant)
        return TreeList(data=[TreeNode(**{f: r[f] for f in _TREE_FIELDS}) for r in rows],
                        head_node_id=conv["head_node_id"])

    @get("/nodes/{node_id:str}", summary="One node, all fields", responses=errors())
    async def get_node(self, request: Request[Any, Any, Any], node_id: FromPath[str]) -> Node:
        _, caller, store = _who(request)
        return _node(await self._node_row(store, caller, node_id))

    @get("/nodes/{node_id:str}/children", summary="A node's children, oldest first", responses=errors())
    async def node_children(self, request: Request[Any, Any, Any], node_id: FromPath[str]) -> NodeList:
        _, caller, store = _who(request)
        row = await self._node_row(store, caller, node_id)
        return NodeList(data=[_node(r) for r in await store.children(row["tenant"], row["tree_id"], row["id"])])

    @get("/nodes/{node_id:str}/request", summary="The exact request body sent upstream for this node", responses=errors())
    async def node_request(self, request: Request[Any, Any, Any], node_id: FromPath[str]) -> ASGIApp:
        s, caller, store = _who(request)
        row = await self._node_row(store, caller, node_id)
        if row["kind"] == "compaction":  # its summariser request, kept with it
            body = bytes(row["summariser_request"] or b"{}")
        else:
            body = await replay_request(s, store, row)
        stored = row["request_hash"]
        verified = "unknown" if stored is None else ("true" if hashlib.sha256(body).digest() == bytes(stored) else "false")
        return RawResponse(200, body, [("x-node-id", str(row["id"])), ("x-request-verified", verified)])

    @staticmethod
    async def _node_row(store: AdminStore, caller: Caller, node_id: FromPath[str]) -> Any:
        row = await store.node(caller.node_tenant, _node_id(node_id))
        if row is None:
            raise NodeNotFound(f"node {node_id} not found", param="node_id")
        return row


async def replay_request(s: Services, store: AdminStore, row: Any) -> bytes:
    """Rebuild the upstream body of a node: the same assembly over its parent's path as it was
    when the node was created (an ancestor that finished later counted as pending then)."""
    from storage import PathNode as StoredPathNode

    path: list[StoredPathNode] = []
    if row["parent_id"] is not None:
        for r in await store.path_as_of(row["tree_id"], row["parent_id"]):
            status = r["status"]
            if status == "success" and (r["finished_at"] is None or r["finished_at"] > row["created_at"]):
                status = "pending"
            path.append(StoredPathNode(id=r["id"], parent_id=r["parent_id"], kind=r["kind"], status=status,
                                       sent=r["sent"], received=r["received"], provider=r["provider"],
                                       model=r["model"], usage=r["usage"], compacted_from=r["compacted_from"]))
    upstream = next((u for u in s.settings.upstreams if u.name == row["provider"]), None)
    target = Target(row["provider"] or "", upstream.accepts_reasoning if upstream else False)
    params = dict(row["params"])
    assembled = assemble(path, row["sent"], target)
    return build_body(params, assembled.messages, stream=params.get("stream") is True)
