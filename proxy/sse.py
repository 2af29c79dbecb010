"""Server-sent events: splitting an upstream's byte stream into events, and the error event the
proxy ends a failed stream with."""

from __future__ import annotations

from typing import Any

import msgspec

from .errors import UpstreamBadResponse, error_body
from .surrogates import loads_piece

__all__ = ["DONE", "UNREAD", "SSEParser", "payload", "relayable", "sse_error_event"]

DONE = object()  # the ``[DONE]`` that ends a chat stream
UNREAD = object()  # an event without data (a comment, a keep-alive, a name only), or empty data


def payload(event: bytes) -> Any:
    """An event's data decoded from JSON; or ``DONE``; or ``UNREAD``. Data that is not a JSON
    object raises ``UpstreamBadResponse``: the upstream broke its stream (relayed, it would break the
    client's SDK, and the answer stored would not be the one it read) -- the relay ends the
    stream with an error event, and the node fails. A lone surrogate escape is read, and kept
    (``proxy.surrogates``: the other half of its character may come with the next event)."""
    data = SSEParser.data(event)
    if data is None or not data.strip():
        return UNREAD
    if data == b"[DONE]":
        return DONE
    try:
        value = loads_piece(data)
    except (msgspec.DecodeError, RecursionError):
        raise UpstreamBadResponse("the upstream's stream held an event whose data is not JSON") from None
    if not isinstance(value, dict):  # (every API's events are objects)
        raise UpstreamBadResponse("the upstream's stream held an event whose data is not a JSON object")
    return value


def relayable(event: bytes) -> bool:
    """Can an event ``payload`` read as ``UNREAD`` go to the client as it came? A comment or a
    keep-alive can; one with empty data cannot (an SDK parses every event's data as JSON)."""
    return SSEParser.data(event) is None


def sse_error_event(message: str, type_: str, code: str | None) -> bytes:
    return b"data: " + error_body(message, type_, code) + b"\n\n"


class SSEParser:
    """Splits a byte stream into complete SSE events (``\\n\\n``-terminated; ``\\r\\n`` and ``\\r`` end lines too).

    Linear in the bytes fed, however they are cut: each chunk is normalised on its own (a ``\\r``
    at its end waits for the next chunk), and the search for the end of an event resumes where
    the last one stopped -- an event that never ends costs no more than its bytes. At the
    stream's end, ``close`` gives the events a ``\r`` held back there completes (a stream whose
    lines end in a bare ``\r`` ends in one)."""

    __slots__ = ("_buf", "_cr", "_scanned")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._scanned = 0  # bytes of _buf known to hold no event end
        self._cr = False  # the last chunk ended with \r

    def feed(self, chunk: bytes) -> list[bytes]:
        if self._cr:
            chunk = b"\r" + chunk
            self._cr = False
        if chunk.endswith(b"\r"):
            chunk = chunk[:-1]
            self._cr = True
        if b"\r" in chunk:  # (CRLF, or a CR alone: both end a line, as the SSE standard says)
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        buf = self._buf
        buf += chunk
        pos = buf.find(b"\n\n", max(self._scanned - 1, 0))
        if pos < 0:
            self._scanned = len(buf)
            return []
        events = []
        start = 0
        while pos >= 0:
            if pos > start:
                events.append(bytes(buf[start:pos]))
            start = pos + 2
            pos = buf.find(b"\n\n", start)
        del buf[:start]
        self._scanned = len(buf)
        return events

    def close(self) -> list[bytes]:
        """The stream has ended: a ``\r`` held back for the next chunk ends its line (none comes),
        and the events that completes."""
        if not self._cr:
            return []
        self._cr = False
        return self.feed(b"\n")

    @property
    def pending(self) -> bytes:
        return bytes(self._buf)

    @staticmethod
    def data(event: bytes) -> bytes | None:
        """The joined ``data:`` payload of an event, or None (comments, other fields only)."""
        if event.startswith(b"data:") and b"\n" not in event:
            payload = event[5:]
            return payload[1:] if payload.startswith(b" ") else payload
        parts = []
        for line in event.split(b"\n"):
            if line.startswith(b"data:"):
                payload = line[5:]
                parts.append(payload[1:] if payload.startswith(b" ") else payload)
        return b"\n".join(parts) if parts else None
