"""The Responses API on the tree (docs/behaviour.md#the-responses-api):
``POST /v1/responses`` (also under ``/c/{id}/v1`` and ``/auto/v1``), and ``GET``/``DELETE
/v1/responses/{id}``, ``GET /v1/responses/{id}/input_items`` served from the tree.

A call is stored when it names a conversation (header, path prefix or ``/auto/v1``) or carries the
``previous_response_id`` of a stored response of the caller's tenant; otherwise it passes through.
HTTP only: the call itself is the lifecycle's, like a chat call.
"""

from __future__ import annotations

import uuid
from typing import Any

import msgspec
from litestar import Request, route
from litestar.di import NamedDependency
from litestar.types import ASGIApp

from storage import AdminStore, NodeRow

from ..auth import Caller
from ..call import Call
from ..dialects.responses import DIALECT as RESPONSES
from ..dialects.responses import items as responses_items
from ..dialects.responses import translate
from ..errors import ConversationNotFound, InvalidConversationId, InvalidRequest, NodeNotFound, NotFound
from ..http import RawResponse
from ..ids import valid_conversation_id
from ..lifecycle import CallLifecycle
from .common import RequestHeaders, context_mode, node_kind, resolve_conversation_id
from .context import CallContext
from .docs import errors
from .passthrough import Forwarder, upstream_path

__all__ = ["response_input_items", "response_resource", "responses_create"]

_encode = msgspec.json.Encoder().encode


def _node_of_item(item_id: Any) -> uuid.UUID | None:
    """The node an output item id of ours names (``msg_``/``fc_``/``rs_`` + the node's hex ...)."""
    if not isinstance(item_id, str) or "_" not in item_id:
        return None
    rest = item_id.split("_", 1)[1][:32]
    try:
        return uuid.UUID(hex=rest) if len(rest) == 32 else None
    except ValueError:
        return None


async def _resolve_references(items: list[dict[str, Any]], admin: AdminStore, caller: Caller) -> list[dict[str, Any]]:
    """Input items that reference stored output items (``item_reference``, as clients send when
    they take ``store: true`` at its word) replaced by the items themselves -- the proxy stores
    them, so it resolves them."""
    if not any(i.get("type") == "item_reference" for i in items):
        return items
    found: dict[str, dict[str, Any]] = {}
    for node_id in {_node_of_item(i.get("id")) for i in items if i.get("type") == "item_reference"} - {None}:
        node = await admin.node(caller.tenant, node_id)
        if node is not None and node.api == "responses":
            for item in [*(node.received or []), *node.sent]:
                if isinstance(item, dict) and isinstance(item.get("id"), str):
                    found.setdefault(item["id"], item)
    out = []
    for item in items:
        if item.get("type") == "item_reference":
            if item.get("id") not in found:
                raise NotFound(f"no stored item {item.get('id')!r}", code="item_not_found", param="input")
            item = found[item["id"]]
        out.append(item)
    return out


async def _stored_response(admin: AdminStore, caller: Caller, response_id: str | None) -> NodeRow | None:
    node_id = responses_items.node_id_of(response_id)
    if node_id is None:
        return None
    node = await admin.node(caller.tenant, node_id)
    return None if node is None or node.response_deleted else node


async def _named_conversation(value: Any, cid: str | None, previous: Any, admin: AdminStore, caller: Caller) -> str | None:
    """The conversation a call's ``conversation`` field names (an id, or ``{"id": ...}``): one of
    the caller's conversations -- a ``conv_`` one the Conversations API made, or any other."""
    if value is None:
        return cid
    if previous is not None:
        raise InvalidRequest("conversation and previous_response_id cannot be used together", param="conversation")
    named = value.get("id") if isinstance(value, dict) else value
    if not isinstance(named, str):
        raise InvalidRequest("conversation must be a conversation id or an object with its id", param="conversation")
    valid_conversation_id(named, source="conversation")
    if cid is not None and cid != named:
        raise InvalidConversationId("the conversation of the body and of the path or X-Conversation-Id disagree",
                                    param="conversation")
    if await admin.conversation_metadata(caller.tenant, named) is None:
        raise ConversationNotFound(f"conversation {named!r} not found", param="conversation")
    return named


