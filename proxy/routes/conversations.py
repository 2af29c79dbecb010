"""OpenAI's Conversations API on the tree (docs/behaviour.md#the-conversations-api), under ``/v1``,
``/c/{id}/v1`` and ``/auto/v1``: a conversation object is a Branchpoint conversation (``conv_`` + 32 hex
digits, or any conversation id of ours), its items are the items on its head path.

    POST   /v1/conversations                       a conversation, its items one ``items`` node
    GET    /v1/conversations/{id}                  the object
    POST   /v1/conversations/{id}                  its metadata replaced
    DELETE /v1/conversations/{id}                  as the admin delete
    GET    /v1/conversations/{id}/items            the head path's items, paginated
    POST   /v1/conversations/{id}/items            items appended as one ``items`` node
    GET    /v1/conversations/{id}/items/{item}     one item
    DELETE /v1/conversations/{id}/items/{item}     a new branch without it (nothing removed)

Items added here are stored as nodes of ``kind = 'items'``: ``sent`` the items (Responses items,
``api = 'responses'``), nothing received, no upstream call. Their ids are kept in the node's
params (``_bp_item_ids``) rather than in the items, so the items an upstream later receives are
exactly what the client gave. An item's id is stable: the one it was given (or its node's id and
its place in the node, for items a call stored), carried along when a delete copies its node.
"""

from __future__ import annotations

import uuid
from typing import Any

import msgspec
from litestar import Request, route
from litestar.di import NamedDependency
from litestar.types import ASGIApp

from storage import AdminStore, transcript, uuid7

from ..dialects.responses import DIALECT as RESPONSES
from ..dialects.responses import translate
from ..dialects.responses.checks import item_problem
from ..errors import ConversationNotFound, InvalidRequest, NotFound
from ..http import RawResponse
from ..ids import metadata_problem, valid_conversation_id
from ..surrogates import loads
from .common import decoded_body
from .context import CallContext
from .docs import errors
from .path_items import ITEM_IDS, Item, has_instructions, listed_item, path_items, resolve_compactions
from .responses import resolve_references

__all__ = ["conversation_item", "conversation_items", "conversation_resource", "conversations_create",
           "new_conversation_id"]

_encode = msgspec.json.Encoder().encode

MAX_ITEMS = 20  # items per create (OpenAI's limit)


def new_conversation_id() -> str:
    return f"conv_{uuid7().hex}"


# -- writing ----------------------------------------------------------------------------------------

def _checked_items(value: Any, *, param: str, required: bool) -> list[dict[str, Any]]:
    if value is None and not required:
        return []
    if not isinstance(value, list) or (required and not value):
        raise InvalidRequest(f"{param} must be a {'non-empty ' if required else ''}array of items", param=param)
    if len(value) > MAX_ITEMS:
        raise InvalidRequest(f"{param} holds {len(value)} items; at most {MAX_ITEMS} may be added at once", param=param)
    out = []
    for i, item in enumerate(value):
        if not isinstance(item, dict) or not (isinstance(item.get("type"), str) or "role" in item):
            raise InvalidRequest(f"{param}[{i}] is not an item (an object with a type, or a message with a role)",
                                 param=f"{param}[{i}]")
        if item.get("type") == "item_reference":  # (resolved from the tree by the caller: ``_resolved``)
            if not isinstance(item.get("id"), str) or not item["id"]:
                raise InvalidRequest("an item reference needs the id of a stored item", param=f"{param}[{i}].id")
            out.append(item)
            continue
        if "type" not in item:
            item = {"type": "message", **item}
        if (problem := item_problem(item)) is not None:  # (stored unchecked, it would fail every later call)
            raise InvalidRequest(problem[0], param=f"{param}[{i}]{problem[1]}")
        out.append(item)
    return out


async def _resolved(items: list[dict[str, Any]], call: CallContext, cid: str | None) -> list[dict[str, Any]]:
    """Item references (OpenAI's ``ResponseInputItem`` union, which ``items`` takes, holds them)
    replaced by the stored items they name, as a Responses call's input is -- found as the API
    shows them (a response's item while the response is there; an item of ``cid``'s list), else
    404 ``item_not_found``; nothing is stored then."""
    if not any(item.get("type") == "item_reference" for item in items):
        return items
    if cid is not None and await call.admin.conversation(call.caller.tenant, cid) is None:  # (before it is searched)
        raise ConversationNotFound(f"conversation {cid!r} not found")
    return await resolve_references(items, call.admin, call.caller, cid)


