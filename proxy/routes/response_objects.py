"""Stored responses, served from the tree (docs/behaviour.md#the-responses-api):
``GET``/``DELETE /v1/responses/{id}`` and ``GET /v1/responses/{id}/input_items`` (also under
``/c/{id}/v1`` and ``/auto/v1``); an id that is not one of ours goes to the upstream."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request, route
from litestar.di import NamedDependency
from litestar.types import ASGIApp

from storage import AdminStore, NodeRow

from ..auth import Caller
from ..dialects.messages.answers import chat_usage
from ..dialects.responses import items as responses_items
from ..dialects.responses import translate
from ..errors import InvalidRequest, NotFound
from ..http import RawResponse
from ..ids import valid_conversation_id
from .common import RequestHeaders
from .context import CallContext
from .docs import errors
from .passthrough import prefix_segments, upstream_path
from .path_items import answer_items, input_items, live_node

__all__ = ["response_cancel", "response_input_items", "response_of", "response_resource", "stored_response"]

_encode = msgspec.json.Encoder().encode


async def stored_response(admin: AdminStore, caller: Caller, response_id: str | None) -> NodeRow | None:
    node_id = responses_items.node_id_of(response_id)
    if node_id is None:
        return None
    return await live_node(admin, caller.tenant, node_id)


def response_of(node: NodeRow) -> dict[str, Any]:
    """The response object a stored node stands for (a chat node's answer reads as output items)."""
    output = answer_items(node)
    if node.api == "responses":
        usage = node.usage
    else:  # (a Messages node's usage is in Anthropic's terms: its input tokens leave the cache out)
        usage = translate.usage_of(chat_usage(node.usage) if node.api == "messages" else node.usage)
    status = {"success": "completed", "failed": "failed", "pending": "in_progress"}[node.status]
    error = None
    if node.error:
        error = {"code": node.error.get("code") or "server_error", "message": node.error.get("message") or ""}
    return translate.response_object(node_id=node.id, params=node.params, output=output, usage=usage, status=status,
                                     model=node.model, error=error, finish_reason=node.finish_reason,
                                     instructions=node.params.get("instructions"),
                                     created_at=node.created_at.timestamp(),
                                     completed_at=node.finished_at.timestamp() if node.finished_at else None)


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
        path = upstream_path(request.scope, prefix_segments(request.scope))
        return await forwarder.forward(request, path, await request.body(), RequestHeaders(request.scope), caller)
    if request.method == "DELETE":
        outcome = await admin.delete_response(caller.tenant, node_id)
        if outcome == "not_found":
            raise NotFound(f"no response {response_id!r}", code="response_not_found", param="response_id")
        return RawResponse(200, _encode({"id": response_id, "object": "response", "deleted": True}))
    if request.query_params.get("stream", "").lower() in ("true", "1"):
        # (resuming a background response's stream: none runs here -- each is answered as it runs)
        raise InvalidRequest("a response of the proxy's has no stream to resume: every call is answered as it runs "
                             "(background: true included); retrieve it without stream", param="stream")
    node = await stored_response(admin, caller, response_id)
    if node is None:
        raise NotFound(f"no response {response_id!r}", code="response_not_found", param="response_id")
    return RawResponse(200, _encode(response_of(node)))


@route(["/v1/responses/{response_id:str}/cancel", "/c/{conversation_id:str}/v1/responses/{response_id:str}/cancel",
        "/auto/v1/responses/{response_id:str}/cancel"], http_method=["POST"],
       summary="Cancel a background response (an upstream's: passed through)", tags=["responses"],
       responses=errors(400, 404))
async def response_cancel(request: Request[Any, Any, Any], call: NamedDependency[CallContext]) -> ASGIApp:
    """An upstream's response (a pass-through call's) is the upstream's to cancel; one of ours
    never runs in the background, so there is nothing to cancel."""
    if request.path_params.get("conversation_id") is not None:
        valid_conversation_id(request.path_params["conversation_id"], source="path")
    response_id = request.path_params["response_id"]
    if responses_items.node_id_of(response_id) is None:
        path = upstream_path(request.scope, prefix_segments(request.scope))
        return await call.forwarder.forward(request, path, await request.body(), RequestHeaders(request.scope),
                                            call.caller)
    if await stored_response(call.admin, call.caller, response_id) is None:
        raise NotFound(f"no response {response_id!r}", code="response_not_found", param="response_id")
    raise InvalidRequest("only a background response can be cancelled, and the proxy answers every call as it runs",
                         param="response_id")


@route(["/v1/responses/{response_id:str}/input_items", "/c/{conversation_id:str}/v1/responses/{response_id:str}/input_items",
        "/auto/v1/responses/{response_id:str}/input_items"], http_method=["GET"],
       summary="The input items of a response, paginated", tags=["responses"], responses=errors(400, 404))
async def response_input_items(request: Request[Any, Any, Any], call: NamedDependency[CallContext]) -> ASGIApp:
    forwarder, caller, admin = call.forwarder, call.caller, call.admin
    response_id = request.path_params["response_id"]
    if responses_items.node_id_of(response_id) is None:
        path = upstream_path(request.scope, prefix_segments(request.scope))
        return await forwarder.forward(request, path, b"", RequestHeaders(request.scope), caller)
    node = await stored_response(admin, caller, response_id)
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
    items = [item.listed for item in await input_items(admin, node)]
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