async def _create(request: Request[Any, Any, Any], calls: CallLifecycle, forwarder: Forwarder, caller: Caller,
                  admin: AdminStore, path_cid: str | None, *, auto: bool = False) -> ASGIApp:
    headers = RequestHeaders(request.scope)
    cid = resolve_conversation_id(path_cid, headers.get("x-conversation-id"))
    raw = await request.body()
    body = RESPONSES.parse(raw)
    previous = body.get("previous_response_id")
    if "conversation" in body:  # OpenAI's conversation state: the call belongs to it, as under /c/{id}/v1
        cid = await _named_conversation(body.pop("conversation"), cid, previous, admin, caller)
    ours = responses_items.node_id_of(previous) is not None  # our ids name nodes; an upstream's do not
    parent = await _stored_response(admin, caller, previous) if ours else None
    if cid is None and not auto and not ours:
        return await forwarder.forward(request, "responses", raw, headers, caller)
    if previous and parent is None:  # another tenant's, deleted, or an upstream's in a stored call
        raise NodeNotFound(f"no stored response {previous!r}", param="previous_response_id")

    kind = node_kind(headers)
    if headers.get("x-parent-node-id"):
        raise InvalidRequest("a Responses call names its parent with previous_response_id", param="X-Parent-Node-Id")
    if parent is not None:  # the parent decides; the conversation is the named one, or the parent's
        mode, parent_mode, parent_id = "delta", "node", parent.id
        cid = cid or parent.conversation_id
    else:
        mode = "full" if auto else context_mode(headers, calls.default_mode)
        parent_mode, parent_id = "head", None
    items = await _resolve_references(RESPONSES.items(body), admin, caller)
    call = Call(
        tenant=caller.tenant, conversation_id=cid, kind=kind, mode=mode, parent_mode=parent_mode, parent_id=parent_id,
        body=body, items=items, stream=body.get("stream") is True, client_key=caller.client_key,
        headers=headers.items, dialect=RESPONSES, credentials=headers.credentials(),
    )
    return await calls.run(call, request.receive)


_ERRORS = errors(400, 401, 404, 409, 413, 502, 503, 504)


@route(["/v1/responses", "/c/{conversation_id:str}/v1/responses", "/auto/v1/responses"], http_method=["POST"],
       summary="Create a response (stored when it names a conversation or continues a stored response)",
       tags=["responses"], status_code=200, responses=_ERRORS)
async def responses_create(request: Request[Any, Any, Any], call: NamedDependency[CallContext]) -> ASGIApp:
    path_cid = request.path_params.get("conversation_id")
    return await _create(request, call.calls, call.forwarder, call.caller, call.admin, path_cid,
                         auto=request.scope["path"].startswith("/auto/"))


def _response_of(node: NodeRow) -> dict[str, Any]:
    """The response object a stored node stands for (a chat node's answer reads as output items)."""
    if node.api == "responses":
        output = list(node.received or [])
        usage = node.usage
    else:
        output = translate.output_items(node.received[0], node.id, node.params.get("tools")) if node.received else []
        usage = translate.usage_of(node.usage)
    status = {"success": "completed", "failed": "failed", "pending": "in_progress"}[node.status]
    error = None
    if node.error:
        error = {"code": node.error.get("code") or "server_error", "message": node.error.get("message") or ""}
    return translate.response_object(node_id=node.id, params=node.params, output=output, usage=usage, status=status,
                                     model=node.model, error=error, finish_reason=node.finish_reason,
                                     instructions=node.params.get("instructions"),
                                     created_at=node.created_at.timestamp())


def _skip_prefix(scope: Any) -> int:
    path = scope["path"]
    return 4 if path.startswith("/c/") else 3 if path.startswith("/auto/") else 2


