"""A started call's upstream answer: the request sent, the answer (or stream) relayed to the
client and its outcome stored -- through one ladder of failures, for answers and streams alike
(docs/behaviour.md#failures).

    the client gone before the request goes out, or while it waits   client_disconnected
    the upstream unreachable, timed out, cut                          UpstreamFailure -> Failure
    an error status                                                   classify
    a body that is not what was asked for                             not_a_completion
    an answer whole: stored, then answered                            Outcomes.finish
    a stream: relayed event by event, stored when it ends             StreamRelay (proxy/relay.py)

Each rung that fails the call raises ``Failed``; the lifecycle (proxy/lifecycle.py) decides what
follows -- a retry after compacting an overflow, or the failure stored and answered.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import httpx

from storage import Outcome

from . import surrogates
from .background import Background
from .call import Started
from .dialects import Exchange
from .dialects.chat import NotACompletion
from .errors import UpstreamFailure, UpstreamTooLarge
from .failures import Failure, classify, from_stream_error, not_a_completion, reaped
from .http import RawResponse, encode_headers
from .observability import current_request
from .outcomes import Outcomes
from .relay import StreamEnd, StreamRelay, client_disconnected, relay_error
from .secrets import Masker
from .upstream import UpstreamClient, response_headers

__all__ = ["Answers", "Failed"]

log = logging.getLogger("branchpoint.call")


def _upstream_time(seconds: float) -> None:
    ctx = current_request.get()
    if ctx is not None:
        ctx.upstream_seconds += seconds


# an answer read for longer than this (a large one) lets the event loop look at the client's
# connection before it is stored: the loop did not, while it was busy reading
_LONG_READ = 0.002


async def _gone(watch: asyncio.Future[None], reading: float) -> bool:
    """Has the client gone? After a long read, the loop first takes in what happened meanwhile:
    a connection closed then reaches ``watch`` a few turns of the loop after the loop sees it
    (four, with uvicorn over uvloop) -- given a millisecond at most."""
    if not watch.done() and reading > _LONG_READ:
        await asyncio.wait((watch,), timeout=0.001)
    return watch.done()


class Failed(Exception):
    """A rung of the failure ladder: the call fails with ``failure`` (answered with ``headers``,
    else the node's; ``usage``: what the upstream said it spent, when it answered)."""

    def __init__(self, failure: Failure, headers: list[tuple[str, str]] | None = None,
                 usage: dict[str, Any] | None = None) -> None:
        self.failure = failure
        self.headers = headers
        self.usage = usage


class Answers:
    """The ladder, over the parts it needs: the upstream client, the outcome store and the
    background tasks a stream's end may leave."""

    def __init__(self, *, upstream: UpstreamClient, outcomes: Outcomes, tasks: Background, send_timeout: float = 0.0) -> None:
        self.upstream = upstream
        self.outcomes = outcomes
        self.tasks = tasks
        self.send_timeout = send_timeout  # a stream's client that takes nothing this long has left (client_send_timeout)

    async def __call__(self, started: Started, request: httpx.Request, watch: asyncio.Future[None], exchange: Exchange,
                       *, own_key: bool = False) -> Any:
        """The upstream's answer, relayed: a stream as a ``StreamRelay``, an answer as a
        ``RawResponse``, both after the same rungs -- the upstream unreachable or cut
        (``UpstreamFailure``), the client gone first, an error status (``classify``), a body that
        is not what was asked for (``not_a_completion``) -- each raising ``Failed``."""
        stream = started.call.stream
        t0 = time.perf_counter()
        try:
            response, content = await self._response(started, request, watch, own_key=own_key)
        except Failed:
            if stream:  # (a stream's upstream time is counted when it ends -- and when it never began)
                _upstream_time(time.perf_counter() - t0)
            raise
        relay_headers = response_headers(response.headers, started.secrets, own_key=own_key) + started.headers()
        if stream:
            return self._relay(started, response, relay_headers, exchange, t0)
        read = time.perf_counter()
        try:
            answer = exchange.answer(Masker(started.secrets).bytes(content))  # (credentials echoed: masked)
        except NotACompletion as exc:
            raise Failed(not_a_completion(content, str(exc), started.secrets, response.status_code)) from None
        if await _gone(watch, time.perf_counter() - read):
            # the client gave up while the answer was read: it never had it, so it is nobody's
            # context -- an SDK that timed out sends the question again, to hang beside this node
            raise Failed(client_disconnected("the client disconnected before the answer reached it"),
                         usage=answer.usage)  # (paid for all the same: counted)
        # the client's response is made whole before the answer is stored: once stored it is the
        # next call's context, so nothing may fail between the two (a 500 the client retries, its
        # question piling up under answers it never got)
        reply = RawResponse(response.status_code, answer.body, relay_headers)
        if not await self.outcomes.finish(started, Outcome.SUCCESS, received=answer.received, usage=answer.usage,
                                          finish_reason=answer.finish_reason, received_messages=answer.messages):
            failure = reaped()
            return RawResponse(failure.status, started.call.dialect.error_body(failure), started.headers())
        return reply

    async def _response(self, started: Started, request: httpx.Request, watch: asyncio.Future[None], *,
                        own_key: bool = False) -> tuple[httpx.Response, bytes]:
        """The upstream's successful response: a stream's head (its events still to come), or an
        answer read whole -- waited for while ``watch`` looks out for the client going away (then
        the upstream request is dropped; none is sent once it has gone)."""
        if watch.done():
            raise Failed(client_disconnected())
        stream = started.call.stream
        task = asyncio.ensure_future(self.upstream.send(request) if stream else self.upstream.fetch(request))
        t0 = time.perf_counter()
        try:
            await asyncio.wait((task, watch), return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            task.cancel()  # (stopped while waiting: the upstream request goes too)
            raise
        finally:
            if not stream:  # (a stream's upstream time is counted when it ends)
                _upstream_time(time.perf_counter() - t0)
        if not task.done():  # the client gave up first
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            raise Failed(client_disconnected())
        if not stream:
            try:
                response, content = task.result()
            except UpstreamFailure as exc:
                raise Failed(Failure.from_error(exc)) from None
            if not 200 <= response.status_code < 300:
                raise Failed(classify(response.status_code, content, started.secrets),
                              response_headers(response.headers, started.secrets, own_key=own_key) + started.headers())
            return response, content
        try:
            response = task.result()
        except UpstreamFailure as exc:
            raise Failed(Failure.from_error(exc)) from None
        if response.status_code == 200 and response.headers.get("content-type", "").startswith("text/event-stream"):
            return response, b""
        try:
            content = await self.upstream.read_rest(response)
        except UpstreamFailure as exc:
            if response.status_code == 200 or isinstance(exc, UpstreamTooLarge):
                raise Failed(Failure.from_error(exc)) from None
            content = b""  # (cut while reading an error: the status says enough)
        if response.status_code != 200:
            raise Failed(classify(response.status_code, content, started.secrets),
                          response_headers(response.headers, started.secrets, own_key=own_key) + started.headers())
        # a stream was asked for and something else came back: refused whole
        raise Failed(not_a_completion(content, "not an event stream", started.secrets, response.status_code))

    def _relay(self, started: Started, response: httpx.Response, headers: list[tuple[str, str]], exchange: Exchange,
               t0: float) -> StreamRelay:
        options = started.call.body.get("stream_options")
        wants_usage = isinstance(options, dict) and bool(options.get("include_usage"))

        async def on_end(end: StreamEnd) -> Failure | None:
            _upstream_time(time.perf_counter() - t0)
            t = end.translator
            failure, usage = end.failure, end.usage
            if failure is None:
                try:
                    received = t.received()
                    received = surrogates.mend(received)  # (lone surrogates an event kept: halves joined, made valid)
                    messages = exchange.messages(received)
                except Exception as exc:  # (an answer that cannot be read is a failed node, never a pending one)
                    log.exception("a streamed answer could not be read")
                    failure = relay_error(exc)
                else:
                    stored = await self.outcomes.finish(started, Outcome.SUCCESS, received=received, usage=usage,
                                                        finish_reason=t.finish_reason, received_messages=messages)
                    return None if stored else reaped()
            await self.outcomes.finish(started, failure.outcome, error=failure.error, usage=usage)
            return None if failure is end.failure else failure

        if not any(k.lower() == "content-type" for k, _ in headers):
            headers.append(("content-type", "text/event-stream"))
        return StreamRelay(
            chunks=self.upstream.chunks(response),
            headers=encode_headers(headers),
            on_end=on_end,
            close_upstream=response.aclose,
            classify_error=lambda error: from_stream_error(error, started.secrets),
            translator=exchange.translator(wants_usage=wants_usage, secrets=started.secrets),
            background=self.tasks,
            send_timeout=self.send_timeout,
        )
