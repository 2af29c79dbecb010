"""The call lifecycle: one chat call with a conversation id, from the parsed request to the stored
node (docs/behaviour.md#the-chat-endpoint).

    begin: conversation, lease, parent, pending node, path read       (storage: one round trip)
    maybe compact, build the exact upstream body                      (proxy.compaction, proxy.builder)
    call the upstream, relay the answer                               (proxy.upstream, proxy.relay)
    finish: outcome stored, lease released, head moved by the rule   (storage: one round trip)

Every way out of a started call goes through ``_finish`` (or ``_fail``, which also answers the
client), so a started node is always finished: with its answer, or with a ``Failure`` whose
``Outcome`` the head rule (``bp_can_be_head`` in storage/functions.sql) reads.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import msgspec

from storage import (
    BeforeCompaction,
    Busy,
    CallFinish,
    CallStart,
    NodeMissing,
    Outcome,
    StorageError,
    StorageUnavailable,
    TreeStore,
    transcript,
    uuid7,
)

from .background import Background
from .builder import RequestBuilder
from .compaction import Compactor
from .completion import NotACompletion
from .errors import BranchpointError, ConversationBusy, NodeNotFound, ParentBeforeCompaction, UpstreamFailure
from .exchanges import Exchange, exchange_for
from .failures import Failure, NodeError, cancellation_handled, classify, from_stream_error, interrupted, not_a_completion
from .http import RawResponse, encode_headers
from .leases import LeaseKeeper
from .metrics import Metrics
from .observability import current_request
from .relay import StreamEnd, StreamRelay, client_disconnected
from .responses import for_chat
from .responses import items as responses_items
from .upstream import UpstreamClient, response_headers, target_of

__all__ = ["CallLifecycle", "ChatCall"]

log = logging.getLogger("branchpoint.call")


@dataclass(slots=True)
class ChatCall:
    """A parsed request to be stored (built by the route): a chat call, or a Responses call."""

    tenant: str
    conversation_id: str | None  # None: full-history mode finds (or makes) the conversation by content
    kind: str  # "turn" | "transform"
    mode: str  # "delta": messages are the new items | "full": the client's whole history
    parent_mode: str  # "head" | "root" | "node" (delta mode)
    parent_id: uuid.UUID | None
    body: dict[str, Any]  # the client's body; every field but messages is forwarded as is
    items: list[dict[str, Any]]  # body["messages"]
    stream: bool
    client_key: str | None
    headers: list[tuple[str, str]]  # incoming request headers (filtered when forwarded)
    credentials: tuple[str, ...] = ()  # every credential the client sent: masked wherever echoed
    api: str = "chat"  # "chat" | "responses": the client's API, and the format of ``items``
    messages: list[dict[str, Any]] = field(default_factory=list)  # ``items`` read as chat messages
    ordinals: list[int] | None = None  # Responses: the message each item stands for (items.convert)

    def __post_init__(self) -> None:
        if self.api == "chat":
            self.messages = self.items

    @property
    def params(self) -> dict[str, Any]:
        """The request's other fields, stored with the node (a Responses call's ``instructions``
        are also its first item, a system message: the system rule treats them as such)."""
        skip = ("input",) if self.api == "responses" else ("messages",)
        return {k: v for k, v in self.body.items() if k not in skip}

    def tail(self, skip: int, *, with_system: bool) -> list[dict[str, Any]]:
        """The items after the first ``skip`` non-system messages they stand for."""
        if self.ordinals is None:
            return transcript.tail(self.items, skip, with_system=with_system)
        return responses_items.tail(self.items, self.ordinals, skip, with_system=with_system)


@dataclass(slots=True)
class _Started:
    call: ChatCall
    conversation_id: str
    node_id: uuid.UUID
    tree_id: uuid.UUID
    parent_id: uuid.UUID | None
    mode: str  # the mode that handled the call (a delta call resending its history: full)
    matched: int  # full mode: how many of the client's non-system messages matched stored nodes
    new_items: list[dict[str, Any]]  # what this node adds to its parent's path
    secrets: tuple[str | None, ...]  # credentials an upstream error must never echo back
    request_hash: bytes | None = None
    finished: bool = False

    @property
    def leased(self) -> bool:
        return self.mode == "delta" and self.call.kind == "turn"

    def headers(self) -> list[tuple[str, str]]:
        return [
            ("x-conversation-id", self.conversation_id),
            ("x-node-id", str(self.node_id)),
            ("x-parent-node-id", str(self.parent_id) if self.parent_id else "root"),
            ("x-context-mode", self.mode),
            ("x-context-matched", str(self.matched)),
        ]


# full-history mode first matches the last this many messages of a longer history
_WINDOW = 32


def _upstream_time(seconds: float) -> None:
    ctx = current_request.get()
    if ctx is not None:
        ctx.upstream_seconds += seconds


async def _wait_for_disconnect(receive: Any) -> None:
    while True:
        if (await receive())["type"] == "http.disconnect":
            return


class CallLifecycle:
    def __init__(self, *, tree: TreeStore, upstream: UpstreamClient, builder: RequestBuilder, compactor: Compactor,
                 leases: LeaseKeeper, metrics: Metrics, tasks: Background, lease_seconds: float,
                 default_mode: str = "delta") -> None:
        self.tree = tree
        self.upstream = upstream
        self.builder = builder
        self.compactor = compactor
        self.leases = leases
        self.metrics = metrics
        self.tasks = tasks
        self.lease_seconds = lease_seconds
        self.default_mode = default_mode  # for calls that do not say (X-Context-Mode)

    # -- start -------------------------------------------------------------------------------

    async def _begin(self, call: ChatCall, provider: str, secrets: tuple[str | None, ...]) -> tuple[_Started, list[Any]]:
        node_id = uuid7()
        digests = transcript.digests(call.messages)
        # the hashes of the history's prefixes: full mode matches them; in delta mode they let the
        # safety net recognise a client resending its history (it takes a user and an answer)
        prefixes = transcript.prefix_hashes(digests) if call.mode == "full" or len(digests) >= 2 else []
        start = CallStart(
            tenant=call.tenant, conversation_id=call.conversation_id, node_id=node_id, new_tree_id=uuid7(),
            kind=call.kind, mode=call.mode, parent_mode=call.parent_mode, parent_id=call.parent_id,
            sent=call.items, digests=digests if call.mode == "delta" else [], prefixes=prefixes,
            system_hash=transcript.system_hash(call.messages), lease_seconds=self.lease_seconds,
            model=call.body.get("model"), provider=provider, params=call.params,
            new_conversation_id=None if call.conversation_id else f"auto-{uuid7().hex}", ordinals=call.ordinals,
            api=call.api,
        )
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
                self.tasks.spawn(self._abandon(node_id))
            raise
        except asyncio.CancelledError:
            self.tasks.spawn(self._abandon(node_id))  # (the same: stopped while the start was in flight)
            raise
        except Busy as exc:
            self.metrics.busy_rejections.inc()
            raise ConversationBusy(str(exc)) from None
        except NodeMissing as exc:
            raise NodeNotFound(str(exc), param="X-Parent-Node-Id") from None
        except BeforeCompaction as exc:
            raise ParentBeforeCompaction(str(exc), param="X-Parent-Node-Id") from None
        stored = call.items if begun.mode == "delta" else call.tail(begun.start, with_system=begun.with_system)
        new_items = responses_items.to_messages(stored, provider) if call.api == "responses" else stored
        started = _Started(call, begun.conversation_id, node_id, begun.tree_id, begun.parent_id, begun.mode,
                           begun.matched, new_items, secrets)
        return started, begun.path

    async def _attempts(self) -> AsyncIterator[None]:
        """Retries while the database is away: one attempt after 0.1 s, then doubling up to 5 s,
        for ``lease_seconds`` -- after that, the reaper finishes what is left."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self.lease_seconds
        delay = 0.1
        while loop.time() < give_up:
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
            yield

    async def _abandon(self, node_id: uuid.UUID) -> None:
        """Reap the node of a call whose start was not confirmed, if the database did create it.
        Tried until it is found reaped or finished, or for ``lease_seconds`` (the reaper's turn)."""
        async for _ in self._attempts():
            try:
                outcome = await self.tree.abandon(node_id)
            except StorageError:
                continue
            if outcome != "missing":  # reaped now, or finished some other way
                if outcome == "reaped":
                    log.warning("released the node of a call whose start was not confirmed", extra={"node_id": str(node_id)})
                return
            # missing: the start never committed -- or has not yet; look again a little later

    # -- finish ------------------------------------------------------------------------------

    async def _finish(self, started: _Started, outcome: Outcome, *, received: list[Any] | None = None,
                      usage: dict[str, Any] | None = None, finish_reason: str | None = None,
                      error: NodeError | None = None, received_messages: list[Any] | None = None) -> None:
        """Store the outcome; the head follows the head rule. Never raises. If the database is
        away, the outcome is stored in the background as soon as it is back (the lease is kept
        alive meanwhile); a node that still cannot be stored is reaped as interrupted in the end.
        Stopped in flight (the shutdown's grace ran out), it goes on in the background too, and the
        cancellation counts as handled: the caller answers its client as if it had finished."""
        started.finished = True
        if finish_reason is not None and "\x00" in finish_reason:
            finish_reason = finish_reason.replace("\x00", "")  # a text column; the answer itself keeps it
        finish = CallFinish(
            outcome=outcome, received=received, usage=usage, finish_reason=finish_reason, error=error,
            request_hash=started.request_hash, leased=started.leased,
            received_digests=transcript.digests(received_messages if received_messages is not None else received or ()),
        )
        store = functools.partial(self.tree.finish_call, started.tree_id, started.node_id, finish,
                                  tenant=started.call.tenant, conversation_id=started.conversation_id)
        try:
            await store()
        except StorageError as exc:
            log.warning("could not store a call's outcome; retrying in the background",
                        extra={"node_id": str(started.node_id), "error": str(exc)})
            self.tasks.spawn(self._store_later(started, store, outcome, usage))
            return
        except asyncio.CancelledError:  # (the shutdown waits for the background)
            self.tasks.spawn(self._store_later(started, store, outcome, usage))
            cancellation_handled()
            return
        except Exception:
            log.exception("could not store the outcome of a call", extra={"node_id": str(started.node_id)})
            self.leases.untrack(started.node_id)
            return
        self._stored(started, outcome, usage, error)

    async def _fail(self, started: _Started, failure: Failure, headers: list[tuple[str, str]] | None = None,
                    usage: dict[str, Any] | None = None) -> RawResponse:
        """Finish the node as failed and answer the client with the failure."""
        await self._finish(started, failure.outcome, error=failure.error, usage=usage)
        return RawResponse(failure.status, failure.body, headers if headers is not None else started.headers())

    async def _store_later(self, started: _Started, store: Callable[[], Any], outcome: Outcome,
                           usage: dict[str, Any] | None) -> None:
        async for _ in self._attempts():
            try:
                await store()
            except StorageError:
                continue
            except Exception:
                log.exception("could not store the outcome of a call", extra={"node_id": str(started.node_id)})
                break
            log.info("stored a call's outcome after the database came back", extra={"node_id": str(started.node_id)})
            self._stored(started, outcome, usage, None)
            return
        self.leases.untrack(started.node_id)  # the reaper takes it from here

    def _stored(self, started: _Started, outcome: Outcome, usage: dict[str, Any] | None, error: NodeError | None) -> None:
        self.leases.untrack(started.node_id)
        call = started.call
        self.metrics.observe_call(call.kind, outcome.value, usage)
        if outcome is Outcome.SUCCESS and call.kind == "turn":
            self.compactor.after_turn(tenant=call.tenant, conversation_id=started.conversation_id,
                                      tree_id=started.tree_id, head=started.node_id, model=call.body["model"],
                                      usage=usage, client_key=call.client_key)
        if outcome is not Outcome.SUCCESS:
            log.info("call failed", extra={"conversation_id": started.conversation_id, "node_id": str(started.node_id),
                                           "outcome": outcome.value, "code": error.code if error else None})

    # -- run ---------------------------------------------------------------------------------

    async def run(self, call: ChatCall, receive: Any) -> Any:
        """Run one call; returns the ASGI response (a ``RawResponse`` or a ``StreamRelay``).

        Only the server cancels a call's task: when its shutdown grace runs out
        (docs/behaviour.md#shutdown). A started call then ends as ``interrupted`` -- its node stored
        failed, the client answered 503 -- instead of the cancellation escaping as a bare 500 (one
        not started yet is answered so by the outermost layer, ``ObservabilityMiddleware``)."""
        upstream = self.upstream.route(call.body.get("model"))
        if call.api == "chat" and upstream.api == "responses":
            for_chat.check_fields(call.params)  # what a Responses upstream cannot honour is refused before any node
        started, path = await self._begin(call, upstream.name, (call.client_key, upstream.api_key, *call.credentials))
        ctx = current_request.get()
        if ctx is not None:
            ctx.conversation_id = started.conversation_id
            ctx.node_id = str(started.node_id)
        self.leases.track(started.tree_id, started.node_id)
        try:
            target = target_of(upstream)
            path = await self.builder.readable(started.tree_id, path, target)
            path = await self._compact_first(started, path)
            built = self.builder.build(path, started.new_items, call.params, target, stream=call.stream, api=call.api,
                                       tree_id=started.tree_id)
            if built.dropped:
                self.metrics.pairing_drops.inc(len(built.dropped))
                log.warning("pairing check dropped items", extra={
                    "conversation_id": started.conversation_id, "node_id": str(started.node_id), "dropped": built.dropped})
            started.request_hash = built.sha256
            headers = self.upstream.request_headers(upstream, call.headers, call.client_key)
            request = self.upstream.build("POST", upstream, built.endpoint, headers=headers, content=built.payload)
            exchange = exchange_for(call.api, target.api, node_id=started.node_id, params=call.params,
                                    instructions=call.body.get("instructions"), provider=upstream.name)
            if call.stream:
                return await self._run_stream(started, request, exchange)
            return await self._run_json(started, request, receive, exchange)
        except asyncio.CancelledError:
            if started.finished:  # (a node is finished once; ``_finish`` handles its own cancellation)
                raise
            cancellation_handled()
            failure = interrupted("the proxy shut down before the upstream answered")
            log.warning("call interrupted by the shutdown", extra={"node_id": str(started.node_id)})
            await self._finish(started, failure.outcome, error=failure.error)
            return RawResponse(failure.status, failure.body, started.headers())
        except BaseException as exc:
            if not started.finished:
                failure = Failure.from_error(exc if isinstance(exc, BranchpointError) else BranchpointError(
                    f"the proxy failed: {type(exc).__name__}"))
                await asyncio.shield(self._finish(started, failure.outcome, error=failure.error))
            if isinstance(exc, BranchpointError):
                exc.headers.update(dict(started.headers()))
            raise

    async def _compact_first(self, started: _Started, path: list[Any]) -> list[Any]:
        """Compact synchronously when the request would be above the hard threshold; the call
        then hangs under the compaction node, whose path is just itself."""
        if not path:
            return path
        call = started.call
        # how the compaction is applied: a delta turn holds the lease; other calls hold none
        apply_mode = call.kind if call.kind == "transform" or started.mode == "delta" else "full"
        compacted = await self.compactor.before_call(
            tenant=call.tenant, conversation_id=started.conversation_id, tree_id=started.tree_id,
            kind=apply_mode, path=path, new_items=started.new_items, model=call.body["model"],
            client_key=call.client_key, call_node=started.node_id,
            extra=[call.body[k] for k in ("tools", "functions") if call.body.get(k)],
        )
        if compacted is not None and compacted.compacted and compacted.node is not None:
            started.parent_id = compacted.node.id
            return [compacted.node]
        return path

    async def _run_json(self, started: _Started, request: httpx.Request, receive: Any, exchange: Exchange) -> RawResponse:
        send_task = asyncio.ensure_future(self.upstream.fetch(request))
        watch = asyncio.ensure_future(_wait_for_disconnect(receive))
        t0 = time.perf_counter()
        try:
            await asyncio.wait((send_task, watch), return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            send_task.cancel()  # (stopped while waiting: the upstream request goes too)
            raise
        finally:
            watch.cancel()
            _upstream_time(time.perf_counter() - t0)
        if not send_task.done():  # the client gave up first
            send_task.cancel()
            await asyncio.gather(send_task, return_exceptions=True)
            return await self._fail(started, client_disconnected())
        try:
            response, content = send_task.result()
        except UpstreamFailure as exc:
            return await self._fail(started, Failure.from_error(exc))

        relay_headers = response_headers(response.headers) + started.headers()
        if not 200 <= response.status_code < 300:
            return await self._fail(started, classify(response.status_code, content, started.secrets), relay_headers)
        try:
            answer = exchange.answer(content)
        except NotACompletion as exc:
            return await self._fail(started, not_a_completion(content, str(exc), started.secrets))
        await self._finish(started, Outcome.SUCCESS, received=answer.received, usage=answer.usage,
                           finish_reason=answer.finish_reason, received_messages=answer.messages)
        return RawResponse(response.status_code, answer.body, relay_headers)

    async def _run_stream(self, started: _Started, request: httpx.Request, exchange: Exchange) -> Any:
        t0 = time.perf_counter()
        try:
            response = await self.upstream.send(request)
        except UpstreamFailure as exc:
            return await self._fail(started, Failure.from_error(exc))
        if response.status_code != 200:
            try:
                content = await self.upstream.read_rest(response)
            except UpstreamFailure:
                content = b""
            return await self._fail(started, classify(response.status_code, content, started.secrets),
                                    response_headers(response.headers) + started.headers())
        if not response.headers.get("content-type", "").startswith("text/event-stream"):
            # a stream was asked for and something else came back: read it and refuse it whole
            try:
                content = await self.upstream.read_rest(response)
            except UpstreamFailure as exc:
                return await self._fail(started, Failure.from_error(exc))
            return await self._fail(started, not_a_completion(content, "not an event stream", started.secrets))

        options = started.call.body.get("stream_options")
        wants_usage = isinstance(options, dict) and bool(options.get("include_usage"))

        async def on_end(end: StreamEnd) -> None:
            _upstream_time(time.perf_counter() - t0)
            t = end.translator
            if end.failure is None:
                received = t.received()
                await self._finish(started, Outcome.SUCCESS, received=received, usage=t.usage,
                                   finish_reason=t.finish_reason, received_messages=exchange.messages(received))
            else:
                await self._finish(started, end.failure.outcome, error=end.failure.error, usage=t.usage)

        headers = response_headers(response.headers) + started.headers()
        if not any(k.lower() == "content-type" for k, _ in headers):
            headers.append(("content-type", "text/event-stream"))
        return StreamRelay(
            self.upstream.chunks(response),
            headers=encode_headers(headers),
            on_end=on_end,
            close_upstream=response.aclose,
            classify_error=lambda error: from_stream_error(error, started.secrets),
            translator=exchange.translator(wants_usage=wants_usage),
            background=self.tasks,
        )

