"""Credentials never travel back: whatever key a client sent -- or the proxy added -- is masked
wherever an upstream echoes it (an error body, a stream's error event, a stored node, a log line).
Anything shaped like a provider's API key is masked too, whoever it belongs to."""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["MASK", "redact", "redact_bytes"]

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
