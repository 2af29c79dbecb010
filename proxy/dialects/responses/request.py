"""A client's Responses request, read and checked (every field kept), and what it sends: its
instructions (the system rule's system message) and its input items."""

from __future__ import annotations

from typing import Any

from ...errors import InvalidRequest
from .. import parse_model_request
from .items import input_items

__all__ = ["call_items", "parse_responses_body"]


def parse_responses_body(raw: bytes) -> dict[str, Any]:
    body = parse_model_request(raw)
    value = body.get("input")
    if not isinstance(value, (str, list)):
        raise InvalidRequest("'input' is required: a string or an array of items", param="input")
    if isinstance(value, list) and not all(isinstance(i, dict) for i in value):
        raise InvalidRequest("every input item must be an object", param="input")
    tools = body.get("tools")
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
        raise InvalidRequest("'tools' must be an array of objects", param="tools")
    if body.get("stream") is not None and not isinstance(body["stream"], bool):
        raise InvalidRequest("'stream' must be a boolean", param="stream")
    previous = body.get("previous_response_id")
    if previous is not None and not isinstance(previous, str):
        raise InvalidRequest("'previous_response_id' must be a string", param="previous_response_id")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, (str, list)):
        raise InvalidRequest("'instructions' must be a string", param="instructions")
    return body


def call_items(body: dict[str, Any]) -> list[dict[str, Any]]:
    """What the call sends: its instructions (the system rule's system message) and its input."""
    instructions = body.get("instructions")
    head: list[dict[str, Any]] = []
    if isinstance(instructions, str) and instructions:
        head = [{"type": "message", "role": "system", "content": instructions}]
    elif isinstance(instructions, list):
        head = [i for i in instructions if isinstance(i, dict)]
    return head + input_items(body["input"])
