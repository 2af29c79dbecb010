"""The composition root: every long-lived part of a running proxy, built once by ``create_app``
from the settings (nothing is filled in later), each given only the collaborators it uses.
``start()``/``stop()`` open and close what needs the event loop: the database pool (and the
embedded server), the tokenizer, the lease keeper, retention; the shared upstream client is closed
last."""

from __future__ import annotations

import asyncio

import httpx

from config import Settings
from storage import AdminStore, Database, OpsStore, PathCache, SharedItems, TreeStore

from .auth import Authenticator
from .background import Background
from .builder import RequestBuilder
from .compaction import Compactor, Summariser, Thresholds
from .leases import LeaseKeeper
from .lifecycle import CallLifecycle
from .limits import BytesBudget
from .metrics import Metrics
from .retention import Retention
from .sessions import Sessions
from .tokens import TokenCounter
from .upstream import UpstreamClient

__all__ = ["Runtime"]


class Runtime:
    def __init__(self, settings: Settings, *, upstream_transport: httpx.AsyncBaseTransport | None = None) -> None:
        server = settings.server
        self.settings = settings
        self.db = Database()
        self.shared = SharedItems(self.db, min_bytes=settings.database.share_items_above)
        self.tree = TreeStore(self.db, PathCache(server.path_cache_mb * 1024 * 1024),
                              batch=settings.database.batch_calls, shared=self.shared)
        self.admin = AdminStore(self.db, self.shared)
        self.ops = OpsStore(self.db)
        self.metrics = Metrics()
        # the request bytes of all the process's requests (server.max_bytes_in_flight): one budget
        # for every route -- Litestar makes a BytesInFlight middleware per route
        self.bytes_in_flight = BytesBudget(server.max_bytes_in_flight, self.metrics.bytes_in_flight.set)
        self.auth = Authenticator(settings.auth)
        self.tokens = TokenCounter()
        self.tasks = Background()
        self.upstream = UpstreamClient(settings, transport=upstream_transport)
        self.leases = LeaseKeeper(self.tree, self.metrics, lease_seconds=server.lease_seconds,
                                  reaper_interval=server.reaper_interval)
        retention = settings.retention
        self.retention = Retention(self.ops, self.metrics, idle_days=retention.idle_days,
                                   interval=retention.interval_seconds, batch=retention.batch, shared=self.shared)
        self.builder = RequestBuilder(self.tree)
        self.compactor = Compactor(tree=self.tree, summariser=Summariser(self.upstream, self.tokens),
                                   thresholds=Thresholds(settings), tokens=self.tokens, metrics=self.metrics,
                                   tasks=self.tasks, lease_seconds=server.lease_seconds)
        self.calls = CallLifecycle(tree=self.tree, upstream=self.upstream, builder=self.builder,
                                   compactor=self.compactor, leases=self.leases, metrics=self.metrics,
                                   tasks=self.tasks, lease_seconds=server.lease_seconds,
                                   default_mode=server.context_mode, unsupported_tools=server.unsupported_tools,
                                   sessions=Sessions(self.tree, self.admin, server.session_headers),
                                   send_timeout=server.client_send_timeout)
        self.metrics.watch_database(self.db)

    async def start(self) -> None:
        d = self.settings.database
        await self.db.open(d.url, d.data_dir, migrate_first=True, min_size=d.pool_min, max_size=d.pool_max,
                           command_timeout=d.command_timeout, connect_timeout=d.connect_timeout,
                           batch_scheduling=d.embedded_batch_scheduling)
        await asyncio.to_thread(self.tokens.load)
        self.leases.start()
        self.retention.start()

    async def stop(self) -> None:
        # the server has stopped the calls its shutdown grace did not see finish; each stores its
        # outcome (interrupted) before the database goes (docs/behaviour.md#shutdown)
        await self.retention.stop()
        await self.leases.settle(timeout=2)
        await self.leases.stop()
        await self.tasks.wait(timeout=30)
        await self.upstream.aclose()
        await self.db.close()
