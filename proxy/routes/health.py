"""Operations endpoints: liveness, readiness, Prometheus metrics."""

from __future__ import annotations

import os
from typing import Any

import msgspec
from litestar import Response, get
from litestar.di import NamedDependency
from litestar.openapi.datastructures import ResponseSpec
from litestar.types import ASGIApp

from storage import OpsStore, StorageError, latest_version

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


@get("/readyz", summary="Readiness: database reachable and migrations current", tags=["operations"],
     responses={503: ResponseSpec(Readiness, description="Not ready: database unreachable or migrations pending",
                                  generate_examples=False)})
async def readyz(ops: NamedDependency[OpsStore]) -> Response[Readiness]:
    try:
        version = await ops.schema_version()
    except StorageError as exc:
        return Response(Readiness("unavailable", "unreachable", detail=str(exc)), status_code=503)
    if version != latest_version():
        return Response(Readiness("unavailable", "migrations pending", schema_version=version), status_code=503)
    return Response(Readiness("ready", "ok", schema_version=version))


@get("/metrics", summary="Prometheus metrics", tags=["operations"], media_type="text/plain")
async def metrics(ops: NamedDependency[OpsStore], metrics: NamedDependency[Metrics], leases: NamedDependency[LeaseKeeper]) -> ASGIApp:
    try:
        metrics.pending_nodes.set(await ops.pending_count())
    except StorageError:
        pass
    metrics.inflight.set(len(leases.inflight))
    return RawResponse(200, metrics.render(), content_type="text/plain; version=0.0.4; charset=utf-8")
