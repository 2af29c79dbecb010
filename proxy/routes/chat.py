"""``POST /v1/chat/completions`` and ``POST /c/{conversation_id}/v1/chat/completions``.

HTTP only: read the headers and body, hand a ``ChatCall`` to the call lifecycle, return its ASGI
response. Without a conversation id the request is passed through untouched.
"""

from __future__ import annotations

from typing import Any

from litestar import Request, post
from litestar.di import NamedDependency
from litestar.types import ASGIApp

from ..assembly import CHAT_ROLES
from ..auth import Caller
from ..errors import InvalidRequest
from ..lifecycle import CallLifecycle, ChatCall
from .common import RequestHeaders, parse_model_request, parse_node_id, resolve_conversation_id
from .context import CallContext
from .docs import errors
from .passthrough import Forwarder

__all__ = ["chat_completions", "chat_completions_auto", "chat_completions_prefixed", "parse_chat_body"]

_KINDS = frozenset({"turn", "transform"})
_MODES = frozenset({"delta", "full"})


def parse_chat_body(raw: bytes) -> dict[str, Any]:
    """The client's body as a dict (every field kept); refuses what cannot be a chat request."""
    body = parse_model_request(raw)
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise InvalidRequest("'messages' is required and must be an array", param="messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InvalidRequest(f"messages[{i}] must be an object", param=f"messages[{i}]")
        role = message.get("role")
        if role not in CHAT_ROLES:
            raise InvalidRequest(f"messages[{i}].role must be one of {sorted(CHAT_ROLES)}", param=f"messages[{i}].role")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise InvalidRequest("'stream' must be a boolean", param="stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise InvalidRequest("'stream_options' must be an object", param="stream_options")
    return body


def _context_mode(headers: RequestHeaders, default: str) -> str:
    value = headers.get("x-context-mode")
    if value is None or not value.strip():
        return default
    mode = value.strip().lower()
    if mode not in _MODES:
        raise InvalidRequest("X-Context-Mode must be 'delta' or 'full'", param="X-Context-Mode")
    return mode


async def _chat(request: Request[Any, Any, Any], calls: CallLifecycle, forwarder: Forwarder, caller: Caller,
                path_cid: str | None, *, auto: bool = False) -> ASGIApp:
    """A chat call: stored when it names a conversation (or comes through ``/auto/v1``, which finds
    the conversation by content), passed through otherwise."""
    headers = RequestHeaders(request.scope)
    cid = resolve_conversation_id(path_cid, headers.get("x-conversation-id"))
    raw = await request.body()
    if cid is None and not auto:
        return await forwarder.forward(request, "chat/completions", raw, headers, caller)

    kind = (headers.get("x-node-kind") or "turn").strip().lower()
    if kind not in _KINDS:
        raise InvalidRequest("X-Node-Kind must be 'turn' or 'transform'", param="X-Node-Kind")
    mode = "full" if auto else _context_mode(headers, calls.default_mode)
    parent_header = headers.get("x-parent-node-id")
    if parent_header is None or not parent_header.strip():
        parent_mode, parent_id = "head", None
    elif mode == "full":
        raise InvalidRequest("X-Parent-Node-Id cannot be used in full-history mode: the messages decide the parent",
                             param="X-Parent-Node-Id")
    elif parent_header.strip().lower() == "root":
        parent_mode, parent_id = "root", None
    else:
        parent_mode, parent_id = "node", parse_node_id(parent_header, param="X-Parent-Node-Id")

    body = parse_chat_body(raw)
    call = ChatCall(
        tenant=caller.tenant,
        conversation_id=cid,
        kind=kind,
        mode=mode,
        parent_mode=parent_mode,
        parent_id=parent_id,
        body=body,
        items=body["messages"],
        stream=body.get("stream") is True,
        client_key=caller.client_key,
        headers=headers.items,
        credentials=headers.credentials(),
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
