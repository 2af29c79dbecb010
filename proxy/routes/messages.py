"""Anthropic's Messages API on the tree (docs/behaviour.md#the-messages-api): ``POST /v1/messages``
(also under ``/c/{id}/v1`` and ``/auto/v1``) and ``POST /v1/messages/count_tokens``.

A call is stored when it names a conversation (header or path prefix) or comes through
``/auto/v1``. One that names none is not stored: it passes through to an Anthropic upstream
untouched, and towards an upstream of another API it is translated both ways and nothing else
(``Call.store``). HTTP only: the call itself is the lifecycle's. Errors are Anthropic-shaped
(``proxy.app`` shapes those raised before the call starts).
"""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request, route
from litestar.di import NamedDependency
from litestar.types import ASGIApp

from ..assembly import Target, assemble
from ..call import Call
from ..compaction import Edits
from ..dialects import crossing, signed
from ..dialects.messages import DIALECT as MESSAGES
from ..dialects.messages.blocks import to_messages
from ..dialects.messages.errors import ANTHROPIC_ERRORS
from ..dialects.messages.request import clearing_edit
from ..http import RawResponse
from ..surrogates import encode
from ..upstream import target_of
from .common import RequestHeaders, context_mode, decoded_body, node_kind, parent_of, resolve_conversation_id
from .context import CallContext
from .docs import errors

__all__ = ["messages_count_tokens", "messages_create"]

_encode = msgspec.json.Encoder().encode


# A message thread (Anthropic's beta: the server holds the conversation, each request sends only
# what is new) on a stored call: the tree holds the conversation, never the upstream -- as a
# Responses upstream never stores (store: false) -- and a thread over a translating upstream has
# nowhere to live. Refused as Anthropic refuses a request Threads do not support: the SDKs then
# send the whole conversation without ``thread`` (their default), which every mode reads.
_THREAD_REFUSED = _encode({"type": "error", "error": {
    "type": "invalid_request_error", "details": {"error_code": "thread_unsupported_request"},
    "message": "message threads are not served here: the proxy keeps the conversation itself -- send the whole "
               "conversation without 'thread' (or name a conversation and send only what is new, without 'thread')"}})


def _anthropic_upstream(call: CallContext, body: dict[str, Any]) -> bool:
    return call.calls.upstream.route(body.get("model")).api == "anthropic"


async def _create(request: Request[Any, Any, Any], call: CallContext) -> ASGIApp:
    headers = RequestHeaders(request.scope)
    path_cid = request.path_params.get("conversation_id")
    cid = resolve_conversation_id(path_cid, headers.get("x-conversation-id"))
    auto = request.scope["path"].startswith("/auto/")
    raw = await request.body()
    decoded = await decoded_body(request, raw)
    body = MESSAGES.parse(decoded)
    store = cid is not None or auto
    native = _anthropic_upstream(call, body)
    if not store and native:
        if b"bp-signed:" in decoded and signed.without_ours(body):  # (our pieces: no upstream's to take)
            decoded = encode(body)
        return await call.forwarder.forward(request, "messages", raw, headers, call.caller, errors=ANTHROPIC_ERRORS,
                                            decoded=decoded)
    if body.get("thread") is not None:  # stored, or translated: no upstream holds the thread (docs/behaviour.md#the-messages-api)
        return RawResponse(400, _THREAD_REFUSED)
    # (an Anthropic upstream carries out the request's context_management itself; another, the proxy)
    edit = None if native or not store else clearing_edit(body)
    if store:
        kind = node_kind(headers)
        mode = "full" if auto else context_mode(headers, call.calls.default_mode)
        parent_mode, parent_id = parent_of(headers, mode)
    else:  # (a stored call's headers mean nothing without a conversation: not read, as a pass-through does not)
        kind, mode, parent_mode, parent_id = "turn", "delta", "head", None
    stored = Call(
        tenant=call.caller.tenant, conversation_id=cid, kind=kind, mode=mode, parent_mode=parent_mode,
        parent_id=parent_id, body=body, items=MESSAGES.items(body), stream=body.get("stream") is True,
        client_key=call.caller.client_key, headers=headers.items, dialect=MESSAGES, credentials=headers.credentials(),
        query=request.scope.get("query_string") or b"", store=store, edits=Edits(**edit) if edit else None,
    )
    return await call.calls.run(stored, request.receive)


