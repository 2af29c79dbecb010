"""Per-request observability: a request id (taken from the client's ``X-Request-Id`` or made
up, and sent back as ``X-Branchpoint-Request-Id`` -- the upstream's own ``x-request-id`` is
relayed untouched, providers' support desks ask for it), the conversation/node ids once known, Prometheus metrics by route and status, the
upstream's share of the time (so the proxy's own overhead is visible in production), and one
access-log line per request -- ids, status and timings, never message contents. Being the
outermost of our layers, it also answers a request the shutdown cut before its answer began
(docs/behaviour.md#shutdown): 503 ``interrupted``, not the ASGI server's bare 500.

``RequestContext`` travels in a context variable; the call lifecycle fills in what it learns.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import re
import time
from typing import Any

from litestar import Response
from litestar.background_tasks import BackgroundTask

from .failures import cancellation_handled, interrupted
from .http import RawResponse, method_of
from .metrics import Metrics

__all__ = ["UNMATCHED", "ObservabilityMiddleware", "RequestContext", "current_request", "install_log_context",
           "unmatched"]

log = logging.getLogger("branchpoint.access")

_VALID_ID = re.compile(rb"[A-Za-z0-9._:-]{1,128}")

UNMATCHED = "unmatched"  # the route label of a request no route took (a bounded label, whatever its path)


class RequestContext:
    __slots__ = ("context_matched", "context_mode", "conversation_id", "node_id", "request_id", "upstream_seconds")

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.conversation_id: str | None = None
        self.node_id: str | None = None
        self.context_mode: str | None = None  # a stored call: the mode that handled it (X-Context-Mode)
        self.context_matched: int | None = None  # ... and how many of its messages matched (X-Context-Matched)
        self.upstream_seconds = 0.0


current_request: contextvars.ContextVar[RequestContext | None] = contextvars.ContextVar("current_request", default=None)


_installed = False


def install_log_context() -> None:
    """Stamp every log record made while serving a request with its request, conversation and
    node ids (at the moment it is made, so any handler -- JSON, text, a test's -- sees them)."""
    global _installed
    if _installed:
        return
    _installed = True
    previous = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        ctx = current_request.get()
        if ctx is not None:  # own names: a call's explicit extra= of the same ids must not clash
            record.bp_request_id = ctx.request_id
            record.bp_conversation_id = ctx.conversation_id
            record.bp_node_id = ctx.node_id
        return record

    logging.setLogRecordFactory(factory)


def _request_id(scope: Any) -> str:
    for key, value in scope["headers"]:
        if key == b"x-request-id" and _VALID_ID.fullmatch(value):
            return value.decode()
    return os.urandom(16).hex()


class ObservabilityMiddleware:
    """Raw ASGI middleware (Litestar applies it inside each route, after routing)."""

    def __init__(self, app: Any, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        ctx = RequestContext(_request_id(scope))
        token = current_request.set(ctx)
        start = time.perf_counter()
        status = 500
        started = False
        rid = ctx.request_id.encode()

        async def send_with_id(message: Any) -> None:
            nonlocal status, started
            if message["type"] == "http.response.start":
                status, started = message["status"], True
                message = {**message, "headers": [*message.get("headers", ()), (b"x-branchpoint-request-id", rid)]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except asyncio.CancelledError:
            if started:  # (an answer under way ends as its own layer decided)
                raise
            cancellation_handled()
            failure = interrupted("the proxy shut down before it could answer")
            await RawResponse(failure.status, failure.body)(scope, receive, send_with_id)
        finally:
            _observed(self.metrics, scope, ctx, scope.get("path_template") or UNMATCHED, status,
                      time.perf_counter() - start)
            current_request.reset(token)


def _observed(metrics: Metrics, scope: Any, ctx: RequestContext, route: str, status: int, elapsed: float) -> None:
    """A request answered: counted by route and status, and its access-log line."""
    metrics.observe_request(route, status, elapsed, ctx.upstream_seconds)
    if log.isEnabledFor(logging.INFO):
        fields = {
            "method": method_of(scope), "path": scope["path"], "route": route, "status": status,
            "duration_ms": round(elapsed * 1000, 2), "upstream_ms": round(ctx.upstream_seconds * 1000, 2),
        }
        if ctx.context_mode is not None:  # a stored call
            fields["context_mode"], fields["context_matched"] = ctx.context_mode, ctx.context_matched
        log.info("request", extra=fields)


def unmatched(scope: Any, response: Response[bytes], metrics: Metrics) -> Response[bytes]:
    """``response`` -- the refusal of a request no route took (404, 405, a bad Host header) --
    with the request's id, counted and access-logged once it is sent, as ``route="unmatched"``:
    Litestar answers such a request before any route's middleware, ``ObservabilityMiddleware``
    included, runs (so a matched request pays nothing for this)."""
    ctx = RequestContext(_request_id(scope))
    start = time.perf_counter()
    response.headers["x-branchpoint-request-id"] = ctx.request_id

    async def sent() -> None:
        token = current_request.set(ctx)
        try:
            _observed(metrics, scope, ctx, UNMATCHED, response.status_code, time.perf_counter() - start)
        finally:
            current_request.reset(token)

    response.background = BackgroundTask(sent)
    return response
