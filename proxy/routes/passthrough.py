"""Pass-through: every other ``/v1/*`` route (models, embeddings, ...), also under the
``/c/{id}`` prefix, and chat calls without a conversation id. Nothing is parsed beyond the model
name (to pick the upstream) and nothing is stored."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import msgspec
from litestar import Request, route
from litestar.di import NamedDependency
from litestar.types import ASGIApp

from ..auth import Caller
from ..errors import UpstreamFailure
from ..http import RawResponse, encode_headers
from ..observability import current_request
from ..relay import BytesRelay
from ..secrets import redact_bytes
from ..upstream import UpstreamClient, map_exceptions, response_headers
from .common import RequestHeaders, valid_conversation_id

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
            response = await self.upstream.send(upstream_request, stream=True)
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
            return RawResponse(response.status_code, redact_bytes(content, (caller.client_key, upstream.api_key)),
                               response_headers(response.headers))

        async def chunks() -> AsyncIterator[bytes]:
            with map_exceptions():
                async for chunk in response.aiter_bytes():
                    yield chunk

        async def close() -> None:
            upstream_done()
            await response.aclose()

        return BytesRelay(response.status_code, encode_headers(response_headers(response.headers)), chunks(), close)


async def _passthrough(request: Request[Any, Any, Any], forwarder: Forwarder, caller: Caller, path: str,
                       prefix_cid: str | None) -> ASGIApp:
    if prefix_cid is not None:
        valid_conversation_id(prefix_cid, source="path")
    body = await request.body()
    return await forwarder.forward(request, path.lstrip("/"), body, RequestHeaders(request.scope), caller)


@route("/v1/{path:path}", http_method=_METHODS, summary="Pass-through to the upstream", tags=["pass-through"],
       include_in_schema=False)
async def passthrough(request: Request[Any, Any, Any], forwarder: NamedDependency[Forwarder], caller: NamedDependency[Caller]) -> ASGIApp:
    return await _passthrough(request, forwarder, caller, request.path_params["path"], None)


@route("/c/{conversation_id:str}/v1/{path:path}", http_method=_METHODS, summary="Pass-through to the upstream",
       tags=["pass-through"], include_in_schema=False)
async def passthrough_prefixed(request: Request[Any, Any, Any], forwarder: NamedDependency[Forwarder], caller: NamedDependency[Caller]) -> ASGIApp:
    return await _passthrough(request, forwarder, caller, request.path_params["path"],
                              request.path_params["conversation_id"])


@route("/auto/v1/{path:path}", http_method=_METHODS, summary="Pass-through to the upstream", tags=["pass-through"],
       include_in_schema=False)
async def passthrough_auto(request: Request[Any, Any, Any], forwarder: NamedDependency[Forwarder],
                           caller: NamedDependency[Caller]) -> ASGIApp:
    return await _passthrough(request, forwarder, caller, request.path_params["path"], None)


@route("/auto/v1/chat/completions", http_method=["GET"], include_in_schema=False)
async def chat_completions_list_auto(request: Request[Any, Any, Any], forwarder: NamedDependency[Forwarder],
                                     caller: NamedDependency[Caller]) -> ASGIApp:
    return await _passthrough(request, forwarder, caller, "chat/completions", None)


# The chat endpoint's static path shadows the catch-all for its other methods and sub-paths
# (stored completions: GET /v1/chat/completions, GET/POST/DELETE /v1/chat/completions/{id}...):
# they are passed through explicitly.


@route("/v1/chat/completions", http_method=["GET"], include_in_schema=False)
async def chat_completions_list(request: Request[Any, Any, Any], forwarder: NamedDependency[Forwarder], caller: NamedDependency[Caller]) -> ASGIApp:
    return await _passthrough(request, forwarder, caller, "chat/completions", None)


@route("/c/{conversation_id:str}/v1/chat/completions", http_method=["GET"], include_in_schema=False)
async def chat_completions_list_prefixed(request: Request[Any, Any, Any], forwarder: NamedDependency[Forwarder],
                                         caller: NamedDependency[Caller]) -> ASGIApp:
    return await _passthrough(request, forwarder, caller, "chat/completions", request.path_params["conversation_id"])


@route("/c/{conversation_id:str}/v1/chat/completions/{rest:path}", http_method=_METHODS, include_in_schema=False)
async def chat_completions_sub_prefixed(request: Request[Any, Any, Any], forwarder: NamedDependency[Forwarder],
                                        caller: NamedDependency[Caller]) -> ASGIApp:
    return await _passthrough(request, forwarder, caller, "chat/completions/" + request.path_params["rest"].lstrip("/"),
                              request.path_params["conversation_id"])
