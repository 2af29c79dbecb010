"""Credentials never travel back: whatever key a client sent -- or the proxy added -- is masked
wherever an upstream echoes it (an error body, a stream's error event, a stored node, a log line).
Anything shaped like a provider's API key is masked too, whoever it belongs to."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import msgspec

__all__ = ["MASK", "BytesMasker", "Masker", "TextMasker", "redact", "redact_bytes"]

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
        self._secrets = tuple(found)

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
        data = self._masker.bytes(self._held + chunk if self._held else chunk)
        keep = _prefix_at_end(data, self._masker._secrets)
        self._held = data[len(data) - keep:] if keep else b""
        return data[:len(data) - keep] if keep else data

    def flush(self) -> bytes:
        held, self._held = self._held, b""
        return held


def _prefix_at_end(data: bytes, secrets: Iterable[bytes]) -> int:
    """How many bytes at the end of ``data`` begin one of ``secrets`` (the longest such run)."""
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
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, MASK)
        keep = self._prefix_at_end(text)
        if keep:
            self._held[key] = text[-keep:]
            return text[:-keep]
        return text

    def flush(self, key: Any) -> str:
        return self._held.pop(key, "")

    def held(self) -> list[Any]:
        """The texts something is held back of."""
        return list(self._held)

    def _prefix_at_end(self, text: str) -> int:
        """How many characters at the end of ``text`` begin some credential (the longest)."""
        best = 0
        end = len(text)
        for secret in self._secrets:
            first = secret[0]
            i = text.find(first, max(0, end - len(secret) + 1))
            while i != -1 and end - i > best:
                if secret.startswith(text[i:]):
                    best = end - i
                    break
                i = text.find(first, i + 1)
        return best
