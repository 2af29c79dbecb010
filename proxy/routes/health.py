"""Operations endpoints: liveness, readiness, Prometheus metrics."""

from __future__ import annotations

from typing import Any

from litestar import Request, get
from litestar.types import ASGIApp

from storage import StorageError, latest_version

from ..http import RawResponse
from .common import services

__all__ = ["healthz", "metrics", "readyz"]


@get("/healthz", summary="Liveness: the process is up", tags=["operations"])
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@get("/readyz", summary="Readiness: database reachable and migrations current", tags=["operations"])
async def readyz(request: Request[Any, Any, Any]) -> ASGIApp:
    s = services(request)
    try:
        version = await s.db.fetchval("SELECT coalesce(max(version), 0) FROM schema_migrations")
    except StorageError as exc:
        return RawResponse(503, b'{"status":"unavailable","database":"unreachable","detail":"%s"}' % str(exc).encode())
    if version != latest_version():
        return RawResponse(503, b'{"status":"unavailable","database":"migrations pending"}')
    return RawResponse(200, b'{"status":"ready","database":"ok","schema_version":%d}' % version)


@get("/metrics", summary="Prometheus metrics", tags=["operations"])
async def metrics(request: Request[Any, Any, Any]) -> ASGIApp:
    s = services(request)
    try:
        pending = await s.db.fetchval("SELECT count(*) FROM nodes WHERE status = 'pending'")
        s.metrics.pending_nodes.set(pending)
    except StorageError:
        pass
    s.metrics.inflight.set(len(s.leases.inflight))
    return RawResponse(200, s.metrics.render(), content_type="text/plain; version=0.0.4; charset=utf-8")
