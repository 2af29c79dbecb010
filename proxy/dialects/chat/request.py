"""A client's chat request, read and checked: every field kept, what cannot be a chat request
refused (400)."""

from __future__ import annotations

from typing import Any

import msgspec

from ...assembly import CHAT_ROLES
from ...errors import InvalidRequest
from .. import OWN, parse_model_request, refuse_own_keys

__all__ = ["parse_chat_body", "raw_messages"]

_OWN = OWN.encode()
# how JSON can write the characters of the own prefix ("_", "b", "p") other than as themselves
# (a superset: "\\u0050" and the like only cost the slower check)
_ESCAPED = (b"\\u005", b"\\u0062", b"\\u0070")


def _may_hold_own_keys(raw: bytes) -> bool:
    """False when no key anywhere in ``raw`` can begin with the proxy's own prefix: neither the
    prefix nor an escape that could spell it is in the bytes."""
    return _OWN in raw or any(e in raw for e in _ESCAPED)


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
    own = _may_hold_own_keys(raw)
    for i, message in enumerate(messages):
        if type(message) is not dict:
            raise InvalidRequest(f"messages[{i}] must be an object", param=f"messages[{i}]")
        role = message.get("role")
        if type(role) is not str or role not in CHAT_ROLES:
            raise InvalidRequest(f"messages[{i}].role must be one of {sorted(CHAT_ROLES)}", param=f"messages[{i}].role")
        if own:
            refuse_own_keys(message, f"messages[{i}]")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise InvalidRequest("'stream' must be a boolean", param="stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise InvalidRequest("'stream_options' must be an object", param="stream_options")
    return body
