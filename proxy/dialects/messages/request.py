"""A client's Messages request, read and checked (every field kept), and what it sends: its
``system`` field (the system rule's system message) and its messages, as fragments."""

from __future__ import annotations

from typing import Any

from ...errors import InvalidRequest
from .. import parse_model_request
from .blocks import MARKERS, fragments, markers

__all__ = ["call_items", "call_params", "parse_messages_body"]

_ROLES = frozenset({"user", "assistant", "system"})  # (system: a message of its own, where the client put it)


def parse_messages_body(raw: bytes) -> dict[str, Any]:
    body = parse_model_request(raw)
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise InvalidRequest("messages: Field required (an array of messages)", param="messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in _ROLES:
            raise InvalidRequest(f"messages.{i}: each message is an object whose role is 'user', 'assistant' or 'system'",
                                 param=f"messages.{i}")
        content = m.get("content")
        if not isinstance(content, (str, list)) or (isinstance(content, list)
                                                     and not all(isinstance(b, dict) for b in content)):
            raise InvalidRequest(f"messages.{i}.content: a string or an array of content blocks",
                                 param=f"messages.{i}.content")
    system = body.get("system")
    if system is not None and not isinstance(system, (str, list)):
        raise InvalidRequest("system: a string or an array of text blocks", param="system")
    tools = body.get("tools")
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
        raise InvalidRequest("tools: an array of objects", param="tools")
    if body.get("stream") is not None and not isinstance(body["stream"], bool):
        raise InvalidRequest("stream: a boolean", param="stream")
    return body


def call_items(body: dict[str, Any]) -> list[dict[str, Any]]:
    """What the call sends: the system item, then its messages cut into fragments."""
    return fragments(body.get("system"), body["messages"])


def call_params(body: dict[str, Any]) -> dict[str, Any]:
    """Every other field (stored, forwarded), and where the client put its cache_control markers."""
    params = {k: v for k, v in body.items() if k not in ("messages", "system")}
    found = markers(body.get("system"), body["messages"])
    if found:
        params[MARKERS] = found
    return params
