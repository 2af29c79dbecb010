"""The upstream boundary: provider routing by model glob, one shared ``httpx.AsyncClient``, and the
translation of everything that can go wrong there into our terms -- once, here:

- transport errors become ``UpstreamUnreachable`` (502) / ``UpstreamTimeout`` (504)
  (``map_exceptions``, in the manner of httpx's own);
- an upstream HTTP error becomes a ``Failure`` whose ``kind`` drives the head rule of SPEC §4:
  ``transient`` (5xx, 429, 408, cut streams), ``overflow`` (context length exceeded) or
  ``invalid`` (any other 4xx) (``classify``).
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import httpx
import msgspec

from config import Settings, Upstream

from .errors import InvalidRequest, UpstreamBadResponse, UpstreamFailure, UpstreamTimeout, UpstreamUnreachable
from .transport import UpstreamTransport

__all__ = [
    "Failure",
    "FailureKind",
    "UpstreamClient",
    "classify",
    "failure_from_exception",
    "map_exceptions",
    "redact",
    "response_headers",
]

FailureKind = Literal["transient", "overflow", "invalid"]

_decode = msgspec.json.Decoder().decode

# Request headers never forwarded upstream: hop-by-hop, ours, and the ones httpx sets itself.
_DROP_REQUEST = frozenset(
    {
        "host", "content-length", "connection", "keep-alive", "transfer-encoding", "te", "upgrade",
        "proxy-authorization", "proxy-connection", "accept-encoding", "expect", "cookie",
        "x-conversation-id", "x-parent-node-id", "x-node-kind", "authorization", "api-key",
    }
)
# Headers only meaningful with the client's own upstream account.
_ACCOUNT_HEADERS = frozenset({"openai-organization", "openai-project"})
# Response headers not relayed: framing (we re-frame), and the server's own identity/cookies.
_DROP_RESPONSE = frozenset(
    {
        "content-length", "content-encoding", "transfer-encoding", "connection", "keep-alive",
        "date", "server", "set-cookie", "alt-svc",
    }
)

# How providers say "your prompt does not fit" (OpenAI, Azure, Anthropic-compatible, vLLM, Ollama,
# Mistral, Groq, DeepSeek ...). Checked only on 400/413 answers.
_OVERFLOW_CODES = frozenset({"context_length_exceeded", "context_window_exceeded", "prompt_too_long"})
_OVERFLOW_TEXT = re.compile(
    r"maximum context length|context[ _]length|context window|prompt is too long|"
    r"too many (input )?tokens|input is too long|exceeds? the (model'?s? )?(maximum|max)|"
    r"reduce the length of the (messages|prompt)",
    re.IGNORECASE,
)


# API keys as providers spell them (OpenAI sk-/sk-proj-, Anthropic sk-ant-, Stripe-like pk-/rk-,
# and bearer tokens of OpenAI-compatible servers): masked wherever an upstream echoes one back.
_KEY_LIKE = re.compile(r"\b(sk|pk|rk|ak|key)-[A-Za-z0-9_\-]{12,}")


def redact(text: str, secrets: Iterable[str | None] = ()) -> str:
    """``text`` with the given secrets and anything shaped like an API key masked."""
    for secret in secrets:
        if secret and len(secret) >= 6 and secret in text:
            text = text.replace(secret, "[redacted]")
    return _KEY_LIKE.sub(lambda m: f"{m.group(1)}-[redacted]", text)


def _redact_body(body: bytes, secrets: Iterable[str | None]) -> bytes:
    text = body.decode("utf-8", "replace")
    clean = redact(text, secrets)
    return body if clean == text else clean.encode()


@dataclass(frozen=True, slots=True)
class Failure:
    """An upstream call that gave no answer. ``error`` is the node's ``{type, code, message, status}``."""

    kind: FailureKind
    error: dict[str, Any]
    status: int  # what the client gets
    body: bytes  # OpenAI-shaped error body for the client


