"""The upstream boundary: provider routing by model glob, one shared transport (requests go
straight to it -- no ``httpx.AsyncClient``, whose cookie jar every tenant would share), which
headers go out and come back, and the translation of transport errors into ours -- once, here:
``UpstreamUnreachable`` (502) / ``UpstreamTimeout`` (504) / ``UpstreamBadResponse`` (502)
(``map_exceptions``, in the manner of httpx's own). An upstream's HTTP error answers are
classified by the failure table in ``proxy.failures``.

What an upstream sends is bounded here: a response head by ``[server] max_response_header_bytes``
and ``max_response_headers`` (``UpstreamHeadersTooLarge``; the transports stop reading past them),
a body by ``max_response_bytes`` -- its decoded size: a ``Content-Encoding`` (gzip, deflate, zstd)
is undone by our own bounded decoders (``proxy.decoding``).
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import contextmanager

import httpx

from config import Settings, Upstream

from .assembly import Target
from .decoding import decoded_too_large as _too_large
from .decoding import decoder as _decoder
from .errors import (
    InvalidRequest,
    UpstreamBadResponse,
    UpstreamHeadersTooLarge,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from .secrets import mask_headers
from .transport import ResponseHeadTooLarge, UpstreamTransport, check_head

__all__ = ["UpstreamClient", "map_exceptions", "response_headers", "target_of"]

# Request headers never forwarded upstream: hop-by-hop, ours, the ones httpx sets itself, and
# every credential header -- the upstream gets one credential, ours (docs/behaviour.md#auth-and-tenancy).
_DROP_REQUEST = frozenset(
    {
        "host", "content-length", "connection", "keep-alive", "transfer-encoding", "te", "upgrade",
        "proxy-authorization", "proxy-connection", "accept-encoding", "expect", "cookie",
        "x-conversation-id", "x-parent-node-id", "x-node-kind", "x-context-mode", "authorization", "api-key",
        "x-api-key",
    }
)
# Headers that describe the client's body: not sent with a body of the proxy's.
_BODY_HEADERS = frozenset({"content-type", "content-encoding", "content-md5", "digest", "content-digest"})
# Headers only meaningful with the client's own upstream account: neither sent nor relayed with the
# operator's (an upstream with its own key).
_ACCOUNT_HEADERS = frozenset({"openai-organization", "openai-project", "anthropic-organization-id"})
ANTHROPIC_VERSION = b"2023-06-01"  # to an Anthropic upstream, when the client named none
_OAUTH_TOKEN = b"sk-ant-oat"  # the prefix of Anthropic's OAuth access tokens
# Response headers not relayed: framing (we re-frame), the server's own identity/cookies, and any
# that would replace or duplicate ours.
_DROP_RESPONSE = frozenset(
    {
        "content-length", "content-encoding", "transfer-encoding", "connection", "keep-alive",
        "date", "server", "set-cookie", "alt-svc",
        "x-conversation-id", "x-node-id", "x-parent-node-id",
    }
)
_OWN_PREFIXES = ("x-context-", "x-branchpoint-")


@contextmanager
def map_exceptions() -> Iterator[None]:
    """httpx errors -> ``UpstreamTimeout`` / ``UpstreamUnreachable`` / ``UpstreamBadResponse``."""
    try:
        yield
    except ResponseHeadTooLarge as exc:
        raise UpstreamHeadersTooLarge(f"{exc} (server.max_response_header_bytes, server.max_response_headers)") from exc
    except httpx.TimeoutException as exc:
        raise UpstreamTimeout(f"the upstream did not answer in time ({type(exc).__name__})") from exc
    except httpx.DecodingError as exc:
        raise UpstreamBadResponse("the upstream sent a body that could not be decoded") from exc
    except (httpx.TransportError, httpx.InvalidURL) as exc:
        raise UpstreamUnreachable(f"cannot reach the upstream ({type(exc).__name__})") from exc


_H11_HEAD_TOO_LONG = "Receive buffer too long"  # h11 (the httpx transport): a head past its own 100 KiB




def target_of(upstream: Upstream, max_output: int | None = None) -> Target:
    """The provider a request goes to, as assembly needs to know it. An Anthropic upstream always
    takes its own signed thinking back (it needs it to go on with a tool round)."""
    return Target(upstream.name, upstream.accepts_reasoning or upstream.api == "anthropic", upstream.api, max_output)


def response_headers(headers: httpx.Headers, secrets: Iterable[str | None] = (), *,
                     as_it_came: bool = False, own_key: bool = False) -> list[tuple[str, str]]:
    """The upstream response headers worth relaying to the client, the call's credentials masked
    in them (``secrets``: never sent back, whatever header an upstream echoes them in).
    ``as_it_came``: the body goes to the client as the upstream sent it (a pass-through), so a
    coding the proxy does not undo (br) still says what the bytes are. ``own_key``: the upstream
    was called with its configured key -- the operator's account, whose ids
    (``openai-organization``, ``openai-project``) are not the client's to see. Names and values
    are the upstream's bytes read as Latin-1, so they go out byte for byte (``encode_headers``):
    a value in UTF-8 (a model's name in CJK, an emoji) is relayed as it came, never re-encoded
    or refused with a 500 after the answer was stored."""
    keep = as_it_came and headers.get("content-encoding") and _decoder(headers, 1) is None
    raw = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers.raw]
    return mask_headers([(k, v) for k, v in raw
                         if ((lk := k.lower()) not in _DROP_RESPONSE or (keep and lk == "content-encoding"))
                         and not lk.startswith(_OWN_PREFIXES) and not (own_key and lk in _ACCOUNT_HEADERS)], secrets)


class UpstreamClient:
    """Routes by model and talks to the upstreams through one shared connection pool."""

    def __init__(self, settings: Settings, *, transport: httpx.AsyncBaseTransport | None = None) -> None:
        d = settings.upstream_defaults
        self.settings = settings
        verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=d.ca_bundle) if d.ca_bundle else True
        limits = httpx.Limits(max_connections=d.max_connections, max_keepalive_connections=d.max_connections,
                              keepalive_expiry=d.keepalive_expiry)
        head_bytes, headers = settings.server.max_response_header_bytes, settings.server.max_response_headers
        if transport is None and d.transport == "builtin":
            transport = UpstreamTransport(max_connections=d.max_connections, keepalive_expiry=d.keepalive_expiry,
                                          ssl_context=verify if isinstance(verify, ssl.SSLContext) else None,
                                          max_head_bytes=head_bytes, max_headers=headers)
        elif transport is None and d.transport == "aiohttp":
            from .aiohttp_transport import AiohttpTransport

            transport = AiohttpTransport(verify=verify, limits=limits, trust_env=False, max_head_bytes=head_bytes,
                                         max_headers=headers)
        if transport is None:  # "httpx": httpcore's pool
            transport = httpx.AsyncHTTPTransport(verify=verify, limits=limits, trust_env=True)
        # Requests go straight to the transport, without an httpx.AsyncClient: a client would keep
        # the upstreams' Set-Cookie in one jar and send it on with every tenant's later requests.
        self.transport = transport
        self._timeout = httpx.Timeout(connect=d.connect_timeout, read=d.read_timeout, write=d.write_timeout,
                                      pool=d.pool_timeout).as_dict()
        default = [u for u in settings.upstreams if "*" in u.models]
        self.default = default[0] if default else settings.upstreams[0]
        self._route_cache: dict[str, Upstream | None] = {}
        self._max_output: dict[str, int] = {}
        self._urls: dict[tuple[str, str], httpx.URL] = {}
        self._by_name = {u.name: u for u in settings.upstreams}
        self.max_response_bytes = settings.server.max_response_bytes
        self.max_head_bytes, self.max_headers = head_bytes, headers
        # the built-in transport bounds a head as it reads it; any other's is checked once read
        # (their own parsers' limits -- h11's 100 KiB, aiohttp's, set to ours -- bound that read)
        self._check_heads = not isinstance(transport, UpstreamTransport)

    async def aclose(self) -> None:
        await self.transport.aclose()

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

    def max_output(self, model: str | None) -> int | None:
        """The most output tokens ``[models]`` gives ``model`` (None when no model is named)."""
        if not model:
            return None
        found = self._max_output.get(model)
        if found is None:
            found = self.settings.limits_for(model).max_output_tokens
            if len(self._max_output) < 4096:  # (model names come from clients: bounded)
                self._max_output[model] = found
        return found

    def named(self, name: str | None) -> Upstream | None:
        """The configured upstream of this name (a stored node's provider), if it still exists."""
        return self._by_name.get(name) if name else None

    def replay_target(self, provider: str | None, model: str | None) -> Target:
        """What a stored node's request is rebuilt for (``GET /admin/nodes/{id}/request``, an
        import's check of the hashes it comes with): its provider as configured now, or by its name
        alone when no longer configured."""
        configured = self.named(provider)
        return (target_of(configured, self.max_output(model)) if configured is not None
                else Target(provider or "", max_output=self.max_output(model)))

    @staticmethod
    def url(upstream: Upstream, path: str) -> str:
        return upstream.base_url.rstrip("/") + "/" + path.lstrip("/")

    @staticmethod
    def request_headers(
        upstream: Upstream, incoming: Iterable[tuple[str, str]], client_key: str | None, *, own_body: bool = False
    ) -> list[tuple[bytes, bytes]]:
        """Client headers to forward, with the upstream's key (or the client's, passthrough).
        Values go out as the bytes they came as (latin-1 round trip), whatever they hold.
        ``own_body``: the body is the proxy's (a stored call's, built anew), not the client's --
        what described the client's body (its encoding, its type) does not go with it."""
        own_key = bool(upstream.api_key)
        anthropic = upstream.api == "anthropic"
        out = [
            (k.encode("latin-1"), v.encode("latin-1"))
            for k, v in incoming
            if (lk := k.lower()) not in _DROP_REQUEST and not (own_key and lk in _ACCOUNT_HEADERS)
            and (anthropic or not lk.startswith("anthropic-"))  # (Anthropic's own: only to Anthropic)
            and not (own_body and lk in _BODY_HEADERS)
        ]
        if own_body:
            out.append((b"content-type", b"application/json"))
        key = upstream.api_key or client_key
        if key:
            try:
                raw = key.encode("latin-1")  # a client's key: the bytes it came as
            except UnicodeEncodeError:
                raw = key.encode("utf-8")  # a configured key beyond latin-1
            # (an Anthropic API key as x-api-key; an OAuth access token -- Claude Code signed in
            # with a subscription -- Anthropic takes only as a bearer token)
            bearer = not anthropic or raw.startswith(_OAUTH_TOKEN)
            out.append((b"authorization", b"Bearer " + raw) if bearer else (b"x-api-key", raw))
        if anthropic and not any(k == b"anthropic-version" for k, _ in out):
            out.append((b"anthropic-version", ANTHROPIC_VERSION))
        return out

    def build(self, method: str, upstream: Upstream, path: str, *, headers: list[tuple[bytes, bytes]],
              content: bytes | None = None, params: str | bytes | None = None) -> httpx.Request:
        if params:
            url: str | httpx.URL = f"{self.url(upstream, path)}?{params.decode() if isinstance(params, bytes) else params}"
        else:  # the call endpoints: parsed once per upstream
            url = self._urls.get((upstream.name, path))
            if url is None:
                url = httpx.URL(self.url(upstream, path))
                if len(self._urls) < 1024:
                    self._urls[(upstream.name, path)] = url
        return httpx.Request(method, url, headers=headers, content=content, extensions={"timeout": self._timeout})

    async def send(self, request: httpx.Request) -> httpx.Response:
        """Send; the body is left unread: read it with ``read_rest`` or ``chunks`` (which bound
        it), or ``aclose()`` the response."""
        with map_exceptions():
            try:
                response = await self.transport.handle_async_request(request)
            except httpx.RemoteProtocolError as exc:
                if str(exc) == _H11_HEAD_TOO_LONG:
                    raise ResponseHeadTooLarge("the upstream's response head is larger than h11's limit") from exc
                raise
            if self._check_heads:
                try:
                    check_head(response.headers.raw, self.max_head_bytes, self.max_headers)
                except ResponseHeadTooLarge:
                    await response.aclose()
                    raise
        response.request = request
        return response

    async def fetch(self, request: httpx.Request) -> tuple[httpx.Response, bytes]:
        """Send and read the whole (bounded) body."""
        response = await self.send(request)
        return response, await self.read_rest(response)

    async def read_rest(self, response: httpx.Response) -> bytes:
        """The rest of the body, at most ``max_response_bytes`` (else ``UpstreamTooLarge``)."""
        parts: list[bytes] = []
        try:
            async for chunk in self.chunks(response):
                parts.append(chunk)
        finally:
            await response.aclose()
        return b"".join(parts)

    async def chunks(self, response: httpx.Response) -> AsyncIterator[bytes]:
        """The body as it arrives, cut with ``UpstreamTooLarge`` past ``max_response_bytes``:
        whatever an upstream sends, a call holds at most that much of it."""
        limit = self.max_response_bytes
        seen = 0
        if response.is_stream_consumed:  # handed over read already (a transport of tests): decoded, whole
            if len(response.content) > limit:
                raise _too_large(limit)
            if response.content:
                yield response.content
            return
        decoder = _decoder(response.headers, limit)
        with map_exceptions():
            if decoder is None:  # (the usual case: nothing to decode, the raw chunks as they come)
                async for chunk in response.aiter_raw():
                    seen += len(chunk)
                    if seen > limit:
                        raise _too_large(limit)
                    yield chunk
                return
            received = 0
            async for chunk in response.aiter_raw():
                received += len(chunk)  # (what came is held to the limit too: trailing bytes never end it)
                if received > limit:
                    raise _too_large(limit)
                for piece in decoder.decode(chunk):
                    seen += len(piece)
                    if seen > limit:
                        raise _too_large(limit)
                    yield piece
            for piece in decoder.flush():
                seen += len(piece)
                if seen > limit:
                    raise _too_large(limit)
                yield piece
