"""The ``Forwarder``: one request relayed to the upstream its model routes to, and the answer back,
untouched and unstored -- the pass-through routes' work (``proxy.routes.passthrough``), and the
chat and Responses routes' for a call that names no conversation."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import msgspec
from litestar import Request
from litestar.types import ASGIApp

from .auth import Caller
from .bytes_relay import OPENAI_ERRORS, BytesRelay, ErrorVoice
from .errors import NotFound, UpstreamFailure
from .http import RawResponse, encode_headers, method_of
from .masked_events import event_masker, masked_events
from .observability import current_request
from .secrets import BytesMasker, redact_bytes
from .surrogates import loads
from .upstream import UpstreamClient, response_headers

if TYPE_CHECKING:
    from config import Upstream

    from .routes.common import RequestHeaders

__all__ = ["Forwarder"]


class _ModelOnly(msgspec.Struct):
    model: str | None = None


_model_decoder = msgspec.json.Decoder(_ModelOnly)


def _model_of(body: bytes) -> str | None:
    if not body or body[:1] not in (b"{", b" ", b"\n", b"\t", b"\r"):
        return None
    try:
        return _model_decoder.decode(body).model
    except msgspec.DecodeError:  # (a lone surrogate escape, proxy.surrogates: read all of it, then)
        try:
            model = loads(body)
        except (msgspec.DecodeError, RecursionError):
            return None
        model = model.get("model") if isinstance(model, dict) else None
        return model if isinstance(model, str) else None
    except (msgspec.ValidationError, RecursionError):
        return None


# What a call to a model is: with ``[server] upstream_objects = "refuse"``, the only routes passed
# through to an upstream whose configured key all tenants share (docs/behaviour.md#auth-and-tenancy)
_CALLS = frozenset({
    "chat/completions", "completions", "responses", "responses/input_tokens", "messages", "messages/count_tokens",
    "embeddings", "moderations", "audio/speech", "audio/transcriptions", "audio/translations",
    "images/generations", "images/edits", "images/variations",
})
_STORED_UPSTREAM = ("chat/completions", "responses")  # (an upstream may keep these calls' answers)


def _a_call(method: str, path: str) -> bool:
    return (method == "POST" and path in _CALLS) or (method in ("GET", "HEAD") and (path == "models" or path.startswith("models/")))


def _unstored(body: bytes) -> bytes:
    """A call's body with ``store: false``: nothing of it kept in an account every tenant reads."""
    try:
        fields = loads(body)
    except (msgspec.DecodeError, RecursionError):
        return body  # (not JSON: the upstream refuses it)
    if not isinstance(fields, dict) or fields.get("store") is False:
        return body
    return msgspec.json.encode({**fields, "store": False})


class Forwarder:
    """Relays one request to the upstream its model routes to, and the answer back, untouched
    (but for the credentials: ours go out, an echo of them never comes back). ``upstream_objects =
    "refuse"``: towards an upstream whose configured key every tenant shares, only calls to a model
    pass (404 for the account's own objects -- stored answers, files, batches ...), and those that
    an upstream may keep go with ``store: false``."""

    def __init__(self, upstream: UpstreamClient, *, upstream_objects: str = "pass", send_timeout: float = 0.0) -> None:
        self.upstream = upstream
        self.upstream_objects = upstream_objects
        self.send_timeout = send_timeout  # a client that takes nothing of its answer this long has left

    def route(self, body: bytes) -> Upstream:
        """The upstream a request's model routes to (its ``api`` says whether a call that names no
        conversation can pass through to it, or is translated: docs/behaviour.md)."""
        return self.upstream.route(_model_of(body)) if body else self.upstream.default

    async def forward(self, request: Request[Any, Any, Any], path: str, body: bytes, headers: RequestHeaders,
                      caller: Caller, *, errors: ErrorVoice = OPENAI_ERRORS, upstream: Upstream | None = None,
                      decoded: bytes | None = None) -> ASGIApp:
        """``errors``: how an error of the proxy's own is said (the client's API: OpenAI's, or
        Anthropic's to a Messages client) -- the upstream's own errors are relayed as they are;
        ``upstream``: the one ``route`` found for the body, when the caller asked already;
        ``decoded``: the body with its Content-Encoding undone, when it had one the route undid
        (``routes.common.decoded_body``) -- that is what goes, and what the model is read from."""
        own_body = decoded is not None and decoded is not body
        if own_body:
            body = decoded  # type: ignore[assignment]
        upstream = upstream or self.route(body)
        method = method_of(request.scope)  # (a HEAD, routed as a GET, goes on as a HEAD)
        if self.upstream_objects == "refuse" and upstream.api_key:  # (one account for every tenant)
            if not _a_call(method, path):
                raise NotFound(f"{method} /v1/{path} is not passed through: the upstream's account is shared "
                               "by every tenant ([server] upstream_objects)", param="path")
            if path in _STORED_UPSTREAM and body:
                body = _unstored(body)
        out_headers = self.upstream.request_headers(upstream, headers.items, caller.client_key, own_body=own_body)
        upstream_request = self.upstream.build(method, upstream, path, headers=out_headers,
                                               content=body or None, params=request.scope.get("query_string") or None)
        t0 = time.perf_counter()
        ctx = current_request.get()

        def upstream_done() -> None:
            if ctx is not None:
                ctx.upstream_seconds = time.perf_counter() - t0

        try:
            response = await self.upstream.send(upstream_request)
        except UpstreamFailure as exc:
            upstream_done()
            return RawResponse(exc.status, errors.body(exc.status, exc.body()), list(exc.headers.items()))
        secrets = (caller.client_key, upstream.api_key, *headers.credentials())
        if response.status_code >= 400:  # an error body is small: read it, mask echoed keys (and key-like text)
            try:
                content = await self.upstream.read_rest(response)
            except UpstreamFailure as exc:
                return RawResponse(exc.status, errors.body(exc.status, exc.body()), list(exc.headers.items()))
            finally:
                upstream_done()
            return RawResponse(response.status_code, redact_bytes(content, secrets),
                               response_headers(response.headers, secrets, as_it_came=True, own_key=bool(upstream.api_key)))

        async def close() -> None:
            upstream_done()
            await response.aclose()

        chunks = self.upstream.chunks(response)
        relayed = response_headers(response.headers, secrets, as_it_came=True, own_key=bool(upstream.api_key))
        masker = BytesMasker(secrets)  # (an answer echoing a credential: masked as it goes by, however cut)
        if masker and _read_events(relayed) and (events := event_masker(path, secrets)) is not None:
            # (an event stream of an API the proxy reads: masked across its text deltas, too)
            body = masked_events(chunks, events)
        else:
            body = _masked(chunks, masker) if masker else chunks
        return BytesRelay(response.status_code, encode_headers(relayed), body, close, errors=errors,
                          send_timeout=self.send_timeout)


def _read_events(headers: list[tuple[str, str]]) -> bool:
    """Is a pass-through answer an event stream whose events can be read (none of its bytes in a
    coding relayed as it came)?"""
    kinds = {k.lower(): v for k, v in headers}
    return kinds.get("content-type", "").startswith("text/event-stream") and "content-encoding" not in kinds


async def _masked(chunks: AsyncIterator[bytes], masker: BytesMasker) -> AsyncIterator[bytes]:
    async for chunk in chunks:
        if out := masker.feed(chunk):
            yield out
    if held := masker.flush():
        yield held
