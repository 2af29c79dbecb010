"""The call lifecycle: one stored call, of any dialect, from the parsed request to the stored
node (docs/behaviour.md#the-chat-endpoint).

    begin: conversation, lease, parent, pending node, path read       (storage: one round trip [*])
    maybe compact, build the exact upstream body                      (proxy.compaction, proxy.builder)
    call the upstream, relay the answer                               (proxy.upstream, proxy.relay)
    finish: outcome stored, lease released, head moved by the rule   (storage: one round trip)

    [*] on one PostgreSQL; on a schema distributed by tree, up to three (docs/scaling.md)

Every way out of a started call goes through ``Outcomes.finish`` (proxy/outcomes.py; or ``_fail``,
which also answers the client), so a started node is always finished: with its answer, or with a
``Failure`` whose
``Outcome`` the head rule (``bp_can_be_head``, storage/functions/basics.sql) reads. The
upstream's answer passes one ladder of failures, for answers and streams alike (proxy/answers.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Any

import msgspec

from storage import (
    Busy,
    CallStart,
    Outcome,
    Refused,
    StorageUnavailable,
    TreeStore,
    transcript,
    uuid7,
)

from .answers import Answers, Failed
from .background import Background
from .builder import RequestBuilder
from .call import Call, Started
from .compaction import Compactor
from .dialects import DROPPED_TOOLS, crossing
from .errors import BranchpointError, from_refusal
from .failures import Failure, cancellation_handled, interrupted
from .http import RawResponse
from .later import Later
from .leases import LeaseKeeper
from .metrics import Metrics
from .observability import current_request
from .outcomes import Outcomes
from .relay import wait_for_disconnect
from .sessions import Sessions
from .upstream import UpstreamClient, target_of

__all__ = ["Call", "CallLifecycle"]

log = logging.getLogger("branchpoint.call")


# full-history mode first matches the last this many messages of a longer history
_WINDOW = 32


def _upstream_time(seconds: float) -> None:
    ctx = current_request.get()
    if ctx is not None:
        ctx.upstream_seconds += seconds


class CallLifecycle:
    def __init__(self, *, tree: TreeStore, upstream: UpstreamClient, builder: RequestBuilder, compactor: Compactor,
                 leases: LeaseKeeper, metrics: Metrics, tasks: Background, lease_seconds: float,
                 default_mode: str = "delta", unsupported_tools: str = "drop", sessions: Sessions | None = None,
                 send_timeout: float = 0.0) -> None:
        self.tree = tree
        self.upstream = upstream
        self.builder = builder
        self.compactor = compactor
        self.leases = leases
        self.metrics = metrics
        self.tasks = tasks
        self.lease_seconds = lease_seconds
        self.default_mode = default_mode  # for calls that do not say (X-Context-Mode)
        self.unsupported_tools = unsupported_tools  # hosted tools over a chat upstream: "drop" or "refuse"
        self.sessions = sessions  # session headers; a new conversation continuing another (proxy/sessions.py)
        self.histories = transcript.KnownHistories()  # full history: what was hashed before, by conversation
        self.later = Later(tree, lease_seconds)
        self.outcomes = Outcomes(tree=tree, later=self.later, compactor=compactor, leases=leases, metrics=metrics,
                                 tasks=tasks)
        self.answers = Answers(upstream=upstream, outcomes=self.outcomes, tasks=tasks, send_timeout=send_timeout)

    # -- start -------------------------------------------------------------------------------

    async def _begin(self, call: Call, provider: str, secrets: tuple[str | None, ...]) -> tuple[Started, list[Any]]:
        """Start the call's node (its lease tracked from then on); the node and its parent's path."""
        digests, prefixes, system_hash = call.start_keys(self.histories)
        node_id = uuid7()
        if self.sessions is not None and call.mode == "full" and call.conversation_id is not None:
            await self.sessions.continue_from(call.tenant, call.conversation_id, prefixes)  # (first calls only)
        start = CallStart(
            tenant=call.tenant, conversation_id=call.conversation_id, node_id=node_id, new_tree_id=uuid7(),
            kind=call.kind, mode=call.mode, parent_mode=call.parent_mode, parent_id=call.parent_id,
            sent=call.items, digests=digests, prefixes=prefixes,
            system_hash=system_hash, lease_seconds=self.lease_seconds,
            model=call.body.get("model"), provider=provider, params=call.params,
            new_conversation_id=None if call.conversation_id else f"auto-{uuid7().hex}", ordinals=call.ordinals,
            api=call.api,
        )
        since = time.monotonic()  # (the lease the start sets runs out no earlier than a lease after this)
        try:
            if call.mode == "full" and len(prefixes) > _WINDOW:
                # the deepest match is almost always near the end (the new question, a round of
                # tool results): try a window there first, and the whole history only if needed
                skip = len(prefixes) - _WINDOW
                window_ordinals = None
                if call.ordinals is not None:
                    window_ordinals = [n - skip if n else 0 for n in call.ordinals if n == 0 or n > skip]
                begun = await self.tree.begin_call(msgspec.structs.replace(
                    start, sent=call.tail(skip, with_system=True), prefixes=prefixes[skip:], prefix_offset=skip,
                    ordinals=window_ordinals))
                if begun.mode == "window":
                    begun = await self.tree.begin_call(start)
            else:
                begun = await self.tree.begin_call(start)
        except StorageUnavailable as exc:
            if exc.sent:
                # the database may have started the call after we stopped waiting for it: then a
                # pending node holds the conversation; release it as soon as the database answers
                self.tasks.spawn(self.later.abandon(node_id))
            raise
        except asyncio.CancelledError:
            self.tasks.spawn(self.later.abandon(node_id))  # (the same: stopped while the start was in flight)
            raise
        except Refused as exc:  # busy, or the parent named is not there (or before a compaction)
            if isinstance(exc, Busy):
                self.metrics.busy_rejections.inc()
            raise from_refusal(exc, param=call.dialect.parent_param) from None
        stored = call.items if begun.mode == "delta" else call.tail(begun.start, with_system=begun.with_system)
        new_items = call.dialect.to_messages(stored, provider)
        started = Started(call, begun.conversation_id, node_id, begun.tree_id, begun.parent_id, begun.mode,
                           begun.matched, new_items, secrets,
                           begun=dataclasses.replace(begun, path=[]))  # (kept for the finish: not its path)
        ctx = current_request.get()
        if ctx is not None:
            ctx.conversation_id, ctx.node_id = started.conversation_id, str(node_id)
            ctx.context_mode, ctx.context_matched = started.mode, started.matched
        self.leases.track(started.tree_id, node_id, since)
        return started, begun.path

    # -- finish ------------------------------------------------------------------------------

    async def _fail(self, started: Started, failure: Failure, headers: list[tuple[str, str]] | None = None,
                    usage: dict[str, Any] | None = None) -> RawResponse:
        """Finish the node as failed and answer the client with the failure (a JSON body, whatever
        type the upstream's error page had)."""
        await self.outcomes.finish(started, failure.outcome, error=failure.error, usage=usage)
        if headers is not None:
            headers = [(k, v) for k, v in headers if k.lower() != "content-type"]
        return RawResponse(failure.status, started.call.dialect.error_body(failure),
                           (headers if headers is not None else started.headers()) + failure.headers())

    # -- run ---------------------------------------------------------------------------------

    async def run(self, call: Call, receive: Any) -> Any:
        """Run one call; returns the ASGI response (a ``RawResponse`` or a ``StreamRelay``).

        Only the server cancels a call's task: when its shutdown grace runs out
        (docs/behaviour.md#shutdown). A started call then ends as ``interrupted`` -- its node stored
        failed, the client answered 503 -- instead of the cancellation escaping as a bare 500 (one
        not started yet is answered so by the outermost layer, ``ObservabilityMiddleware``)."""
        if call.store and call.conversation_id is None and self.sessions is not None:  # /auto/v1: an app's session header
            call.conversation_id = self.sessions.named(call.headers)
        upstream = self.upstream.route(call.body.get("model"))
        way = crossing(call.dialect, upstream.api)
        dropped = way.prepare(call.params, unsupported_tools=self.unsupported_tools)  # (refusals: before any node)
        if dropped:  # recorded with the node: its replay leaves them out again
            call.dropped_tools, call.params = dropped, {**call.params, DROPPED_TOOLS: dropped}
        secrets = (call.client_key, upstream.api_key, *call.credentials)
        target = target_of(upstream, self.upstream.max_output(call.body.get("model")))
        if call.store:
            started, path = await self._begin(call, upstream.name, secrets)
        else:  # translated only: no node, no path, nothing to compact (docs/behaviour.md#the-messages-api)
            started, path = Started.unstored(call, call.dialect.to_messages(call.items, upstream.name), secrets), []
        # the client going away, watched until its answer is handed over: no upstream call is made
        # (after a compaction, say) or waited for once it has gone
        watch = asyncio.ensure_future(wait_for_disconnect(receive))
        try:
            if started.stored:
                path = await self.builder.readable(started.tree_id, path, target, tenant=call.tenant)
                path = await self.compactor.before_started(started, path)
            while True:
                built = self.builder.build(path, started.new_items, call.params, target, stream=call.stream, way=way,
                                           tree_id=started.tree_id if started.stored else None)
                if built.dropped:
                    self.metrics.pairing_drops.inc(len(built.dropped))
                    log.warning("pairing check dropped items", extra={
                        "conversation_id": started.conversation_id, "node_id": str(started.node_id),
                        "dropped": built.dropped})
                started.request_hash = built.sha256
                headers = self.upstream.request_headers(upstream, call.headers, call.client_key, own_body=True)
                request = self.upstream.build("POST", upstream, built.endpoint, headers=headers, content=built.payload,
                                              params=call.query if way.native and call.query else None)
                params = call.exchange_params()
                exchange = way.exchange(node_id=started.node_id, params={**params, **built.history} if built.history else params,
                                        provider=upstream.name)
                try:
                    return await self.answers(started, request, watch, exchange, own_key=bool(upstream.api_key))
                except Failed as failed:
                    # truncation "auto" (Responses): an overflow compacts the path and tries once more;
                    # the refused attempt stays a node of its own (a failed sibling: every attempt is one)
                    if failed.failure.outcome is Outcome.OVERFLOW and call.truncation_auto and call.compaction is None:
                        compacted = await self.compactor.before_retry(started, path, failed.failure.error)
                        if compacted is not None:
                            path = compacted
                            continue
                    return await self._fail(started, failed.failure, failed.headers, usage=failed.usage)
        except asyncio.CancelledError:
            if started.finished:  # (a node is finished once; ``Outcomes.finish`` handles its own cancellation)
                raise
            cancellation_handled()
            failure = interrupted("the proxy shut down before the upstream answered")
            log.warning("call interrupted by the shutdown", extra={"node_id": str(started.node_id)})
            await self.outcomes.finish(started, failure.outcome, error=failure.error)
            return RawResponse(failure.status, call.dialect.error_body(failure), started.headers())
        except BaseException as exc:
            if not started.finished:
                # a failure of the proxy's own is invalid, not transient: the head stays, so what
                # made it fail is not every later call's context (and fails them too)
                failure = Failure.from_error(exc) if isinstance(exc, BranchpointError) else Failure.of(
                    Outcome.INVALID, "server_error", "internal_error", f"the proxy failed: {type(exc).__name__}", 500)
                await asyncio.shield(self.outcomes.finish(started, failure.outcome, error=failure.error))
            if isinstance(exc, BranchpointError):
                exc.headers.update(dict(started.headers()))
            raise
        finally:
            watch.cancel()