_ERRORS = errors(400, 401, 404, 409, 413, 502, 503, 504, anthropic=True)


@route(["/v1/messages", "/c/{conversation_id:str}/v1/messages", "/auto/v1/messages"], http_method=["POST"],
       summary="Create a message (Anthropic's Messages API; stored when it names a conversation, or under /auto/v1)",
       tags=["messages"], status_code=200, responses=_ERRORS)
async def messages_create(request: Request[Any, Any, Any], call: NamedDependency[CallContext]) -> ASGIApp:
    return await _create(request, call)


async def _delta_context(call: CallContext, request: Request[Any, Any, Any], headers: RequestHeaders,
                         body: dict[str, Any], target: Target) -> tuple[list[Any], list[dict[str, Any]]] | None:
    """What a delta call of a named conversation would send: (its stored path up to the head --
    none for ``X-Parent-Node-Id: root`` --, the request's own messages as chat messages); None
    when the request names no conversation, is counted as it came (full history: it holds its
    history; ``/auto/v1``), or names a parent node (counted as it came)."""
    cid = resolve_conversation_id(request.path_params.get("conversation_id"), headers.get("x-conversation-id"))
    if cid is None or request.scope["path"].startswith("/auto/") \
            or context_mode(headers, call.calls.default_mode) != "delta":
        return None
    parent_mode, _ = parent_of(headers, "delta")
    if parent_mode == "node":
        return None
    own = MESSAGES.to_messages(MESSAGES.items(body), target.provider)
    conv = await call.admin.conversation(call.caller.tenant, cid)
    if conv is None or conv.head_node_id is None or parent_mode == "root":
        return [], own
    builder = call.calls.builder
    path = await builder.tree.path(conv.tree_id, conv.head_node_id, tenant=call.caller.tenant)
    if not path:
        return None
    return await builder.readable(conv.tree_id, path, target, tenant=call.caller.tenant), own


@route(["/v1/messages/count_tokens", "/c/{conversation_id:str}/v1/messages/count_tokens",
        "/auto/v1/messages/count_tokens"], http_method=["POST"],
       summary="Count a Messages request's input tokens (an Anthropic upstream's count; estimated otherwise)",
       tags=["messages"], status_code=200, responses=errors(400, 401, 404, 413, 502, 503, 504, anthropic=True))
async def messages_count_tokens(request: Request[Any, Any, Any], call: NamedDependency[CallContext]) -> ASGIApp:
    """A delta call of a named conversation sends only what is new: what it counts is what the
    call would send -- the stored context and its own messages, assembled as for the call (to an
    Anthropic upstream the request so built goes to its count; otherwise estimated)."""
    headers = RequestHeaders(request.scope)
    raw = await request.body()
    decoded = await decoded_body(request, raw)
    body = MESSAGES.parse(decoded)
    upstream = call.calls.upstream.route(body.get("model"))
    target = target_of(upstream, call.calls.upstream.max_output(body.get("model")))
    context = await _delta_context(call, request, headers, body, target)
    if context is not None:
        path, own = context
        way = crossing(MESSAGES, upstream.api)
        if way.native:
            built = call.calls.builder.build(path, own, MESSAGES.params(body), target, stream=False, way=way)
            return await call.forwarder.forward(request, "messages/count_tokens", raw, headers, call.caller,
                                                errors=ANTHROPIC_ERRORS, decoded=built.payload)
        return _estimated(call, assemble(path, own, target).messages, body)
    if upstream.api == "anthropic":
        if b"bp-signed:" in decoded and signed.without_ours(body):  # (as a call passed through: none of ours)
            decoded = encode(body)
        return await call.forwarder.forward(request, "messages/count_tokens", raw, headers, call.caller,
                                          errors=ANTHROPIC_ERRORS, decoded=decoded)
    return _estimated(call, to_messages(MESSAGES.items(body)), body)


def _estimated(call: CallContext, messages: list[dict[str, Any]], body: dict[str, Any]) -> RawResponse:
    """The proxy's own estimate of a request's input tokens: its messages and its tools."""
    counter = call.calls.compactor.tokens
    tokens = counter.messages(messages)
    if body.get("tools"):
        tokens += counter.text(_encode(body["tools"]).decode())
    return RawResponse(200, _encode({"input_tokens": tokens}))
