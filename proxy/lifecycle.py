"""The call lifecycle: one chat call with a conversation id, from the parsed request to the
stored node (SPEC §2-§4).

    resolve parent + take lease + insert pending node + read path   (storage: one round trip)
    assemble the context                                            (proxy.assembly, pure)
    call the upstream, relay the answer                             (proxy.upstream / proxy.relay)
    store the outcome, release the lease, move the head             (storage: one round trip)

Where the head goes after a call is decided in one place: ``moves_head``.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx
import msgspec

from storage import StorageError, uuid7

from .assembly import Target, assemble, build_body
from .errors import (
    BranchpointError,
    ConversationBusy,
    NodeNotFound,
    ParentBeforeCompaction,
    UpstreamBadResponse,
    UpstreamFailure,
)
from .http import RawResponse, encode_headers
from .observability import current_request
from .relay import StreamEnd, StreamRelay
from .upstream import Failure, classify, failure_from_exception, map_exceptions, response_headers

if TYPE_CHECKING:
    from .services import Services

__all__ = ["CallLifecycle", "ChatCall", "moves_head", "sent_hash"]

log = logging.getLogger("branchpoint.call")

_encode = msgspec.json.Encoder().encode
_encode_sorted = msgspec.json.Encoder(order="sorted").encode
_decode = msgspec.json.Decoder().decode

SUCCESS = "success"


def moves_head(kind: str, outcome: str) -> bool:
    """SPEC §4 -- after a call, does the conversation's head move to its node?

    ``outcome`` is ``success`` or a failure kind (``transient`` | ``overflow`` | ``invalid``).
    A success moves it; so does a transient failure (the failed node's ``sent`` items -- e.g.
    paid-for tool results -- stay in context and a retry hangs under or beside it). An overflow or
    an invalid request leaves it where it was, or every later turn would fail the same way.
    ``transform`` calls never move it.
    """
    return kind == "turn" and outcome in (SUCCESS, "transient")


def sent_hash(items: list[Any]) -> bytes:
    """sha256 of the canonical JSON of a call's new items: retry recognition is one comparison."""
    return hashlib.sha256(_encode_sorted(items)).digest()


@dataclass(slots=True)
class ChatCall:
    """A parsed chat request with a conversation id (built by the route)."""

    tenant: str
    conversation_id: str
    kind: str  # "turn" | "transform"
    parent_mode: str  # "head" | "root" | "node"
    parent_id: uuid.UUID | None
    body: dict[str, Any]  # the client's body; every field but messages is forwarded as is
    items: list[dict[str, Any]]  # body["messages"]: this call's new items
    stream: bool
    client_key: str | None
    headers: list[tuple[str, str]]  # incoming request headers (filtered when forwarded)


@dataclass(slots=True)
class _Started:
    call: ChatCall
    node_id: uuid.UUID
    tree_id: uuid.UUID
    parent_id: uuid.UUID | None
    params: dict[str, Any]
    request_hash: bytes | None = None
    secrets: tuple[str | None, ...] = ()  # keys an upstream error must never echo back
    finished: bool = False

    def headers(self) -> list[tuple[str, str]]:
        return [
            ("x-conversation-id", self.call.conversation_id),
            ("x-node-id", str(self.node_id)),
            ("x-parent-node-id", str(self.parent_id) if self.parent_id else "root"),
        ]


def _upstream_time(seconds: float) -> None:
    ctx = current_request.get()
    if ctx is not None:
        ctx.upstream_seconds += seconds


def _disconnected() -> Failure:
    error = {"type": "client_disconnected", "code": "client_disconnected",
             "message": "the client disconnected before the answer arrived", "status": None}
    return Failure("transient", error, 499, b"")


async def _wait_for_disconnect(receive: Any) -> None:
    while True:
        if (await receive())["type"] == "http.disconnect":
            return


