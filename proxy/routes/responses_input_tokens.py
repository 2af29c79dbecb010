"""``POST /v1/responses/input_tokens`` (also under ``/c/{id}/v1`` and ``/auto/v1``): the input
tokens a Responses request would send (docs/behaviour.md#the-responses-api).

A request that names state of the proxy's -- a ``previous_response_id`` of ours, a ``conversation``,
or a conversation by path or header -- is counted here, as the call would be assembled: the
stored path (each node's items, its answer when it succeeded) and then the request's own
instructions, input and tools -- an estimate with the proxy's tokenizer, as the Messages API's
count is towards an upstream of another API; the upstream never sees our ids. One that names
none goes to an upstream that speaks the Responses API as it came, and is estimated here for
any other.
"""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request, route
from litestar.di import NamedDependency
from litestar.types import ASGIApp

from storage import NodeRow

from ..assembly import assemble
from ..dialects import message_path
from ..dialects.responses import DIALECT as RESPONSES
from ..dialects.responses import items as responses_items
from ..errors import ConversationNotFound, InvalidRequest, NotFound
from ..http import RawResponse
from ..surrogates import loads
from ..upstream import target_of
from .common import RequestHeaders, decoded_body, resolve_conversation_id
from .context import CallContext
from .docs import errors
from .passthrough import prefix_segments, upstream_path
from .path_items import live_node
from .responses import named_conversation

__all__ = ["responses_input_tokens"]

_encode = msgspec.json.Encoder().encode


async def _stored_path(call: CallContext, body: dict[str, Any], cid: str | None,
                       named_by_path: bool) -> list[NodeRow] | None:
    """The stored path the request continues: its previous response's (one of ours), or its
    conversation's up to the head -- empty for a conversation the path or header names that has no
    call yet (a call there would make it); None when it names no state of ours."""
    previous = body.get("previous_response_id")
    cid = await named_conversation(body.get("conversation"), cid, previous, call.admin, call.caller)
    node_id = responses_items.node_id_of(previous) if isinstance(previous, str) else None
    if node_id is not None:
        node = await live_node(call.admin, call.caller.tenant, node_id)
        if node is None:
            raise NotFound(f"no response {previous!r}", code="response_not_found", param="previous_response_id")
        return await call.admin.path_rows(node.tree_id, node.id)
    if cid is None:
        return None
    conv = await call.admin.conversation(call.caller.tenant, cid)
    if conv is None:
        if named_by_path:
            return []
        raise ConversationNotFound(f"conversation {cid!r} not found", param="conversation")
    return [] if conv.head_node_id is None else await call.admin.path_rows(conv.tree_id, conv.head_node_id)


def _body(raw: bytes) -> dict[str, Any]:
    """The request's JSON object (``model`` is optional here, as in OpenAI's)."""
    try:
        body = loads(raw)
    except (msgspec.DecodeError, RecursionError):
        raise InvalidRequest("the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")
    value = body.get("input")
    if value is not None and not isinstance(value, (str, list)):
        raise InvalidRequest("'input' must be a string or an array of items", param="input")
    if body.get("model") is not None and not isinstance(body["model"], str):
        raise InvalidRequest("'model' must be a string", param="model")
    return body


@route(["/v1/responses/input_tokens", "/c/{conversation_id:str}/v1/responses/input_tokens",
        "/auto/v1/responses/input_tokens"], http_method=["POST"],
       summary="Count a Responses request's input tokens (its stored context included; estimated)",
       tags=["responses"], status_code=200, responses=errors(400, 401, 404, 413, 502, 503, 504))
async def responses_input_tokens(request: Request[Any, Any, Any], call: NamedDependency[CallContext]) -> ASGIApp:
    headers = RequestHeaders(request.scope)
    cid = resolve_conversation_id(request.path_params.get("conversation_id"), headers.get("x-conversation-id"))
    raw = await request.body()
    decoded = await decoded_body(request, raw)
    body = _body(decoded)
    path = await _stored_path(call, body, cid, named_by_path=cid is not None)
    upstream = call.calls.upstream.route(body.get("model"))
    if path is None and upstream.api == "responses":
        return await call.forwarder.forward(request, upstream_path(request.scope, prefix_segments(request.scope)), raw,
                                            headers, call.caller, upstream=upstream, decoded=decoded)
    # as the call would be assembled: the path's items and the request's own, the system rule applied
    own = RESPONSES.read(RESPONSES.items({**body, "input": body.get("input") or []})).messages
    messages = assemble(message_path(path or []), own, target_of(upstream)).messages
    counter = call.calls.compactor.tokens
    tokens = counter.messages(messages)
    if body.get("tools"):
        tokens += counter.text(_encode(body["tools"]).decode())
    return RawResponse(200, _encode({"object": "response.input_tokens", "input_tokens": tokens}))