def _checked_metadata(value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    problem = metadata_problem(value)
    if problem is not None:
        raise InvalidRequest(problem[0], param=problem[1])
    return value


def items_node(sent: list[dict[str, Any]], ids: list[str] | None = None, *, node_id: uuid.UUID | None = None,
               params: dict[str, Any] | None = None) -> dict[str, Any]:
    """One ``items`` node as ``bp_add_items`` takes it: its items and their transcript keys (read
    as messages, as a Responses call's items are); ``ids``: the items' ids (made from the node's
    id where not given)."""
    node_id = node_id or uuid7()
    if ids is None:
        ids = [item["id"] if isinstance(item.get("id"), str)
               else translate.input_item_id(item.get("type") or "message", node_id, i) for i, item in enumerate(sent)]
    messages = RESPONSES.read(sent).messages
    return {
        "id": str(node_id), "sent": sent,
        "digests": ["\\x" + d.hex() for d in transcript.digests(messages)],
        "system_hash": None if (h := transcript.system_hash(messages)) is None else "\\x" + h.hex(),
        "answered": any(isinstance(m, dict) and m.get("role") == "assistant" for m in messages),
        "params": {**(params or {}), ITEM_IDS: ids},
    }


# -- the objects ------------------------------------------------------------------------------------

async def _object(admin: AdminStore, tenant: str, cid: str) -> dict[str, Any]:
    found = await admin.conversation_metadata(tenant, cid)
    if found is None:
        raise ConversationNotFound(f"conversation {cid!r} not found", param="conversation_id")
    metadata, created = found
    return {"id": cid, "object": "conversation", "created_at": int(created.timestamp()), "metadata": metadata or {}}


def _json(value: Any) -> RawResponse:
    return RawResponse(200, _encode(value))


async def _body(request: Request[Any, Any, Any]) -> dict[str, Any]:
    raw = await decoded_body(request, await request.body())
    if not raw.strip():
        return {}
    try:
        body = loads(raw)
    except msgspec.DecodeError:
        raise InvalidRequest("the body is not JSON", param="body") from None
    except RecursionError:
        raise InvalidRequest("the body is nested too deeply", param="body") from None
    if not isinstance(body, dict):
        raise InvalidRequest("the body must be a JSON object", param="body")
    return body


def _cid(request: Request[Any, Any, Any]) -> str | None:
    prefix = request.path_params.get("conversation_id")
    if prefix is not None:
        valid_conversation_id(prefix, source="path")
    cid = request.path_params.get("conv")
    if cid is not None:
        valid_conversation_id(cid, source="path")
    return cid


def _page(items: list[dict[str, Any]], query: Any, *, noun: str = "item") -> dict[str, Any]:
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise InvalidRequest("order must be 'asc' or 'desc'", param="order")
    try:
        limit = int(query.get("limit", 20))
    except ValueError:
        raise InvalidRequest("limit must be an integer", param="limit") from None
    if not 1 <= limit <= 100:
        raise InvalidRequest("limit must be between 1 and 100", param="limit")
    if order == "desc":
        items = items[::-1]
    after = query.get("after")
    if after:
        index = next((i for i, item in enumerate(items) if item["id"] == after), None)
        if index is None:
            raise InvalidRequest(f"no {noun} {after!r} in this conversation", param="after")
        items = items[index + 1:]
    page = items[:limit]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": len(items) > limit}


def _list(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {"object": "list", "data": items, "first_id": items[0]["id"] if items else None,
            "last_id": items[-1]["id"] if items else None, "has_more": False}


# -- the routes -------------------------------------------------------------------------------------

_PREFIXES = ("/v1", "/c/{conversation_id:str}/v1", "/auto/v1")  # (every base URL the README gives an SDK)


@route([f"{p}/conversations" for p in _PREFIXES], http_method=["POST"], status_code=200,
       summary="Create a conversation (a Branchpoint conversation; its items one node)", tags=["conversations"],
       responses=errors(400, 401))
async def conversations_create(request: Request[Any, Any, Any], call: NamedDependency[CallContext]) -> ASGIApp:
    _cid(request)
    body = await _body(request)
    metadata = _checked_metadata(body.get("metadata"))
    tenant, admin = call.caller.tenant, call.admin
    items = await _resolved(_checked_items(body.get("items"), param="items", required=False), call, None)
    items = await resolve_compactions(items, admin, tenant, param="items")
    cid = new_conversation_id()
    await admin.add_items(tenant, cid, [items_node(items)] if items else [], create=True, metadata=metadata or {})
    return _json(await _object(admin, tenant, cid))


@route([f"{p}/conversations/{{conv:str}}" for p in _PREFIXES], http_method=["GET", "POST", "DELETE"], status_code=200,
       summary="Retrieve, update (metadata) or delete a conversation", tags=["conversations"],
       responses=errors(400, 401, 404, 409))
async def conversation_resource(request: Request[Any, Any, Any], call: NamedDependency[CallContext]) -> ASGIApp:
    cid = _cid(request)
    assert cid is not None
    tenant, admin = call.caller.tenant, call.admin
    if request.method == "GET":
        return _json(await _object(admin, tenant, cid))
    if request.method == "POST":
        body = await _body(request)
        if "metadata" not in body:
            raise InvalidRequest("metadata is required", param="metadata")
        await admin.set_metadata(tenant, cid, _checked_metadata(body["metadata"]) or {})
        return _json(await _object(admin, tenant, cid))
    await admin.delete(tenant, cid)
    return _json({"id": cid, "object": "conversation.deleted", "deleted": True})


@route([f"{p}/conversations/{{conv:str}}/items" for p in _PREFIXES], http_method=["GET", "POST"], status_code=200,
       summary="List the items on a conversation's head path, or append items (one node)", tags=["conversations"],
       responses=errors(400, 401, 404, 409))
async def conversation_items(request: Request[Any, Any, Any], call: NamedDependency[CallContext]) -> ASGIApp:
    cid = _cid(request)
    assert cid is not None
    tenant, admin = call.caller.tenant, call.admin
    if request.method == "GET":
        _, items, _ = await path_items(admin, tenant, cid)
        return _json(_page([i.listed for i in items if not i.hidden], request.query_params))
    body = await _body(request)
    items = await _resolved(_checked_items(body.get("items"), param="items", required=True), call, cid)
    items = await resolve_compactions(items, admin, tenant, param="items")
    node = items_node(items)
    await admin.add_items(tenant, cid, [node])
    added = [i.listed for i in (await path_items(admin, tenant, cid))[1] if str(i.node.id) == node["id"]]
    if len(added) != len(items):  # (the head moved on meanwhile: the node is not on its path)
        added = [listed_item(item, item_id) for item, item_id in zip(items, node["params"][ITEM_IDS], strict=True)]
    return _json(_list(added))


@route([f"{p}/conversations/{{conv:str}}/items/{{item_id:str}}" for p in _PREFIXES], http_method=["GET", "DELETE"], status_code=200,
       summary="One item of a conversation, or a new branch without it", tags=["conversations"],
       responses=errors(400, 401, 404, 409))
async def conversation_item(request: Request[Any, Any, Any], call: NamedDependency[CallContext]) -> ASGIApp:
    cid = _cid(request)
    assert cid is not None
    tenant, admin = call.caller.tenant, call.admin
    item_id = request.path_params["item_id"]
    conv, items, path = await path_items(admin, tenant, cid)
    index = next((i for i, item in enumerate(items) if item.listed["id"] == item_id and not item.hidden), None)
    if index is None:
        raise NotFound(f"no item {item_id!r} in conversation {cid!r}", code="item_not_found", param="item_id")
    if request.method == "GET":
        return _json(items[index].listed)
    # DELETE: the nodes from the item's node on, made anew without it, beside the old ones
    first = items[index].node
    copies: list[dict[str, Any]] = []
    # every node from `first` to the head (one contributing no item is copied too, empty)
    start = next(i for i, n in enumerate(path) if n.id == first.id)
    by_node: dict[Any, list[Item]] = {}  # (each node's items, grouped once: per node, a scan of them all was quadratic)
    for i in items:
        if i is not items[index]:
            by_node.setdefault(i.node.id, []).append(i)
    for node in path[start:]:
        kept = by_node.get(node.id, [])
        params: dict[str, Any] = {}
        # instructions (context, never an item) stay so in the copy: a call's, or those a summary carried
        carried = next((i for i in kept if i.hidden and isinstance(i.raw.get("content"), str)), None)
        if carried is not None and not has_instructions(node):
            kept.remove(carried)
        # (a summary stays the compaction item it is listed as, which reads as its summary again)
        raws = [i.listed if i.listed.get("type") == "compaction" else i.raw for i in kept]
        if has_instructions(node):
            params["instructions"] = node.params["instructions"]
            sent = [node.sent[0], *raws]
        elif carried is not None:
            params["instructions"] = carried.raw["content"]
            sent = [carried.raw, *raws]
        else:
            sent = raws
        copies.append(items_node(sent, [i.listed["id"] for i in kept], params=params))
    await admin.add_items(tenant, cid, copies, parent=first.parent_id, replace_from=True,
                          expected_head=conv.head_node_id)
    return _json(await _object(admin, tenant, cid))
