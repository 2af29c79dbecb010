"""What a running app holds: settings, the pool, the upstream client, the lease keeper, the
metrics, and the set of background tasks that must finish before shutdown. Built and torn down by
the app's lifespan (``proxy.app``); handlers reach it through ``app.state.services``."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from config import Settings
from storage import Database, EmbeddedServer, TreeStore

from .auth import Authenticator
from .leases import LeaseKeeper
from .metrics import Metrics
from .tokens import TokenCounter
from .upstream import UpstreamClient

__all__ = ["Services"]


@dataclass
class Services:
    settings: Settings
    db: Database
    tree: TreeStore
    upstream: UpstreamClient
    leases: LeaseKeeper
    metrics: Metrics
    auth: Authenticator
    tokens: TokenCounter
    embedded: EmbeddedServer | None = None
    background: set[asyncio.Task[Any]] = field(default_factory=set)
    lifecycle: Any = None  # CallLifecycle, set by the app factory
    compactor: Any = None  # Compactor, set by the app factory

    def spawn(self, coro: Any) -> asyncio.Task[Any]:
        """Run ``coro`` in the background; shutdown waits for it."""
        task = asyncio.ensure_future(coro)
        self.background.add(task)
        task.add_done_callback(self.background.discard)
        return task
