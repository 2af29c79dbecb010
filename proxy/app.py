"""The app factory: ``create_app(settings)`` builds the Litestar app; its one lifespan owns the
database pool (and the embedded server, when no database URL is configured), the shared
``httpx.AsyncClient``, the lease keeper and the background tasks -- and closes them all."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from litestar import Litestar, Request, Response
from litestar.exceptions import HTTPException
from litestar.openapi import OpenAPIConfig

from config import Settings
from storage import StorageError, StorageUnavailable, TreeStore, open_database

from .auth import Authenticator
from .compaction import Compactor
from .errors import BranchpointError, error_body
from .leases import LeaseKeeper
from .lifecycle import CallLifecycle
from .metrics import Metrics
from .observability import ObservabilityMiddleware, install_log_context
from .routes.admin import AdminController
from .routes.chat import chat_completions, chat_completions_prefixed
from .routes.health import healthz, metrics, readyz
from .routes.passthrough import (
    chat_completions_list,
    chat_completions_list_prefixed,
    chat_completions_sub_prefixed,
    passthrough,
    passthrough_prefixed,
)
from .services import Services
from .tokens import TokenCounter
from .upstream import UpstreamClient

__all__ = ["create_app"]

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


def _json(status: int, body: bytes, headers: dict[str, str] | None = None) -> Response[bytes]:
    return Response(content=body, status_code=status, media_type="application/json", headers=headers)


def _on_branchpoint_error(_: Request[Any, Any, Any], exc: BranchpointError) -> Response[bytes]:
    return _json(exc.status, exc.body(), exc.headers or None)


def _on_storage_error(request: Request[Any, Any, Any], exc: StorageError) -> Response[bytes]:
    if isinstance(exc, StorageUnavailable):
        log.warning("database unavailable: %r", exc.__cause__, extra={"path": request.url.path})
        return _json(503, error_body("the database is unavailable; retry shortly", "service_unavailable",
                                     "database_unavailable"), {"retry-after": "1"})
    log.error("database error: %s", exc, extra={"path": request.url.path})
    return _json(500, error_body("internal storage error", "server_error", "storage_error"))


def _on_http_exception(_: Request[Any, Any, Any], exc: HTTPException) -> Response[bytes]:
    status = exc.status_code
    type_, code = _HTTP_CODES.get(status, ("server_error" if status >= 500 else "invalid_request_error",
                                           f"http_{status}"))
    detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    headers = dict(exc.headers) if exc.headers else None
    return _json(status, error_body(detail, type_, code), headers)


def _on_unexpected(request: Request[Any, Any, Any], exc: Exception) -> Response[bytes]:
    log.exception("unhandled error", extra={"path": request.url.path})
    return _json(500, error_body("internal error", "server_error", "internal_error"))


def create_app(settings: Settings, *, upstream_transport: httpx.AsyncBaseTransport | None = None) -> Litestar:
    """Build the app. ``upstream_transport`` replaces the network for the upstream client (tests)."""
    install_log_context()

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        d = settings.database
        db, embedded = await open_database(d.url, d.data_dir, migrate_first=True, min_size=d.pool_min,
                                           max_size=d.pool_max, command_timeout=d.command_timeout,
                                           connect_timeout=d.connect_timeout)
        tree = TreeStore(db)
        services = Services(
            settings=settings,
            db=db,
            tree=tree,
            upstream=UpstreamClient(settings, transport=upstream_transport),
            leases=LeaseKeeper(tree, lease_seconds=settings.server.lease_seconds,
                               reaper_interval=settings.server.reaper_interval),
            metrics=Metrics(),
            auth=Authenticator(settings.auth),
            tokens=TokenCounter(),
            embedded=embedded,
        )
        await asyncio.to_thread(services.tokens.load)
        services.lifecycle = CallLifecycle(services)
        services.compactor = Compactor(services)
        services.metrics.watch_database(db)
        app.state.services = services
        services.leases.start()
        try:
            yield
        finally:
            await services.leases.stop()
            if services.background:
                await asyncio.wait(list(services.background), timeout=30)
            await services.upstream.aclose()
            await db.close()
            if embedded:
                await asyncio.to_thread(embedded.stop)

    return Litestar(
        route_handlers=[
            chat_completions,
            chat_completions_prefixed,
            passthrough,
            passthrough_prefixed,
            chat_completions_list,
            chat_completions_list_prefixed,
            chat_completions_sub_prefixed,
            healthz,
            readyz,
            metrics,
            AdminController,
        ],
        lifespan=[lifespan],
        middleware=[ObservabilityMiddleware],
        exception_handlers={
            BranchpointError: _on_branchpoint_error,
            StorageError: _on_storage_error,
            HTTPException: _on_http_exception,
            Exception: _on_unexpected,
        },
        request_max_body_size=settings.server.max_body_bytes,
        openapi_config=OpenAPIConfig(title="Branchpoint", version="0.1.0",
                                     description="OpenAI-compatible proxy storing every call as a node of a conversation tree"),
        logging_config=None,
        debug=False,
    )


def app_from_environment() -> Litestar:
    """Factory for ``uvicorn --factory`` (multi-worker serve): settings from the environment."""
    from config import load_settings

    from .logs import configure_logging

    settings = load_settings()
    configure_logging(settings.server.log_level, settings.server.log_format)
    return create_app(settings)
