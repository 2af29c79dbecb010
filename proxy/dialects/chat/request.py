"""A client's chat request, read and checked: every field kept, what cannot be a chat request
refused (400)."""

from __future__ import annotations

from typing import Any

from ...assembly import CHAT_ROLES
from ...errors import InvalidRequest
from .. import parse_model_request, refuse_own_keys

__all__ = ["parse_chat_body"]


def parse_chat_body(raw: bytes) -> dict[str, Any]:
    """The client's body as a dict (every field kept); refuses what cannot be a chat request."""
    body = parse_model_request(raw)
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise InvalidRequest("'messages' is required and must be an array", param="messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InvalidRequest(f"messages[{i}] must be an object", param=f"messages[{i}]")
        role = message.get("role")
        if not isinstance(role, str) or role not in CHAT_ROLES:
            raise InvalidRequest(f"messages[{i}].role must be one of {sorted(CHAT_ROLES)}", param=f"messages[{i}].role")
        refuse_own_keys(message, f"messages[{i}]")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise InvalidRequest("'stream' must be a boolean", param="stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise InvalidRequest("'stream_options' must be an object", param="stream_options")
    return body
