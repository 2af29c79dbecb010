"""Credentials never travel back: whatever key a client sent -- or the proxy added -- is masked
wherever an upstream echoes it (an error body, a stream's error event, a stored node, a log line).
Anything shaped like a provider's API key is masked too, whoever it belongs to."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any, AnyStr

import msgspec

__all__ = ["MASK", "BytesMasker", "Masker", "TextMasker", "mask_headers", "redact", "redact_bytes"]

MASK = "[redacted]"

# API keys as providers spell them (OpenAI sk-/sk-proj-, Anthropic sk-ant-, Stripe-like pk-/rk-,
# and bearer tokens of OpenAI-compatible servers).
_KEY_LIKE = re.compile(r"\b(sk|pk|rk|ak|key)-[A-Za-z0-9_\-]{12,}")


def redact(text: str, secrets: Iterable[str | None] = ()) -> str:
    """``text`` with the given secrets and anything shaped like an API key masked."""
    for secret in secrets:
        if secret and len(secret) >= 6 and secret in text:
            text = text.replace(secret, MASK)
    return _KEY_LIKE.sub(lambda m: f"{m.group(1)}-{MASK}", text)


def redact_bytes(body: bytes, secrets: Iterable[str | None] = ()) -> bytes:
    text = body.decode("utf-8", "replace")
    clean = redact(text, secrets)
    return body if clean == text else clean.encode()


_encode = msgspec.json.Encoder().encode


def _longest_first(secrets: Iterable[str | None]) -> list[str]:
    """The credentials worth masking (six characters or more), once each, the longest first: a
    key that begins another is masked only where the longer one is not."""
    return sorted({s for s in secrets if s and len(s) >= 6}, key=len, reverse=True)


def mask_headers(headers: list[tuple[str, str]], secrets: Iterable[str | None]) -> list[tuple[str, str]]:
    """Response headers with the given credentials masked in their values (an upstream that echoes
    the Authorization it got, in a header of its own or a WWW-Authenticate)."""
    keys = _longest_first(secrets)
    if not keys or not any(key in value for _, value in headers for key in keys):
        return headers
    out = []
    for name, value in headers:
        for key in keys:
            if key in value:
                value = value.replace(key, MASK)
        out.append((name, value))
    return out


class Masker:
    """The credentials of one call masked in what its upstream answered with success -- the body
    the client gets and the answer stored. Only the exact credentials: an answer that merely
    mentions something shaped like a key (a model writing example code) is the model's to give."""

    __slots__ = ("_secrets",)

    def __init__(self, secrets: Iterable[str | None]) -> None:
        found: dict[bytes, None] = {}
        for secret in _longest_first(secrets):
            found[secret.encode()] = None
            found[_encode(secret)[1:-1]] = None  # as it stands inside a JSON string, if it differs
        self._secrets = tuple(sorted(found, key=len, reverse=True))  # (a form that begins another: after it)

    def __bool__(self) -> bool:
        return bool(self._secrets)

    def bytes(self, data: bytes) -> bytes:
        for secret in self._secrets:
            if secret in data:
                data = data.replace(secret, _MASK_BYTES)
        return data


_MASK_BYTES = MASK.encode()


class BytesMasker:
    """``Masker`` over a body that arrives in chunks (a pass-through answer): what may be the
    start of a credential at the end of a chunk is held back until the next chunk says whether it
    is one; ``flush`` gives out what is held when the body ends. Nothing is held back unless a
    chunk ends in the first bytes of a credential (an SSE event ends in a blank line), so an
    answer goes out as it comes."""

    __slots__ = ("_held", "_masker")

    def __init__(self, secrets: Iterable[str | None]) -> None:
        self._masker = Masker(secrets)
        self._held = b""

    def __bool__(self) -> bool:
        return bool(self._masker)

    def feed(self, chunk: bytes) -> bytes:
        data = self._held + chunk if self._held else chunk
        cut = _cut(data, self._masker._secrets)
        self._held = data[cut:]
        return self._masker.bytes(data[:cut])

    def flush(self) -> bytes:
        held, self._held = self._held, b""
        return self._masker.bytes(held)


def _cut(data: AnyStr, secrets: Sequence[AnyStr]) -> int:
    """Where ``data`` (what was held back, and what came) can be cut so that what is before the
    cut goes out masked as masking the whole text would mask it: before the longest end of it
    that begins a credential, and before any credential that would cross the cut (one credential
    may begin or hold another: the held part stays raw until the next piece says)."""
    cut = len(data) - _prefix_at_end(data, secrets)
    moved = True
    while moved:
        moved = False
        for secret in secrets:
            i = data.find(secret, max(0, cut - len(secret) + 1))
            if -1 < i < cut < i + len(secret):
                cut, moved = i, True
    return cut


def _prefix_at_end(data: AnyStr, secrets: Sequence[AnyStr]) -> int:
    """How much of the end of ``data`` begins one of ``secrets`` (the longest such end)."""
    best = 0
    end = len(data)
    for secret in secrets:
        first = secret[:1]
        i = data.find(first, max(0, end - len(secret) + 1))
        while i != -1 and end - i > best:
            if secret.startswith(data[i:]):
                best = end - i
                break
            i = data.find(first, i + 1)
    return best


class TextMasker:
    """Credentials masked in text that arrives in pieces (a stream's deltas): what may be the
    start of a credential is held back until the next piece says whether it is one -- then the
    whole credential is masked -- and given out otherwise; ``flush`` gives out what is held at
    the end of the text. Each ``key`` is one text (a choice's content, a tool call's arguments).
    What the client sees is the text as written, with every credential masked, however the
    upstream cut it."""

    __slots__ = ("_held", "_secrets")

    def __init__(self, secrets: Iterable[str | None]) -> None:
        self._secrets = tuple(_longest_first(secrets))
        self._held: dict[Any, str] = {}

    def __bool__(self) -> bool:
        return bool(self._secrets)

    @property
    def holding(self) -> bool:
        return bool(self._held)

    def feed(self, key: Any, piece: str) -> str:
        text = self._held.pop(key, "") + piece
        cut = _cut(text, self._secrets)
        if cut < len(text):
            self._held[key] = text[cut:]
            text = text[:cut]
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, MASK)
        return text

    def flush(self, key: Any) -> str:
        text = self._held.pop(key, "")
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, MASK)
        return text

    def held(self) -> list[Any]:
        """The texts something is held back of."""
        return list(self._held)

