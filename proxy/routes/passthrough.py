"""Pass-through: every other ``/v1/*`` route (models, embeddings, ...), also under the
``/c/{id}`` prefix, and chat calls without a conversation id -- relayed by the ``Forwarder``
(``proxy.forwarder``). Nothing is parsed beyond the model name (to pick the upstream) and nothing
is stored."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import unquote

from litestar import Request, route
from litestar.di import NamedDependency
from litestar.types import ASGIApp

from ..auth import Caller
from ..errors import InvalidRequest
from ..forwarder import Forwarder
from ..ids import valid_conversation_id
from .common import RequestHeaders, decoded_body
from .context import CallContext

__all__ = [
    "Forwarder",  # its home is proxy.forwarder; named here for the routes that still import it from here
    "chat_completions_list",
    "chat_completions_list_auto",
    "chat_completions_list_prefixed",
    "chat_completions_sub_prefixed",
    "passthrough",
    "passthrough_auto",
    "passthrough_prefixed",
]

_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]


def prefix_segments(scope: Any) -> int:
    """How many segments of a request's path are the proxy's own before the upstream's path:
    ``/v1`` (2 with the empty first), ``/auto/v1`` (3) or ``/c/{id}/v1`` (4) -- what
    ``upstream_path`` skips. A doubled slash (an empty segment) is none of them, as the router
    reads the path."""
    first = next((part for part in scope["path"].split("/") if part), "")
    return 4 if first == "c" else 3 if first == "auto" else 2


def upstream_path(scope: Any, skip: int) -> str:
    """The path to forward: the request's raw (still percent-encoded) path after its first ``skip``
    segments -- forwarded as it came, never decoded and re-encoded. It must stay under the
    upstream's base path: a ``.`` or ``..`` segment (encoded once, twice or not at all, or hidden
    behind an encoded slash or a backslash, or carrying a path parameter: servers in Java read
    ``..;x`` as ``..``) or a control character is refused, and nothing is sent. The segments
    skipped are counted as the router matched them: empty ones (a doubled slash, ``/c/{id}//v1``)
    are passed over, so no segment of the proxy's own reaches the upstream."""
    raw = (scope.get("raw_path") or scope["path"].encode()).decode("latin-1")
    segments = raw.split("?", 1)[0].split("/")
    at, own = 0, skip - 1  # (the first segment, before the path's leading slash, is empty)
    while at < len(segments) and (own or not segments[at]):
        own -= bool(segments[at])
        at += 1
    rest = segments[at:]
    for segment in rest:
        text = segment
        for _ in range(3):  # %252e%252e -> %2e%2e -> ..
            decoded = unquote(text)
            if decoded == text:
                break
            text = decoded
        if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in text):
            raise InvalidRequest("the path contains a control character", param="path")
        if any(part.split(";", 1)[0] in (".", "..") for part in re.split(r"[/\\]", text)):
            raise InvalidRequest("the path may not contain '.' or '..' segments", param="path")
    return "/".join(rest)


async def _passthrough(request: Request[Any, Any, Any], forwarder: Forwarder, caller: Caller, skip: int,
                       prefix_cid: str | None) -> ASGIApp:
    if prefix_cid is not None:
        valid_conversation_id(prefix_cid, source="path")
    path = upstream_path(request.scope, skip)
    body = await request.body()
    decoded = None
    if request.headers.get("content-encoding"):  # (read for the model it names: routed by it, and sent so)
        try:
            decoded = await decoded_body(request, body)
        except InvalidRequest as exc:
            if exc.status != 415:
                raise
            # (a coding the proxy does not undo: sent as it came, to the default upstream)
    return await forwarder.forward(request, path, body, RequestHeaders(request.scope), caller, decoded=decoded)


@route("/v1/{path:path}", http_method=_METHODS, summary="Pass-through to the upstream", tags=["pass-through"],
       include_in_schema=False)
async def passthrough(request: Request[Any, Any, Any], call: NamedDependency[CallContext]) -> ASGIApp:
    return await _passthrough(request, call.forwarder, call.caller, 2, None)  # /v1/...


@route("/c/{conversation_id:str}/v1/{path:path}", http_method=_METHODS, summary="Pass-through to the upstream",
       tags=["pass-through"], include_in_schema=False)
async def passthrough_prefixed(request: Request[Any, Any, Any], call: NamedDependency[CallContext]) -> ASGIApp:
    return await _passthrough(request, call.forwarder, call.caller, 4, request.path_params["conversation_id"])  # /c/{id}/v1/...


@route("/auto/v1/{path:path}", http_method=_METHODS, summary="Pass-through to the upstream", tags=["pass-through"],
       include_in_schema=False)
async def passthrough_auto(request: Request[Any, Any, Any], call: NamedDependency[CallContext]) -> ASGIApp:
    return await _passthrough(request, call.forwarder, call.caller, 3, None)  # /auto/v1/...


@route("/auto/v1/chat/completions", http_method=["GET"], include_in_schema=False)
async def chat_completions_list_auto(request: Request[Any, Any, Any], call: NamedDependency[CallContext]) -> ASGIApp:
    return await _passthrough(request, call.forwarder, call.caller, 3, None)


# The chat endpoint's static path shadows the catch-all for its other methods and sub-paths
# (stored completions: GET /v1/chat/completions, GET/POST/DELETE /v1/chat/completions/{id}...):
# they are passed through explicitly.


@route("/v1/chat/completions", http_method=["GET"], include_in_schema=False)
async def chat_completions_list(request: Request[Any, Any, Any], call: NamedDependency[CallContext]) -> ASGIApp:
    return await _passthrough(request, call.forwarder, call.caller, 2, None)


@route("/c/{conversation_id:str}/v1/chat/completions", http_method=["GET"], include_in_schema=False)
async def chat_completions_list_prefixed(request: Request[Any, Any, Any], call: NamedDependency[CallContext]) -> ASGIApp:
    return await _passthrough(request, call.forwarder, call.caller, 4, request.path_params["conversation_id"])


@route("/c/{conversation_id:str}/v1/chat/completions/{rest:path}", http_method=_METHODS, include_in_schema=False)
async def chat_completions_sub_prefixed(request: Request[Any, Any, Any], call: NamedDependency[CallContext]) -> ASGIApp:
    return await _passthrough(request, call.forwarder, call.caller, 4, request.path_params["conversation_id"])
