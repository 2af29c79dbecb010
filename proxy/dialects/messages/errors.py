"""Errors in Anthropic's shape, ``{"type": "error", "error": {"type", "message"}}``, with Anthropic's
types for our statuses; an Anthropic upstream's own error type is kept."""

from __future__ import annotations

from typing import Any

import msgspec

from ...bytes_relay import ErrorVoice
from ...surrogates import loads

__all__ = ["ANTHROPIC_ERRORS", "anthropic_type", "error_body", "error_event", "from_openai_body", "in_anthropic_words",
           "is_messages_path"]

_encode = msgspec.json.Encoder().encode

ANTHROPIC_TYPES = frozenset({"invalid_request_error", "authentication_error", "permission_error", "not_found_error",
                             "request_too_large", "rate_limit_error", "api_error", "overloaded_error", "timeout_error",
                             "billing_error"})
_BY_STATUS = {400: "invalid_request_error", 401: "authentication_error", 402: "billing_error",
              403: "permission_error", 404: "not_found_error", 409: "invalid_request_error",
              413: "request_too_large", 429: "rate_limit_error", 500: "api_error", 502: "api_error",
              503: "overloaded_error", 504: "timeout_error", 529: "overloaded_error"}


def anthropic_type(status: int, error: Any = None) -> str:
    """An error's Anthropic type: its own when it is one of Anthropic's specific ones (an
    Anthropic upstream's), else the one of its status (the generic types say less than a 413)."""
    own = getattr(error, "type", None) if not isinstance(error, dict) else error.get("type")
    if own in ANTHROPIC_TYPES and own not in ("invalid_request_error", "api_error"):
        return own
    return _BY_STATUS.get(status, "api_error" if status >= 500 else "invalid_request_error")


_TOO_LONG = "prompt is too long"


def in_anthropic_words(error: Any) -> str:
    """An error's message as a Messages client looks for it: a context overflow -- whatever the
    upstream called it (OpenAI's "maximum context length", llama.cpp's "exceeds the available
    context size" ...) -- begins with Anthropic's "prompt is too long", the words Claude Code and
    other Messages clients read as "compact and try again"."""
    message = str(getattr(error, "message", "") or "")
    if getattr(error, "code", None) == "context_overflow" and not message.lower().startswith(_TOO_LONG):
        return f"{_TOO_LONG}: {message}" if message else _TOO_LONG
    return message


def error_body(status: int, message: str, error: Any = None) -> bytes:
    return _encode({"type": "error", "error": {"type": anthropic_type(status, error), "message": message}})


def from_openai_body(status: int, body: bytes) -> bytes:
    """An error body of ours (OpenAI's shape) in Anthropic's."""
    try:
        data = loads(body)
    except (msgspec.DecodeError, RecursionError):
        data = None
    if isinstance(data, dict) and data.get("type") == "error":
        return body  # already Anthropic's
    err = data.get("error") if isinstance(data, dict) else None
    if isinstance(err, dict):
        return error_body(status, str(err.get("message") or ""), err)
    return error_body(status, body.decode("utf-8", "replace")[:2000])


def is_messages_path(path: str) -> bool:
    """The Messages endpoints: their errors are Anthropic-shaped."""
    return path.endswith("/v1/messages") or path.endswith("/v1/messages/count_tokens")


def error_event(type_: str, message: str) -> bytes:
    """An ``event: error`` of a Messages stream."""
    return b"event: error\ndata: " + _encode({"type": "error", "error": {"type": type_, "message": message}}) + b"\n\n"


def _event(status: int, type_: str, code: str | None, message: str) -> bytes:
    return error_event(anthropic_type(status, {"type": type_}), message)


# a pass-through relay's own errors (the upstream unreachable, a stream cut) as a Messages client reads them
ANTHROPIC_ERRORS = ErrorVoice(from_openai_body, _event)