def _error_fields(body: bytes) -> tuple[str | None, str | None, str | None]:
    """(type, code, message) from an OpenAI-shaped (or close) error body; Nones if unreadable."""
    try:
        data = _decode(body)
    except (msgspec.DecodeError, RecursionError):
        return None, None, None
    err = data.get("error") if isinstance(data, dict) else None
    if isinstance(err, str):
        return None, None, err
    if not isinstance(err, dict):
        if isinstance(data, dict) and isinstance(data.get("message"), str):
            return None, None, data["message"]
        return None, None, None
    code = err.get("code")
    return (
        err.get("type") if isinstance(err.get("type"), str) else None,
        str(code) if code is not None else None,
        err.get("message") if isinstance(err.get("message"), str) else None,
    )


def _is_overflow(code: str | None, message: str | None) -> bool:
    return code in _OVERFLOW_CODES or bool(message and _OVERFLOW_TEXT.search(message))


def classify(status: int, body: bytes, secrets: Iterable[str | None] = ()) -> Failure:
    """Classify a non-2xx upstream answer (SPEC §4). The client gets the upstream's own status
    and body when the body is an OpenAI-shaped error, else an OpenAI-shaped wrapper of it --
    either way with any API key the upstream echoed back masked (``redact``)."""
    body = _redact_body(body, secrets)
    type_, code, message = _error_fields(body)
    if status in (400, 413) and _is_overflow(code, message):
        kind: FailureKind = "overflow"
    elif status in (408, 429) or status >= 500:
        kind = "transient"
    elif 400 <= status < 500:
        kind = "invalid"
    else:  # 1xx/3xx: not an answer we can use
        kind = "transient"
    if message is None:
        message = body[:500].decode("utf-8", "replace").strip() or f"upstream answered HTTP {status}"
    error = {
        "type": type_ or "upstream_error",
        "code": "context_overflow" if kind == "overflow" else (code or f"http_{status}"),
        "message": message[:2000],
        "status": status,
    }
    if kind == "overflow" and code and code != "context_overflow":
        error["upstream_code"] = code
    client_status = status if 400 <= status < 600 else 502
    return Failure(kind, error, client_status, _client_error_body(body, error))


_ERROR_KEYS = ("message", "type", "param", "code")


def _client_error_body(body: bytes, error: dict[str, Any]) -> bytes:
    """The upstream's error body when it is OpenAI-shaped with all four keys (relayed byte for
    byte); else the same error with the missing keys filled in; else a wrapper of what it said."""
    try:
        data = _decode(body)
    except (msgspec.DecodeError, RecursionError):
        data = None
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        upstream_error = data["error"]
        if all(k in upstream_error for k in _ERROR_KEYS):
            return body
        filled = {k: upstream_error.get(k) for k in _ERROR_KEYS}
        if filled["message"] is None:
            filled["message"] = error["message"]
        if filled["type"] is None:
            filled["type"] = error["type"]
        return msgspec.json.encode({**data, "error": {**upstream_error, **filled}})
    return msgspec.json.encode(
        {"error": {"message": error["message"], "type": error["type"], "param": None, "code": error["code"]}}
    )


def failure_from_exception(exc: UpstreamFailure) -> Failure:
    """A transport-level failure (no HTTP status): always transient."""
    return Failure(
        "transient",
        {"type": exc.type, "code": exc.code, "message": exc.message, "status": None},
        exc.status,
        exc.body(),
    )


@contextmanager
def map_exceptions() -> Iterator[None]:
    """httpx errors -> ``UpstreamTimeout`` / ``UpstreamUnreachable`` / ``UpstreamBadResponse``."""
    try:
        yield
    except httpx.TimeoutException as exc:
        raise UpstreamTimeout(f"the upstream did not answer in time ({type(exc).__name__})") from exc
    except httpx.DecodingError as exc:
        raise UpstreamBadResponse("the upstream sent a body that could not be decoded") from exc
    except (httpx.TransportError, httpx.InvalidURL) as exc:
        raise UpstreamUnreachable(f"cannot reach the upstream ({type(exc).__name__})") from exc


