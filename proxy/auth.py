"""Who is calling (docs/behaviour.md#auth-and-tenancy): the key decides the tenant -- a bearer token
(``Authorization: Bearer``), or ``x-api-key`` as Anthropic's clients send it.

- ``passthrough`` (default): any key is accepted and forwarded upstream (unless the upstream has
  its own); the tenant is a hash of the key, so each key sees only its own conversations.
- ``keys``: only proxy-issued keys from the config (stored as ``sha256:<hex>`` or in clear in the
  file), each naming a tenant; upstream keys come from the config; an ``admin`` key sees every
  tenant in the admin API.
- ``none``: one local tenant, no key needed (a key, if sent, is still forwarded upstream). With
  no key to stop it, a page of another site open in a browser on the same machine could send
  the proxy requests that change things (a form or a ``no-cors`` fetch needs no permission to
  send, only to read the answer): ``Authenticator.same_site`` refuses those
  (docs/behaviour.md#auth-and-tenancy).

Keys are never logged or stored: only their hashes are compared and kept.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler

from config import AuthSettings

from .errors import AuthenticationFailed, CrossSiteRefused

__all__ = ["Authenticator", "Caller", "key_hash"]

_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})  # (a read: another site's page cannot read the answer)


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class Caller:
    tenant: str
    client_key: str | None  # forwarded upstream when the upstream has no key of its own
    admin: bool = False


def _bearer(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() != "bearer":
        return None
    value = value.strip()
    return value or None


_DEFAULT_PORTS = {"http": 80, "https": 443}


def _same_place(origin: str, host: str) -> bool:
    """Does a browser's ``Origin`` name the host it asked for (``Host``)? A default port may be
    written on one side and left out on the other (``http://localhost`` and ``localhost:80``)."""
    try:
        asked, named = urlsplit(origin), urlsplit(f"//{host}")
        default = _DEFAULT_PORTS.get(asked.scheme)
        return asked.hostname is not None and asked.hostname == named.hostname and \
            (asked.port or default) == (named.port or default)
    except ValueError:  # (a port that is not one)
        return False


class Authenticator:
    def __init__(self, settings: AuthSettings) -> None:
        self.mode = settings.mode
        self._keys: dict[str, tuple[str, bool]] = {}
        for entry in settings.keys:
            digest = entry.key[7:].lower() if entry.key.startswith("sha256:") else key_hash(entry.key)
            self._keys[digest] = (entry.tenant or f"k_{digest[:16]}", entry.admin)

    def caller(self, request: ASGIConnection[Any, Any, Any, Any]) -> Caller:
        """The Litestar dependency ``caller``: every route that needs one declares it."""
        return self(request.headers.get("authorization"), request.headers.get("x-api-key"))

    def guard(self, connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
        """A Litestar guard: the caller is authenticated before anything of the request is read.
        A route whose body Litestar parses (``data``) parses it before resolving its dependencies,
        ``caller`` among them: without the guard, anyone could make it decode a body and learn
        whether it was well formed before being refused."""
        self.caller(connection)

    @staticmethod
    def same_site(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
        """A Litestar guard for ``none`` mode: a browser's request that would change something is
        refused (403 ``cross_site_request``) unless it comes from a page of the proxy's own origin
        (the viewer) or from no page at all (an address typed in). The browser says which in
        ``Sec-Fetch-Site``; one too old to say it is judged by its ``Origin`` against the host it
        asked for. A request without either is not a browser's (an SDK, curl) and goes on."""
        if connection.scope["method"] in _SAFE_METHODS:
            return
        headers = connection.headers
        site = headers.get("sec-fetch-site")
        if site is not None:
            if site in ("same-origin", "none"):
                return
        else:
            origin = headers.get("origin")
            if origin is None:
                return
            host = (headers.get("x-forwarded-host") or headers.get("host") or "").split(",")[0].strip()
            if origin != "null" and _same_place(origin, host):
                return
        raise CrossSiteRefused("a page of another site may not send this proxy requests that change things "
                               "(auth mode \"none\": no key protects it); open the viewer from the proxy itself")

    def __call__(self, authorization: str | None, api_key: str | None = None) -> Caller:
        # a bearer token, or Anthropic's ``x-api-key`` (its SDKs and Claude Code send that)
        key = _bearer(authorization) or (api_key.strip() or None if api_key else None)
        if self.mode == "none":
            return Caller("local", key)
        if key is None:
            raise AuthenticationFailed("missing API key: send Authorization: Bearer <key> (or x-api-key: <key>)")
        digest = key_hash(key)
        if self.mode == "passthrough":
            return Caller(f"t_{digest[:32]}", key)
        for known, (tenant, admin) in self._keys.items():
            if hmac.compare_digest(known, digest):
                return Caller(tenant, None, admin)
        raise AuthenticationFailed("invalid API key")
