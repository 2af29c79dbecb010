"""The composition root: every long-lived part of a running proxy, built once by ``create_app``
from the settings (nothing is filled in later), each given only the collaborators it uses.
``start()``/``stop()`` open and close what needs the event loop: the database pool (and the
embedded server), the tokenizer, the lease keeper, retention; the shared upstream client is closed
last."""

from __future__ import annotations

import asyncio
import functools
import logging
import signal
import threading
import time
from typing import Any

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

log = logging.getLogger("branchpoint.call")

# what the calls the shutdown's grace did not see finish get, at least, to store their outcomes
# (interrupted) once the grace has run out
_SETTLE_SECONDS = 2.0


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
        self.stopping_since: float | None = None  # (time.monotonic() of the shutdown's signal)

    async def start(self) -> None:
        d = self.settings.database
        await self.db.open(d.url, d.data_dir, migrate_first=True, min_size=d.pool_min, max_size=d.pool_max,
                           command_timeout=d.command_timeout, connect_timeout=d.connect_timeout,
                           batch_scheduling=d.embedded_batch_scheduling)
        await asyncio.to_thread(self.tokens.load)
        self.leases.start()
        self.retention.start()
        self._note_the_signal()

    def _note_the_signal(self) -> None:
        """Note when the shutdown's signal comes (SIGTERM, SIGINT), before the server's own handler
        runs: the grace counts from then. (Only the main thread has signals: a server run in a
        thread of its own -- the tests' -- counts it from ``stop``.)"""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGINT):
            handler = signal.getsignal(sig)
            if callable(handler):
                signal.signal(sig, functools.partial(self._signalled, handler))

    def _signalled(self, handler: Any, sig: int, frame: Any) -> None:
        if self.stopping_since is None:
            self.stopping_since = time.monotonic()
        handler(sig, frame)

    async def stop(self) -> None:
        # the server has stopped the calls its shutdown grace did not see finish; each stores its
        # outcome (interrupted) before the database goes -- as does the background (an outcome
        # stored once the database is back), within what is left of the grace: a database away
        # does not hold the process up past it (docs/behaviour.md#shutdown)
        began = self.stopping_since if self.stopping_since is not None else time.monotonic()
        deadline = max(began + self.settings.server.shutdown_grace_seconds, time.monotonic() + _SETTLE_SECONDS)
        await self.retention.stop()
        await self.leases.settle(timeout=deadline - time.monotonic())
        await self.leases.stop()
        await self.tasks.wait(timeout=max(0.0, deadline - time.monotonic()))
        await self.tasks.cancel()
        for node_id in list(self.leases.inflight):  # (an outcome not stored: still tracked)
            log.error("a call's outcome could not be stored before the process exited: its lease runs out and "
                      "the reaper finishes its node (interrupted); its client may have had its answer",
                      extra={"node_id": str(node_id)})
        await self.upstream.aclose()
        await self.db.close()
