"""The one dependency of the API routes (``call``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from storage import AdminStore

    from ..auth import Caller
    from ..forwarder import Forwarder
    from ..lifecycle import CallLifecycle

__all__ = ["CallContext"]


class CallContext:
    """What the API routes use: who calls, and the long-lived parts that serve the call. One
    dependency (built from ``caller``), because Litestar resolves several dependencies of a
    handler concurrently -- in a task group per request, a cost the hot path does not need. (A
    plain class: Litestar introspects dataclasses, and these types are only named here.)"""

    __slots__ = ("admin", "caller", "calls", "forwarder")

    def __init__(self, caller: Caller, calls: CallLifecycle, forwarder: Forwarder, admin: AdminStore) -> None:
        self.caller = caller
        self.calls = calls
        self.forwarder = forwarder
        self.admin = admin
