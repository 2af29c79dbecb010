"""A started call's outcome stored, whatever the database does meanwhile: at once; in the
background once the database is back (``proxy.later``); or -- when the outcome itself is refused
-- as a failed node instead, so a conversation is never left locked (docs/architecture.md#durability).
What follows a stored outcome (metrics, the soft-threshold compaction, the log line) happens here
too. Every way out of a started call ends in ``finish``."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from storage import CallFinish, Outcome, StorageUnavailable, TreeStore, transcript

from .background import Background
from .call import Started
from .compaction import Compactor
from .failures import NodeError, cancellation_handled
from .later import Later
from .leases import LeaseKeeper
from .metrics import Metrics

__all__ = ["Outcomes"]

log = logging.getLogger("branchpoint.call")


def _bounded(model: Any) -> str | None:
    """A client's model name as a log line holds it: any length may come."""
    return model[:200] if isinstance(model, str) else None


# the proxy's own failures that are not transient (lifecycle.run: a failure of the proxy's code)
_OWN_FAULTS = frozenset({"internal_error", "storage_refused"})


class Outcomes:
    def __init__(self, *, tree: TreeStore, later: Later, compactor: Compactor, leases: LeaseKeeper, metrics: Metrics,
                 tasks: Background) -> None:
        self.tree = tree
        self.later = later
        self.compactor = compactor
        self.leases = leases
        self.metrics = metrics
        self.tasks = tasks

    async def finish(self, started: Started, outcome: Outcome, *, received: list[Any] | None = None,
                      usage: dict[str, Any] | None = None, finish_reason: str | None = None,
                      error: NodeError | None = None, received_messages: list[Any] | None = None) -> bool:
        """Store the outcome; the head follows the head rule. Never raises. If the database is
        away, the outcome is stored in the background as soon as it is back (the lease is kept
        alive meanwhile); a node that still cannot be stored is reaped as interrupted in the end.
        Stopped in flight (the shutdown's grace ran out), it goes on in the background too, and the
        cancellation counts as handled: the caller answers its client as if it had finished.
        False: the node was no longer pending -- reaped when its lease ran out (a process cut off
        from the database longer than the lease) -- and nothing of this outcome is stored: the
        caller must not tell its client that the answer was."""
        started.finished = True
        if not started.stored:  # (nothing to store: a call only translated -- its usage was read all the same)
            self.metrics.observe_tokens(usage)
            return True
        if not isinstance(finish_reason, str):  # (an upstream's odd one: a number, say)
            finish_reason = None
        elif "\x00" in finish_reason:
            finish_reason = finish_reason.replace("\x00", "")  # a text column; the answer itself keeps it
        if not isinstance(usage, dict):
            usage = None
        finish = CallFinish(
            outcome=outcome, received=received, usage=usage, finish_reason=finish_reason, error=error,
            request_hash=started.request_hash, leased=started.leased,
            received_digests=transcript.digests(received_messages if received_messages is not None else received or ()),
        )
        store = self._storing(started, finish)
        try:
            if not await store():
                # False: reaped (its lease ran out: a process cut off from the database longer than
                # the lease); None: gone -- deleted after it was reaped, or its start lost and its
                # place in the tree gone since. Deleted stays deleted, and the client is not told
                # its answer was stored
                log.warning("a call's node was reaped or deleted before its outcome could be stored",
                            extra={"node_id": str(started.node_id)})
                self.leases.untrack(started.node_id)  # (no lease left to renew)
                return False
        except StorageUnavailable as exc:
            log.warning("could not store a call's outcome; retrying in the background",
                        extra={"node_id": str(started.node_id), "error": str(exc)})
            self.tasks.spawn(self.store_later(started, store, outcome, usage, error))
            return True
        except asyncio.CancelledError:  # (the shutdown waits for the background)
            self.tasks.spawn(self.store_later(started, store, outcome, usage, error))
            cancellation_handled()
            return True
        except Exception as exc:  # noqa: BLE001 - any refusal: the node is failed instead
            # not the database being away: the outcome itself was refused, and would be again. The
            # node fails now (its lease released) instead of holding the conversation until the
            # reaper comes -- waited for, so the client's next call finds the conversation free
            fail = self.tasks.spawn(self.store_later(started, store, outcome, usage, error, refused=exc))
            try:
                await asyncio.shield(fail)
            except asyncio.CancelledError:  # (it goes on in the background)
                cancellation_handled()
            return True
        self.stored(started, outcome, usage, error)
        return True

    def _storing(self, started: Started, finish: CallFinish) -> Callable[[], Awaitable[bool | None]]:
        """What stores ``finish`` (again, if the database is away). A node missing at the finish is
        written again as a start the database lost only while this process surely held its lease:
        once that may have run out, the node may have been reaped and then deleted -- and a deleted
        conversation (or one made again under its name) must not get it back."""
        async def store() -> bool | None:
            begun = started.begun if self.leases.held(started.node_id) else None
            return await self.tree.finish_call(started.tree_id, started.node_id, finish, tenant=started.call.tenant,
                                               conversation_id=started.conversation_id, begun=begun)
        return store

    async def store_later(self, started: Started, store: Callable[[], Any], outcome: Outcome,
                           usage: dict[str, Any] | None, error: NodeError | None,
                           refused: BaseException | None = None) -> None:
        """Store the outcome once the database is back -- or, when it was ``refused`` (an error that
        is not the database being away, now or on a later attempt), fail the node instead: a
        transient failure without the answer, so its question stays in context and the lease is
        released."""
        node = {"node_id": str(started.node_id)}
        if refused is None:
            result: list[bool | None] = []

            async def attempt() -> None:
                result[:] = [await store()]

            try:
                if not await self.later.store(started.node_id, attempt):
                    self.leases.untrack(started.node_id)  # the reaper takes it from here
                elif not result[0]:  # reaped, or reaped and deleted, while the database was away
                    log.error("a call's outcome could not be stored once the database was back: its lease had "
                              "run out (its node reaped, or deleted since); its client had its answer",
                              extra=node)
                    self.leases.untrack(started.node_id)
                else:
                    self.stored(started, outcome, usage, error)
                return
            except Exception as exc:  # noqa: BLE001 - any refusal: the node is failed instead
                refused = exc
        # (its type only: the messages of some -- asyncpg's among them -- quote the values refused)
        cause = type(refused).__name__
        log.error("the database refused a call's outcome; the node is failed instead",
                  extra={**node, "outcome": outcome.value, "error": cause})
        failure = NodeError(type="server_error", code="storage_refused", status=None,
                            message=f"the proxy could not store this call's outcome ({cause})")
        finish = CallFinish(outcome=Outcome.TRANSIENT, error=failure, request_hash=started.request_hash,
                            leased=started.leased)
        fail = self._storing(started, finish)
        try:
            try:
                await fail()
            except StorageUnavailable:
                if not await self.later.store(started.node_id, fail):
                    self.leases.untrack(started.node_id)
                    return
        except Exception as exc:  # noqa: BLE001 - logged; the reaper finishes the node
            log.error("could not fail the node of a refused outcome; the reaper will",
                      extra={**node, "error": type(exc).__name__})
            self.leases.untrack(started.node_id)
            return
        self.stored(started, Outcome.TRANSIENT, None, failure)

    def stored(self, started: Started, outcome: Outcome, usage: dict[str, Any] | None, error: NodeError | None) -> None:
        """What follows a stored outcome. Never raises: the call is stored and its head moved, so
        the client gets its answer and node headers whatever an upstream put in its usage."""
        self.leases.untrack(started.node_id)
        call = started.call
        try:
            self.metrics.observe_call(call.kind, outcome.value, usage)
            # (a call with a threshold of its own -- context_management -- compacts only at it)
            if outcome is Outcome.SUCCESS and call.kind == "turn" and call.compact_threshold is None:
                self.compactor.after_turn(tenant=call.tenant, conversation_id=started.conversation_id,
                                          tree_id=started.tree_id, head=started.node_id, model=call.body["model"],
                                          usage=usage, client_key=call.client_key)
        except Exception:
            log.exception("after a stored call", extra={"node_id": str(started.node_id)})
        if outcome is not Outcome.SUCCESS:
            code = error.code if error else None
            ran = started.begun.ran if started.begun is not None else None
            fields = {"conversation_id": started.conversation_id, "node_id": str(started.node_id),
                      "outcome": outcome.value, "code": code, "model": _bounded(call.body.get("model")),
                      "upstream": ran.provider if ran is not None else None,
                      "status": error.status if error else None}
            # (no message: an upstream's -- which may quote the request -- can carry any code,
            # ours among them; the code, the status and the upstream say what failed)
            # what an operator acts on (the upstream failing, the proxy's own error) at warning; a
            # client's own doing (it left, its request refused, its context too long) at info
            failing = (outcome is Outcome.TRANSIENT and code != "client_disconnected") or code in _OWN_FAULTS
            log.log(logging.WARNING if failing else logging.INFO, "call failed", extra=fields)
