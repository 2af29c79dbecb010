"""The app factory: ``create_app(settings)`` builds the ``Runtime`` (every long-lived part, typed)
and the Litestar app whose routes receive the parts they use as dependencies; its one lifespan
starts the runtime (database pool -- and the embedded server when no URL is configured --,
tokenizer, lease keeper) and stops it again, closing the shared upstream client."""

from __future__ import annotations

import ctypes
import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from litestar import Litestar, Request, Response, Router
from litestar.di import NamedDependency, Provide
from litestar.exceptions import HTTPException, ValidationException
from litestar.middleware import DefineMiddleware
from litestar.openapi import OpenAPIConfig

from config import Settings
from storage import Refused, StorageError, StorageUnavailable

from .auth import Caller
from .dialects.messages.errors import from_openai_body as anthropic_error
from .dialects.messages.errors import is_messages_path
from .errors import BranchpointError, error_body, from_refusal
from .forwarder import Forwarder
from .http import HeadAsGet
from .limits import BodyTimeout, BytesInFlight
from .observability import ObservabilityMiddleware, install_log_context, unmatched
from .routes.admin import AdminController
from .routes.chat import chat_completions, chat_completions_auto, chat_completions_prefixed
from .routes.context import CallContext
from .routes.conversations import conversation_item, conversation_items, conversation_resource, conversations_create
from .routes.health import healthz, metrics, readyz
from .routes.messages import messages_count_tokens, messages_create
from .routes.passthrough import (
    chat_completions_list,
    chat_completions_list_auto,
    chat_completions_list_prefixed,
    chat_completions_sub_prefixed,
    passthrough,
    passthrough_auto,
    passthrough_prefixed,
)
from .routes.response_objects import response_cancel, response_input_items, response_resource
from .routes.responses import responses_create
from .routes.responses_compact import responses_compact
from .routes.responses_input_tokens import responses_input_tokens
from .routes.ui import ui_router
from .runtime import Runtime

__all__ = ["app_from_environment", "create_app", "tune_gc"]

log = logging.getLogger("branchpoint")

_HTTP_CODES = {
    400: ("invalid_request_error", "invalid_request"),
    401: ("authentication_error", "invalid_api_key"),
    403: ("permission_error", "forbidden"),
    404: ("not_found_error", "not_found"),
    405: ("invalid_request_error", "method_not_allowed"),
    413: ("invalid_request_error", "payload_too_large"),
    415: ("invalid_request_error", "unsupported_media_type"),
    422: ("invalid_request_error", "invalid_request"),
}


def _json(status: int, body: bytes, headers: dict[str, str] | None = None,
          request: Request[Any, Any, Any] | None = None) -> Response[bytes]:
    if request is not None and is_messages_path(request.scope["path"]):  # Anthropic's clients: its shape
        body = anthropic_error(status, body)
    return Response(content=body, status_code=status, media_type="application/json", headers=headers)


def _on_branchpoint_error(request: Request[Any, Any, Any], exc: BranchpointError) -> Response[bytes]:
    return _json(exc.status, exc.body(), exc.headers or None, request)


def _on_storage_error(request: Request[Any, Any, Any], exc: StorageError) -> Response[bytes]:
    if isinstance(exc, Refused):
        return _on_branchpoint_error(request, from_refusal(exc))
    if isinstance(exc, StorageUnavailable):
        log.warning("database unavailable: %r", exc.__cause__, extra={"path": request.url.path})
        return _json(503, error_body("the database is unavailable; retry shortly", "service_unavailable",
                                     "database_unavailable"), {"retry-after": "1"}, request)
    # the type and SQLSTATE only: a database's message (asyncpg's above all) may quote the values
    # it refused -- a client's message
    cause = exc.__cause__ or exc
    log.error("database error", extra={"path": request.url.path, "error": type(cause).__name__,
                                       "sqlstate": getattr(cause, "sqlstate", None)})
    return _json(500, error_body("internal storage error", "server_error", "storage_error"), request=request)


def _on_http_exception(request: Request[Any, Any, Any], exc: HTTPException) -> Response[bytes]:
    status = exc.status_code
    type_, code = _HTTP_CODES.get(status, ("server_error" if status >= 500 else "invalid_request_error",
                                           f"http_{status}"))
    detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    param = None
    if isinstance(exc, ValidationException) and isinstance(exc.extra, list) and exc.extra:
        # say what was wrong, not only where: the first problem Litestar found, and its field
        first = exc.extra[0] if isinstance(exc.extra[0], dict) else {}
        if first.get("message") == "'data'" and first.get("key") == "data":  # (Litestar: no body at all)
            detail = "this endpoint takes a JSON body"
        elif first.get("message"):
            key = first.get("key")
            param = key if isinstance(key, str) and key != "data" else None  # "data": the body as a whole
            detail = f"{param}: {first['message']}" if param else str(first["message"])
    headers = dict(exc.headers) if exc.headers else None
    response = _json(status, error_body(detail, type_, code, param=param), headers, request)
    if "path_template" not in request.scope:  # no route took it (routing's refusal): no route's middleware ran
        return unmatched(request.scope, response, request.app.state.runtime.metrics)
    return response


def _on_too_deep(request: Request[Any, Any, Any], exc: RecursionError) -> Response[bytes]:
    """A body nested deeper than its parser goes (whichever route read it: the model routes say
    so themselves, the others' bodies are parsed by Litestar or read whole) -- the client's input,
    refused as such."""
    log.info("request body nested too deeply", extra={"path": request.url.path})
    return _json(400, error_body("the request body is nested too deeply", "invalid_request_error", "invalid_request"),
                 request=request)