class CallLifecycle:
    def __init__(self, services: Services) -> None:
        self.s = services
        self.lease_seconds = services.settings.server.lease_seconds

    # -- start -------------------------------------------------------------------------------

    async def _begin(self, call: ChatCall, upstream_name: str) -> tuple[_Started, list[Any]]:
        params = {k: v for k, v in call.body.items() if k != "messages"}
        node_id = uuid7()
        begun = await self.s.tree.begin_call(
            tenant=call.tenant,
            conversation_id=call.conversation_id,
            node_id=node_id,
            new_tree_id=uuid7(),
            kind=call.kind,
            parent_mode=call.parent_mode,  # type: ignore[arg-type]
            parent_id=call.parent_id,
            sent=call.items,
            sent_hash=sent_hash(call.items),
            lease_seconds=self.lease_seconds,
            model=call.body.get("model"),
            provider=upstream_name,
            params=params,
        )
        if begun.outcome == "busy":
            self.s.metrics.busy_rejections.inc()
            raise ConversationBusy(
                f"conversation {call.conversation_id!r} has a turn call in flight; retry when it has finished"
            )
        if begun.outcome == "parent_not_found":
            raise NodeNotFound(f"node {call.parent_id} is not part of conversation {call.conversation_id!r}",
                               param="X-Parent-Node-Id")
        if begun.outcome == "parent_before_compaction":
            raise ParentBeforeCompaction(
                f"node {call.parent_id} lies before a compaction of this conversation's path; "
                "it can no longer be edited here (fork from it, or move the head there first)",
                param="X-Parent-Node-Id",
            )
        assert begun.tree_id is not None
        started = _Started(call, node_id, begun.tree_id, begun.parent_id, params)
        return started, begun.path

    # -- finish ------------------------------------------------------------------------------

    async def _finish(self, started: _Started, *, outcome: str, received: list[Any] | None = None,
                      usage: dict[str, Any] | None = None, finish_reason: str | None = None,
                      error: dict[str, Any] | None = None) -> None:
        """Store the outcome and apply the head rule. Never raises. If the database is away,
        the outcome is stored in the background as soon as it is back (the lease is kept alive
        meanwhile); a node that still cannot be stored is reaped as interrupted in the end."""
        started.finished = True
        call = started.call
        if error is not None:
            error = {**error, "kind": outcome}  # which row of the SPEC §4 table applied
        store = functools.partial(
            self.s.tree.finish_call,
            tree_id=started.tree_id,
            node_id=started.node_id,
            status=SUCCESS if outcome == SUCCESS else "failed",
            received=received,
            usage=usage,
            finish_reason=finish_reason,
            error=error,
            request_hash=started.request_hash,
            move_head=moves_head(call.kind, outcome),
        )
        try:
            await store()
        except StorageError as exc:
            log.warning("could not store a call's outcome; retrying in the background",
                        extra={"node_id": str(started.node_id), "error": str(exc)})
            self.s.spawn(self._store_later(started, store, outcome, usage))
            return
        except Exception:
            log.exception("could not store the outcome of a call", extra={"node_id": str(started.node_id)})
            self.s.leases.untrack(started.node_id)
            return
        self._stored(started, outcome, usage, error)

    async def _store_later(self, started: _Started, store: Any, outcome: str, usage: dict[str, Any] | None) -> None:
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self.lease_seconds
        delay = 0.1
        while loop.time() < give_up:
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
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
        self.s.leases.untrack(started.node_id)  # the reaper takes it from here

    def _stored(self, started: _Started, outcome: str, usage: dict[str, Any] | None, error: dict[str, Any] | None) -> None:
        self.s.leases.untrack(started.node_id)
        call = started.call
        self.s.metrics.observe_call(call.kind, outcome, usage)
        if outcome == SUCCESS and call.kind == "turn":
            self.s.compactor.after_turn(tenant=call.tenant, conversation_id=call.conversation_id,
                                        tree_id=started.tree_id, head=started.node_id, model=call.body["model"],
                                        usage=usage, client_key=call.client_key)
        if outcome != SUCCESS:
            log.info("call failed", extra={"conversation_id": call.conversation_id, "node_id": str(started.node_id),
                                           "outcome": outcome, "code": (error or {}).get("code")})

    # -- run ---------------------------------------------------------------------------------

    async def run(self, call: ChatCall, receive: Any) -> Any:
        """Run one call; returns the ASGI response (a ``RawResponse`` or a ``StreamRelay``)."""
        upstream = self.s.upstream.route(call.body.get("model"))
        started, path = await self._begin(call, upstream.name)
        started.secrets = (call.client_key, upstream.api_key)
        ctx = current_request.get()
        if ctx is not None:
            ctx.conversation_id = call.conversation_id
            ctx.node_id = str(started.node_id)
        self.s.leases.track(started.tree_id, started.node_id)
        try:
            target = Target(upstream.name, upstream.accepts_reasoning)
            path = await self._readable(started.tree_id, path, target)
            if path:
                compacted = await self.s.compactor.before_call(
                    tenant=call.tenant, conversation_id=call.conversation_id, tree_id=started.tree_id,
                    kind=call.kind, path=path, new_items=call.items, model=call.body["model"],
                    client_key=call.client_key, call_node=started.node_id,
                    extra=[call.body[k] for k in ("tools", "functions") if call.body.get(k)],
                )
                if compacted is not None and compacted.compacted and compacted.node is not None:
                    path = [compacted.node]
                    started.parent_id = compacted.node.id
            assembled = assemble(path, call.items, target)
            if assembled.dropped:
                self.s.metrics.pairing_drops.inc(len(assembled.dropped))
                log.warning("pairing check dropped items", extra={
                    "conversation_id": call.conversation_id, "node_id": str(started.node_id),
                    "dropped": assembled.dropped})
            payload = build_body(started.params, assembled.messages, stream=call.stream)
            started.request_hash = hashlib.sha256(payload).digest()
            headers = self.s.upstream.request_headers(upstream, call.headers, call.client_key)
            request = self.s.upstream.build("POST", upstream, "chat/completions", headers=headers, content=payload)
            if call.stream:
                return await self._run_stream(started, request)
            return await self._run_json(started, request, receive)
        except BaseException as exc:
            if not started.finished:
                if isinstance(exc, BranchpointError):
                    err = {"type": exc.type, "code": exc.code, "message": exc.message, "status": None}
                else:
                    err = {"type": "server_error", "code": "internal_error",
                           "message": f"the proxy failed: {type(exc).__name__}", "status": None}
                await asyncio.shield(self._finish(started, outcome="transient", error=err))
            if isinstance(exc, BranchpointError):
                exc.headers.update(dict(started.headers()))
            raise

    async def _readable(self, tree_id: uuid.UUID, path: list[Any], target: Target) -> list[Any]:
        """SPEC §5: a compaction in a provider-specific (opaque) form that the target cannot read
        is unfolded: assembly follows ``compacted_from`` and uses the original path instead."""
        while path and path[0].kind == "compaction" and path[0].provider != target.provider:
            params = await self.s.tree.node_params(tree_id, path[0].id)
            if params.get("format", "text") != "opaque" or path[0].compacted_from is None:
                break
            original = await self.s.tree.path(tree_id, path[0].compacted_from)
            path = original + path[1:]
        return path

    async def _run_json(self, started: _Started, request: httpx.Request, receive: Any) -> RawResponse:
        send_task = asyncio.ensure_future(self.s.upstream.send(request))
        watch = asyncio.ensure_future(_wait_for_disconnect(receive))
        t0 = time.perf_counter()
        try:
            await asyncio.wait((send_task, watch), return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
            _upstream_time(time.perf_counter() - t0)
        if not send_task.done():  # the client gave up first
            send_task.cancel()
            await asyncio.gather(send_task, return_exceptions=True)
            failure = _disconnected()
            await self._finish(started, outcome=failure.kind, error=failure.error)
            return RawResponse(499, failure.body, started.headers())
        try:
            response = send_task.result()
        except UpstreamFailure as exc:
            failure = failure_from_exception(exc)
            await self._finish(started, outcome=failure.kind, error=failure.error)
            return RawResponse(failure.status, failure.body, started.headers())

        relay_headers = response_headers(response.headers) + started.headers()
        content = response.content
        if response.status_code >= 300 or response.status_code < 200:
            failure = classify(response.status_code, content, started.secrets)
            await self._finish(started, outcome=failure.kind, error=failure.error)
            return RawResponse(failure.status, failure.body, relay_headers)
        try:
            data = _decode(content)
            message = data["choices"][0]["message"]
            if not isinstance(message, dict):
                raise TypeError("message is not an object")
        except (msgspec.DecodeError, RecursionError, KeyError, IndexError, TypeError) as exc:
            failure = self._bad_success(content, exc, started.secrets)
            await self._finish(started, outcome=failure.kind, error=failure.error)
            return RawResponse(failure.status, failure.body, started.headers())
        await self._finish(
            started,
            outcome=SUCCESS,
            received=[message],
            usage=data.get("usage"),
            finish_reason=data["choices"][0].get("finish_reason"),
        )
        return RawResponse(response.status_code, content, relay_headers)

    @staticmethod
    def _bad_success(content: bytes, exc: Exception, secrets: tuple[str | None, ...]) -> Failure:
        """A 2xx whose body is not a completion: an error body in disguise, or garbage."""
        try:
            data = _decode(content)
        except (msgspec.DecodeError, RecursionError):
            data = None
        if isinstance(data, dict) and data.get("error"):
            failure = classify(502, content, secrets)
            return Failure(failure.kind, {**failure.error, "status": 200}, 502, failure.body)
        err = UpstreamBadResponse(f"the upstream answered 2xx without a chat completion ({type(exc).__name__})")
        return failure_from_exception(err)

    async def _run_stream(self, started: _Started, request: httpx.Request) -> Any:
        t0 = time.perf_counter()
        try:
            response = await self.s.upstream.send(request, stream=True)
        except UpstreamFailure as exc:
            failure = failure_from_exception(exc)
            await self._finish(started, outcome=failure.kind, error=failure.error)
            return RawResponse(failure.status, failure.body, started.headers())
        if response.status_code != 200:
            try:
                content = await self.s.upstream.read_rest(response)
            except UpstreamFailure:
                content = b""
            failure = classify(response.status_code, content, started.secrets)
            await self._finish(started, outcome=failure.kind, error=failure.error)
            return RawResponse(failure.status, failure.body, response_headers(response.headers) + started.headers())

        if not response.headers.get("content-type", "").startswith("text/event-stream"):
            # a stream was asked for and something else came back: read it and refuse it whole
            try:
                content = await self.s.upstream.read_rest(response)
            except UpstreamFailure as exc:
                failure = failure_from_exception(exc)
            else:
                failure = self._bad_success(content, ValueError("not an event stream"), started.secrets)
            await self._finish(started, outcome=failure.kind, error=failure.error)
            return RawResponse(failure.status, failure.body, started.headers())

        wants_usage = bool((started.call.body.get("stream_options") or {}).get("include_usage")) \
            if isinstance(started.call.body.get("stream_options"), dict) else False

        async def chunks() -> AsyncIterator[bytes]:
            with map_exceptions():
                async for chunk in response.aiter_bytes():
                    yield chunk

        async def on_end(end: StreamEnd) -> None:
            _upstream_time(time.perf_counter() - t0)
            if end.failure is None:
                await self._finish(started, outcome=SUCCESS, received=[end.accumulator.message()],
                                   usage=end.accumulator.usage, finish_reason=end.accumulator.finish_reason)
            else:
                kind, error = end.failure
                await self._finish(started, outcome=kind, error=error, usage=end.accumulator.usage)

        headers = response_headers(response.headers) + started.headers()
        if not any(k.lower() == "content-type" for k, _ in headers):
            headers.append(("content-type", "text/event-stream"))
        return StreamRelay(
            chunks(),
            headers=encode_headers(headers),
            on_end=on_end,
            close_upstream=response.aclose,
            classify_error=lambda error: _classify_stream_error(error, started.secrets),
            strip_usage=not wants_usage,
            background=self.s.background,
        )


def _classify_stream_error(error: dict[str, Any], secrets: tuple[str | None, ...]) -> tuple[str, dict[str, Any]]:
    """An error event inside a stream: ``overflow`` if it says so, else ``transient``."""
    body = msgspec.json.encode({"error": error})
    failure = classify(400, body, secrets)
    if failure.kind != "overflow":
        failure = classify(502, body, secrets)
    return failure.kind, {**failure.error, "status": None}
