"""Operations endpoints: liveness, readiness, Prometheus metrics."""

from __future__ import annotations

import hmac
import os
from typing import Any

import msgspec
from litestar import Request, Response, get
from litestar.di import NamedDependency
from litestar.openapi.datastructures import ResponseSpec
from litestar.types import ASGIApp

from storage import OpsStore, StorageError, latest_version

from ..auth import Authenticator
from ..errors import AuthenticationFailed
from ..http import RawResponse
from ..leases import LeaseKeeper
from ..metrics import Metrics

__all__ = ["healthz", "metrics", "readyz"]


@get("/healthz", summary="Liveness: the process is up", tags=["operations"])
async def healthz() -> dict[str, Any]:
    return {"status": "ok", "pid": os.getpid()}


class Readiness(msgspec.Struct, omit_defaults=True):
    status: str
    database: str
    schema_version: int | None = None
    detail: str | None = None


@get("/readyz", summary="Readiness: database reachable, writable and migrations current", tags=["operations"],
     responses={503: ResponseSpec(Readiness, description="Not ready: database unreachable, read-only or migrations pending",
                                  generate_examples=False)})
async def readyz(ops: NamedDependency[OpsStore]) -> Response[Readiness]:
    try:
        version, writable = await ops.readiness()
    except StorageError as exc:
        return Response(Readiness("unavailable", "unreachable", detail=str(exc)), status_code=503)
    if version < latest_version():
        return Response(Readiness("unavailable", "migrations pending", schema_version=version), status_code=503)
    if not writable:  # a standby, or default_transaction_read_only: every call's start would be refused (503)
        return Response(Readiness("unavailable", "read-only", schema_version=version), status_code=503)
    # (a newer schema -- `migrate` of the next version run before it rolls out -- is ready too:
    # this process stays in its load balancer until it is replaced. Whether its calls still work
    # depends on the migrations in between: docs/scaling.md#upgrading)
    return Response(Readiness("ready", "ok", schema_version=version))


def _may_read_metrics(request: Request[Any, Any, Any], auth: Authenticator, token: str) -> None:
    """Open unless ``[server] metrics_token`` is set; then that token, or an admin key (keys mode)."""
    if not token:
        return
    authorization = request.headers.get("authorization")
    scheme, _, given = (authorization or "").partition(" ")
    if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode()):
        return
    if auth.mode == "keys" and auth(authorization).admin:
        return
    raise AuthenticationFailed("/metrics needs the metrics token (server.metrics_token) or an admin key")


@get("/metrics", summary="Prometheus metrics", tags=["operations"], media_type="text/plain")
async def metrics(request: Request[Any, Any, Any], ops: NamedDependency[OpsStore], metrics: NamedDependency[Metrics],
                  leases: NamedDependency[LeaseKeeper], auth: NamedDependency[Authenticator],
                  metrics_token: NamedDependency[str]) -> ASGIApp:
    _may_read_metrics(request, auth, metrics_token)
    try:
        metrics.pending_nodes.set(await ops.pending_count())
    except StorageError:
        pass
    metrics.inflight.set(len(leases.inflight))
    return RawResponse(200, metrics.render(), content_type="text/plain; version=0.0.4; charset=utf-8")