def _on_unexpected(request: Request[Any, Any, Any], exc: Exception) -> Response[bytes]:
    log.exception("unhandled error", extra={"path": request.url.path})
    return _json(500, error_body("internal error", "server_error", "internal_error"), request=request)


def _given(value: Any) -> Provide:
    """A dependency that is one long-lived object of the runtime."""
    return Provide(lambda: value, use_cache=True, sync_to_thread=False)


def create_app(settings: Settings, *, upstream_transport: httpx.AsyncBaseTransport | None = None) -> Litestar:
    """Build the app. ``upstream_transport`` replaces the network under the upstream client
    (tests: ``httpx.MockTransport`` / respx)."""
    install_log_context()
    runtime = Runtime(settings, upstream_transport=upstream_transport)

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        await runtime.start()
        try:
            yield
        finally:
            await runtime.stop()

    forwarder = Forwarder(runtime.upstream, upstream_objects=settings.server.upstream_objects,
                          send_timeout=settings.server.client_send_timeout)

    def call_context(caller: NamedDependency[Caller]) -> CallContext:
        return CallContext(caller, runtime.calls, forwarder, runtime.admin)

    app = Litestar(
        route_handlers=[
            chat_completions,
            chat_completions_prefixed,
            chat_completions_auto,
            passthrough,
            passthrough_prefixed,
            passthrough_auto,
            chat_completions_list,
            chat_completions_list_prefixed,
            chat_completions_list_auto,
            chat_completions_sub_prefixed,
            responses_create,
            messages_create,
            messages_count_tokens,
            response_resource,
            response_input_items,
            response_cancel,
            responses_input_tokens,
            responses_compact,
            conversations_create,
            conversation_resource,
            conversation_items,
            conversation_item,
            healthz,
            readyz,
            metrics,
            # authenticated before Litestar reads a body (docs/architecture.md#auth-before-the-body)
            Router("/", route_handlers=[AdminController], guards=[runtime.auth.guard]),
            ui_router(),
        ],
        dependencies={
            "caller": Provide(runtime.auth.caller, sync_to_thread=False),
            "call": Provide(call_context, sync_to_thread=False),
            "admin": _given(runtime.admin),
            "ops": _given(runtime.ops),
            "compactor": _given(runtime.compactor),
            "builder": _given(runtime.builder),
            "upstream": _given(runtime.upstream),
            "metrics": _given(runtime.metrics),
            "leases": _given(runtime.leases),
            "auth": _given(runtime.auth),
            "metrics_token": _given(settings.server.metrics_token),
        },
        # auth "none": a browser page of another site may not change anything (docs/behaviour.md#auth-and-tenancy)
        guards=[runtime.auth.same_site] if runtime.auth.mode == "none" else [],
        lifespan=[lifespan],
        middleware=[DefineMiddleware(ObservabilityMiddleware, metrics=runtime.metrics),
                    DefineMiddleware(BodyTimeout, timeout=settings.server.client_body_timeout),
                    DefineMiddleware(BytesInFlight, budget=runtime.bytes_in_flight,
                                     max_body=settings.server.max_body_bytes, metrics=runtime.metrics)],
        exception_handlers={
            BranchpointError: _on_branchpoint_error,
            StorageError: _on_storage_error,
            HTTPException: _on_http_exception,
            RecursionError: _on_too_deep,
            Exception: _on_unexpected,
        },
        request_max_body_size=settings.server.max_body_bytes,
        openapi_config=OpenAPIConfig(title="Branchpoint", version="0.1.0",
                                     description="OpenAI-compatible proxy storing every call as a node of a conversation tree"),
        logging_config=None,
        debug=False,
    )
    app.state.runtime = runtime
    app.asgi_handler = HeadAsGet(app.asgi_handler)  # (before routing: Litestar routes HEAD to HEAD handlers only)
    return app


def app_from_environment() -> Litestar:
    """Factory for ``uvicorn --factory`` (multi-worker serve): settings from the environment."""
    from config import load_settings

    from .logs import configure_logging

    settings = load_settings()
    configure_logging(settings.server.log_level, settings.server.log_format)
    app = create_app(settings)
    tune_gc()
    return app


def tune_gc() -> None:
    """The garbage collector of a serving process (docs/architecture.md#the-garbage-collector):
    what exists once the app is built is kept out of every later collection (``gc.freeze``), and
    the youngest generation is collected after 10,000 net allocations instead of 700 -- a call's
    short-lived objects (parsed bodies, path items) then die before a collection scans them."""
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)
    tune_malloc()


# glibc's mallopt parameter: allocations at least this large get pages of their own (mmap)
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD = 1 << 20


def tune_malloc() -> None:
    """Memory that large requests held goes back to the system once they end (glibc only): blocks
    of 1 MiB and more -- a request body, its decoded text, its copies for the upstream and the
    database -- are given pages of their own, unmapped when freed. By default glibc raises that
    threshold each time such a block is freed, up to 32 MiB, after which large blocks come from
    the heap and stay resident: eight 30 MB requests at once left ~500 MB of the process's memory
    behind them (tests/test_hostile_payloads.py)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)
    except (OSError, AttributeError):  # not glibc: its allocator keeps its own ways
        pass
