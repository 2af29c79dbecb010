"""Small ASGI helpers for responses whose bytes we already have (relayed upstream bodies, our
errors): no re-encoding, headers given as they are."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["RawResponse", "encode_headers"]


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
