"""What several routes need: the request's headers, the conversation id, a node id."""

from __future__ import annotations

import re
import uuid
from typing import Any

from ..errors import InvalidConversationId, InvalidRequest

__all__ = ["RequestHeaders", "parse_node_id", "resolve_conversation_id", "valid_conversation_id"]

_CONVERSATION_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


class RequestHeaders:
    """The raw ASGI headers, decoded once: a list to forward and a dict to look up."""

    __slots__ = ("items", "lookup")

    def __init__(self, scope: Any) -> None:
        self.items = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
        self.lookup = {k.lower(): v for k, v in self.items}

    def get(self, name: str) -> str | None:
        return self.lookup.get(name)


def valid_conversation_id(value: str, *, source: str) -> str:
    if not _CONVERSATION_ID.fullmatch(value):
        raise InvalidConversationId(
            f"invalid conversation id in {source}: 1-128 characters of A-Za-z0-9._:- expected",
            param=source,
        )
    return value


def resolve_conversation_id(path_value: str | None, header_value: str | None) -> str | None:
    """The conversation named by the ``/c/{id}`` prefix and/or ``X-Conversation-Id`` (which must
    agree when both are given); None for a plain pass-through call."""
    if path_value is not None:
        valid_conversation_id(path_value, source="path")
    if header_value is not None:
        header_value = header_value.strip()
        valid_conversation_id(header_value, source="X-Conversation-Id")
    if path_value is not None and header_value is not None and path_value != header_value:
        raise InvalidConversationId(
            "the conversation id of the path and of X-Conversation-Id disagree", param="X-Conversation-Id"
        )
    return path_value if path_value is not None else header_value


def parse_node_id(value: str, *, param: str) -> uuid.UUID:
    try:
        return uuid.UUID(value.strip())
    except ValueError:
        raise InvalidRequest(f"{param} is not a node id (a UUID)", param=param) from None
