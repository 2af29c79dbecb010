"""A client's chat request, read and checked: every field kept, what cannot be a chat request
refused (400)."""

from __future__ import annotations

from typing import Any

import msgspec

from ...assembly import CHAT_ROLES
from ...errors import InvalidRequest
from .. import parse_model_request, refuse_own_keys

__all__ = ["parse_chat_body", "raw_messages"]

# the fields of a chat message as clients send them: a message with no other key needs no look at
# its keys for the proxy's own prefix (``refuse_own_keys``)
_PLAIN_KEYS = frozenset({"role", "content", "name", "tool_calls", "tool_call_id", "function_call", "refusal",
                         "audio", "annotations", "reasoning_content", "reasoning", "prefix"})


class _Messages(msgspec.Struct):
    messages: list[msgspec.Raw]


_decode_raw = msgspec.json.Decoder(_Messages).decode


def raw_messages(raw: bytes) -> list[bytes]:
    """Each message of a chat request (``parse_chat_body`` accepted) as the JSON bytes it was sent
    as, in order: the same messages the body holds (a repeated key: the last, as in the body)."""
    return [bytes(m) for m in _decode_raw(raw).messages]


def parse_chat_body(raw: bytes) -> dict[str, Any]:
    """The client's body as a dict (every field kept); refuses what cannot be a chat request."""
    body = parse_model_request(raw)
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise InvalidRequest("'messages' is required and must be an array", param="messages")
    for i, message in enumerate(messages):
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
    return body