def response_headers(headers: httpx.Headers) -> list[tuple[str, str]]:
    """The upstream response headers worth relaying to the client."""
    return [(k, v) for k, v in headers.multi_items() if k.lower() not in _DROP_RESPONSE]


class UpstreamClient:
    """Routes by model and talks to the upstreams through one shared connection pool."""

    def __init__(self, settings: Settings, *, transport: httpx.AsyncBaseTransport | None = None) -> None:
        d = settings.upstream_defaults
        self.settings = settings
        verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=d.ca_bundle) if d.ca_bundle else True
        if transport is None and d.transport == "builtin":
            transport = UpstreamTransport(max_connections=d.max_connections, keepalive_expiry=d.keepalive_expiry,
                                          ssl_context=verify if isinstance(verify, ssl.SSLContext) else None)
        self.transport = transport
        self.http = httpx.AsyncClient(
            verify=verify,
            timeout=httpx.Timeout(connect=d.connect_timeout, read=d.read_timeout, write=d.write_timeout, pool=d.pool_timeout),
            limits=httpx.Limits(max_connections=d.max_connections, max_keepalive_connections=d.max_connections,
                                keepalive_expiry=d.keepalive_expiry),
            follow_redirects=False,
            transport=transport,
        )
        default = [u for u in settings.upstreams if "*" in u.models]
        self.default = default[0] if default else settings.upstreams[0]
        self._route_cache: dict[str, Upstream | None] = {}

    async def aclose(self) -> None:
        await self.http.aclose()

    def route(self, model: str | None) -> Upstream:
        """The upstream for ``model`` (first glob match); the default one when no model is named."""
        if not model:
            return self.default
        try:
            upstream = self._route_cache[model]
        except KeyError:
            upstream = self.settings.upstream_for(model)
            if len(self._route_cache) < 4096:
                self._route_cache[model] = upstream
        if upstream is None:
            raise InvalidRequest(f"no upstream is configured for model {model!r}", param="model", code="model_not_found")
        return upstream

    @staticmethod
    def url(upstream: Upstream, path: str) -> str:
        return upstream.base_url.rstrip("/") + "/" + path.lstrip("/")

    @staticmethod
    def request_headers(
        upstream: Upstream, incoming: Iterable[tuple[str, str]], client_key: str | None
    ) -> list[tuple[str, str]]:
        """Client headers to forward, with the upstream's key (or the client's, passthrough)."""
        own_key = bool(upstream.api_key)
        out = [
            (k, v)
            for k, v in incoming
            if (lk := k.lower()) not in _DROP_REQUEST and not (own_key and lk in _ACCOUNT_HEADERS)
        ]
        key = upstream.api_key or client_key
        if key:
            out.append(("authorization", f"Bearer {key}"))
        return out

    def build(self, method: str, upstream: Upstream, path: str, *, headers: list[tuple[str, str]],
              content: bytes | None = None, params: str | bytes | None = None) -> httpx.Request:
        url = self.url(upstream, path)
        if params:
            url = f"{url}?{params.decode() if isinstance(params, bytes) else params}"
        return self.http.build_request(method, url, headers=headers, content=content)

    async def send(self, request: httpx.Request, *, stream: bool = False) -> httpx.Response:
        """Send; with ``stream=True`` the body is left unread (the caller must ``aclose()``)."""
        with map_exceptions():
            response = await self.http.send(request, stream=True)
            if stream:
                return response
            try:
                await response.aread()
            finally:
                await response.aclose()
            return response

    async def read_rest(self, response: httpx.Response) -> bytes:
        with map_exceptions():
            try:
                return await response.aread()
            finally:
                await response.aclose()
