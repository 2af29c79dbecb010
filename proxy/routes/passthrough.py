"""Pass-through: every other ``/v1/*`` route (models, embeddings, ...), also under the
``/c/{id}`` prefix, and chat calls without a conversation id. Nothing is parsed beyond the model
name (to pick the upstream) and nothing is stored."""

from __future__ import annotations

import re
import time
from typing import Any
from urllib.parse import unquote

import msgspec
from litestar import Request, route
from litestar.di import NamedDependency
from litestar.types import ASGIApp

from ..auth import Caller
from ..errors import InvalidRequest, UpstreamFailure
from ..http import RawResponse, encode_headers
from ..observability import current_request
from ..relay import BytesRelay
from ..secrets import redact_bytes
from ..upstream import UpstreamClient, response_headers
from .common import RequestHeaders, valid_conversation_id
from .context import CallContext

__all__ = [
    "Forwarder",
    "chat_completions_list",
    "chat_completions_list_auto",
    "chat_completions_list_prefixed",
    "chat_completions_sub_prefixed",
    "passthrough",
    "passthrough_auto",
    "passthrough_prefixed",
]

_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]


class _ModelOnly(msgspec.Struct):
    model: str | None = None


_model_decoder = msgspec.json.Decoder(_ModelOnly)


def _model_of(body: bytes) -> str | None:
    if not body or body[:1] not in (b"{", b" ", b"\n", b"\t", b"\r"):
        return None
    try:
        return _model_decoder.decode(body).model
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return None


class Forwarder:
    """Relays one request to the upstream its model routes to, and the answer back, untouched
    (but for the credentials: ours go out, an echo of them never comes back)."""

    def __init__(self, upstream: UpstreamClient) -> None:
        self.upstream = upstream

    async def forward(self, request: Request[Any, Any, Any], path: str, body: bytes, headers: RequestHeaders,
                      caller: Caller) -> ASGIApp:
        upstream = self.upstream.route(_model_of(body)) if body else self.upstream.default
        out_headers = self.upstream.request_headers(upstream, headers.items, caller.client_key)
        upstream_request = self.upstream.build(request.method, upstream, path, headers=out_headers,
                                               content=body or None, params=request.scope.get("query_string") or None)
        t0 = time.perf_counter()
        ctx = current_request.get()

        def upstream_done() -> None:
            if ctx is not None:
                ctx.upstream_seconds = time.perf_counter() - t0

        try:
            response = await self.upstream.send(upstream_request)
        except UpstreamFailure as exc:
            upstream_done()
            return RawResponse(exc.status, exc.body())
        if response.status_code >= 400:  # an error body is small: read it, mask echoed keys
            try:
                content = await self.upstream.read_rest(response)
            except UpstreamFailure as exc:
                return RawResponse(exc.status, exc.body())
            finally:
                upstream_done()
            secrets = (caller.client_key, upstream.api_key, *headers.credentials())
            return RawResponse(response.status_code, redact_bytes(content, secrets),
                               response_headers(response.headers))

        async def close() -> None:
            upstream_done()
            await response.aclose()

        return BytesRelay(response.status_code, encode_headers(response_headers(response.headers)),
                          self.upstream.chunks(response), close)


def upstream_path(scope: Any, skip: int) -> str:
    """The path to forward: the request's raw (still percent-encoded) path after its first ``skip``
    segments -- forwarded as it came, never decoded and re-encoded. It must stay under the
    upstream's base path: a ``.`` or ``..`` segment (encoded once, twice or not at all, or hidden
    behind an encoded slash or a backslash) or a control character is refused, and nothing is sent."""
    raw = (scope.get("raw_path") or scope["path"].encode()).decode("latin-1")
    rest = raw.split("?", 1)[0].split("/")[skip:]
    for segment in rest:
        text = segment
        for _ in range(3):  # %252e%252e -> %2e%2e -> ..
            decoded = unquote(text)
            if decoded == text:
                break
            text = decoded
        if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in text):
            raise InvalidRequest("the path contains a control character", param="path")
        if any(part in (".", "..") for part in re.split(r"[/\\]", text)):
            raise InvalidRequest("the path may not contain '.' or '..' segments", param="path")
    return "/".join(rest)


async def _passthrough(request: Request[Any, Any, Any], forwarder: Forwarder, caller: Caller, skip: int,
                       prefix_cid: str | None) -> ASGIApp:
    if prefix_cid is not None:
        valid_conversation_id(prefix_cid, source="path")
    path = upstream_path(request.scope, skip)
    body = await request.body()
    return await forwarder.forward(request, path, body, RequestHeaders(request.scope), caller)


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
