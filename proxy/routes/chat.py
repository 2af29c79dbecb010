"""``POST /v1/chat/completions`` and ``POST /c/{conversation_id}/v1/chat/completions``.

HTTP only: read the headers, and the body through the chat dialect, hand a ``Call`` to the call lifecycle, return its ASGI
response. Without a conversation id the request is passed through untouched -- to an upstream of
another API (a model only the Responses API serves), translated and answered, nothing stored.
"""

from __future__ import annotations

from typing import Any

from litestar import Request, post
from litestar.di import NamedDependency
from litestar.types import ASGIApp

from ..auth import Caller
from ..call import Call, history_key
from ..dialects.chat import DIALECT as CHAT
from ..dialects.chat.request import parse_chat_history
from ..lifecycle import CallLifecycle
from .common import RequestHeaders, context_mode, decoded_body, node_kind, parent_of, resolve_conversation_id
from .context import CallContext
from .docs import errors
from .passthrough import Forwarder

__all__ = ["chat_completions", "chat_completions_auto", "chat_completions_prefixed"]

async def _chat(request: Request[Any, Any, Any], calls: CallLifecycle, forwarder: Forwarder, caller: Caller,
                path_cid: str | None, *, auto: bool = False) -> ASGIApp:
    """A chat call: stored when it names a conversation (or comes through ``/auto/v1``, which finds
    the conversation by content), passed through otherwise (translated only, for an upstream of
    another API)."""
    headers = RequestHeaders(request.scope)
    cid = resolve_conversation_id(path_cid, headers.get("x-conversation-id"))
    sent = await request.body()
    raw = await decoded_body(request, sent)  # (its Content-Encoding undone: what the proxy reads)
    store = cid is not None or auto
    if not store:
        upstream = forwarder.route(raw)
        if upstream.api == "chat":
            return await forwarder.forward(request, "chat/completions", sent, headers, caller, upstream=upstream,
                                           decoded=raw)

    if store:
        kind = node_kind(headers)
        mode = "full" if auto else context_mode(headers, calls.default_mode)
        parent_mode, parent_id = parent_of(headers, mode)
    else:  # an upstream of another API: translated for it, nothing stored (the headers of a stored call not read)
        kind, mode, parent_mode, parent_id = "turn", "delta", "head", None

    raws = key = None
    if mode == "full":  # each message as sent: what this process saw sent before is not hashed (or checked) again
        def seen(messages: list[bytes]) -> int:
            nonlocal key
            key = history_key(caller.tenant, cid, messages)
            return calls.histories.seen(key, messages)

        body, raws = parse_chat_history(raw, seen)
    else:
        body = CHAT.parse(raw)
    call = Call(
        tenant=caller.tenant,
        conversation_id=cid,
        kind=kind,
        mode=mode,
        parent_mode=parent_mode,
        parent_id=parent_id,
        body=body,
        items=CHAT.items(body),
        params=CHAT.params(body, marked=b"cache_control" in raw, schemas=b'"properties"' in raw),
        stream=body.get("stream") is True,
        client_key=caller.client_key,
        headers=headers.items,
        dialect=CHAT,
        credentials=headers.credentials(),
        raw_items=raws,
        history_key=key,
        store=store,
    )
    return await calls.run(call, request.receive)


_ERRORS = errors(400, 401, 404, 409, 413, 502, 503, 504)


@post("/v1/chat/completions", summary="Chat completion (stored when a conversation id is given)",
      tags=["chat"], status_code=200, responses=_ERRORS)
async def chat_completions(request: Request[Any, Any, Any], call: NamedDependency[CallContext]) -> ASGIApp:
    return await _chat(request, call.calls, call.forwarder, call.caller, None)


@post("/c/{conversation_id:str}/v1/chat/completions", summary="Chat completion in the named conversation",
      tags=["chat"], status_code=200, responses=_ERRORS)
async def chat_completions_prefixed(request: Request[Any, Any, Any], call: NamedDependency[CallContext]) -> ASGIApp:
    return await _chat(request, call.calls, call.forwarder, call.caller, request.path_params["conversation_id"])


@post("/auto/v1/chat/completions", summary="Chat completion, full history, conversation found by content",
      tags=["chat"], status_code=200, responses=_ERRORS)
async def chat_completions_auto(request: Request[Any, Any, Any], call: NamedDependency[CallContext]) -> ASGIApp:
    return await _chat(request, call.calls, call.forwarder, call.caller, None, auto=True)
