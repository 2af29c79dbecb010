"""Small ASGI helpers for responses whose bytes we already have (relayed upstream bodies, our
errors): no re-encoding, headers given as they are."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["HEAD", "HeadAsGet", "RawResponse", "encode_headers", "method_of"]

HEAD = "branchpoint.head"  # a request's scope key: it came as HEAD, and is routed as GET (``HeadAsGet``)


def encode_headers(headers: Iterable[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    return [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers]


class RawResponse:
    """An ASGI response from ready-made bytes."""

    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, body: bytes, headers: Iterable[tuple[str, str]] = (),
                 content_type: str = "application/json") -> None:
        self.status = status
        self.body = body
        encoded = encode_headers(headers)
        if not any(k == b"content-type" for k, _ in encoded):
            encoded.append((b"content-type", content_type.encode()))
        encoded.append((b"content-length", str(len(body)).encode()))
        self.headers = encoded

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": self.status, "headers": self.headers})
        await send({"type": "http.response.body", "body": self.body, "more_body": False})


class HeadAsGet:
    """HEAD answered as GET without its body, on every route that takes GET (RFC 9110: a server
    must take HEAD wherever it takes GET; uptime monitors probe ``/healthz`` with it). Wraps the
    app's handler before its routing: the request is routed and handled as a GET -- the scope
    marked ``HEAD``, so that the pass-through still sends the upstream a HEAD (``method_of``) --
    and the body is left out, its headers (Content-Length, Content-Type) those of the GET."""

    __slots__ = ("app",)

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def headers_only(message: Any) -> None:
            if message["type"] == "http.response.body":
                message = {**message, "body": b""}
            await send(message)

        # a copy: the server's own scope still says HEAD (it writes no body for one either)
        await self.app({**scope, "method": "GET", HEAD: True}, receive, headers_only)


def method_of(scope: Any) -> str:
    """The method a request came with (HEAD, where ``HeadAsGet`` routed it as a GET)."""
    return "HEAD" if scope.get(HEAD) else scope["method"]
