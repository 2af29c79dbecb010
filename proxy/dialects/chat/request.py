"""A client's chat request, read and checked: every field kept, what cannot be a chat request
refused (400)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from ...assembly import CHAT_ROLES
from ...errors import InvalidRequest
from .. import parse_model_request, refuse_own_keys

__all__ = ["parse_chat_body", "parse_chat_history", "raw_messages"]

# the fields of a chat message as clients send them: a message with no other key needs no look at
# its keys for the proxy's own prefix (``refuse_own_keys``)
_PLAIN_KEYS = frozenset({"role", "content", "name", "tool_calls", "tool_call_id", "function_call", "refusal",
                         "audio", "annotations", "reasoning_content", "reasoning", "prefix"})


class _Messages(msgspec.Struct):
    messages: list[msgspec.Raw]


_decode_raw = msgspec.json.Decoder(_Messages).decode


def raw_messages(raw: bytes) -> list[bytes] | None:
    """Each message of a chat request (``parse_chat_body`` accepted) as the JSON bytes it was sent
    as, in order: the same messages the body holds (a repeated key: the last, as in the body).
    None when they cannot be told apart so (a repeated ``messages`` key whose first value is no
    array; or a body holding a lone surrogate escape, which ``parse_model_request`` read and this
    decoder refuses)."""
    try:
        return [bytes(m) for m in _decode_raw(raw).messages]
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None


def parse_chat_body(raw: bytes) -> dict[str, Any]:
    """The client's body as a dict (every field kept); refuses what cannot be a chat request."""
    body = parse_model_request(raw)
    _check(body, 0)
    return body


def parse_chat_history(raw: bytes, seen: Callable[[list[bytes]], int]) -> tuple[dict[str, Any], list[bytes] | None]:
    """``parse_chat_body`` for a client that resends its history: also each message's bytes
    (``raw_messages``); the messages ``seen`` says were sent before (the first n: items the same
    checks passed then) are not checked again."""
    body = parse_model_request(raw)
    if not isinstance(body.get("messages"), list):
        _check(body, 0)  # (refused)
    raws = raw_messages(raw)
    known = seen(raws) if raws is not None and len(raws) == len(body["messages"]) else 0
    _check(body, known)
    return body, raws


def _check(body: dict[str, Any], start: int) -> None:
    """Refuse what cannot be a chat request; messages before ``start`` passed these checks before."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise InvalidRequest("'messages' is required and must be an array", param="messages")
    for i in range(start, len(messages)):
        message = messages[i]
        if type(message) is not dict:
            raise InvalidRequest(f"messages[{i}] must be an object", param=f"messages[{i}]")
        role = message.get("role")
        if type(role) is not str or role not in CHAT_ROLES:
            raise InvalidRequest(f"messages[{i}].role must be one of {sorted(CHAT_ROLES)}", param=f"messages[{i}].role")
        if not message.keys() <= _PLAIN_KEYS:
            refuse_own_keys(message, f"messages[{i}]")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise InvalidRequest("'stream' must be a boolean", param="stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise InvalidRequest("'stream_options' must be an object", param="stream_options")