@route(["/v1/responses/{response_id:str}", "/c/{conversation_id:str}/v1/responses/{response_id:str}",
        "/auto/v1/responses/{response_id:str}"], http_method=["GET", "DELETE", "POST"],
       summary="Retrieve or delete a response (served from the tree)", tags=["responses"], responses=errors(400, 404))
async def response_resource(request: Request[Any, Any, Any], call: NamedDependency[CallContext]) -> ASGIApp:
    forwarder, caller, admin = call.forwarder, call.caller, call.admin
    if request.path_params.get("conversation_id") is not None:
        valid_conversation_id(request.path_params["conversation_id"], source="path")
    response_id = request.path_params["response_id"]
    node_id = responses_items.node_id_of(response_id)
    if node_id is None or request.method == "POST":  # not one of ours (or a sub-resource): the upstream's
        path = upstream_path(request.scope, _skip_prefix(request.scope))
        return await forwarder.forward(request, path, await request.body(), RequestHeaders(request.scope), caller)
    if request.method == "DELETE":
        outcome = await admin.delete_response(caller.tenant, node_id)
        if outcome == "not_found":
            raise NotFound(f"no response {response_id!r}", code="response_not_found", param="response_id")
        return RawResponse(200, _encode({"id": response_id, "object": "response", "deleted": True}))
    node = await _stored_response(admin, caller, response_id)
    if node is None:
        raise NotFound(f"no response {response_id!r}", code="response_not_found", param="response_id")
    return RawResponse(200, _encode(_response_of(node)))


def _input_items(node: NodeRow) -> list[dict[str, Any]]:
    """A stored call's input items, each with an id (made up from the node's where it had none)."""
    sent = list(node.sent)
    if node.api == "responses" and isinstance(node.params.get("instructions"), str) and node.params["instructions"]:
        sent = sent[1:]  # the instructions: not an input item
    items = sent if node.api == "responses" else responses_items.to_items(sent)
    out = []
    for i, item in enumerate(items):
        item = dict(item)
        kind = item.get("type") or ("message" if "role" in item else "item")
        item.setdefault("type", kind)
        item.setdefault("id", f"{'msg' if kind == 'message' else kind}_{node.id.hex}_{i}")
        if kind == "message":
            item.setdefault("status", "completed")
            if isinstance(item.get("content"), str):  # listed items carry content parts
                item["content"] = [{"type": "input_text", "text": item["content"]}]
        out.append(item)
    return out


@route(["/v1/responses/{response_id:str}/input_items", "/c/{conversation_id:str}/v1/responses/{response_id:str}/input_items",
        "/auto/v1/responses/{response_id:str}/input_items"], http_method=["GET"],
       summary="The input items of a response, paginated", tags=["responses"], responses=errors(400, 404))
async def response_input_items(request: Request[Any, Any, Any], call: NamedDependency[CallContext]) -> ASGIApp:
    forwarder, caller, admin = call.forwarder, call.caller, call.admin
    response_id = request.path_params["response_id"]
    if responses_items.node_id_of(response_id) is None:
        path = upstream_path(request.scope, _skip_prefix(request.scope))
        return await forwarder.forward(request, path, b"", RequestHeaders(request.scope), caller)
    node = await _stored_response(admin, caller, response_id)
    if node is None:
        raise NotFound(f"no response {response_id!r}", code="response_not_found", param="response_id")
    query = request.query_params
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise InvalidRequest("order must be 'asc' or 'desc'", param="order")
    try:
        limit = int(query.get("limit", 20))
    except ValueError:
        raise InvalidRequest("limit must be an integer", param="limit") from None
    if not 1 <= limit <= 100:
        raise InvalidRequest("limit must be between 1 and 100", param="limit")
    items = _input_items(node)
    if order == "desc":
        items.reverse()
    after = query.get("after")
    if after:
        ids = [i["id"] for i in items]
        if after not in ids:
            raise InvalidRequest(f"no input item {after!r} in this response", param="after")
        items = items[ids.index(after) + 1:]
    page = items[:limit]
    return RawResponse(200, _encode({"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                                     "last_id": page[-1]["id"] if page else None, "has_more": len(items) > limit}))
