"""What several routes need: the request's headers, the conversation id, a node id."""

from __future__ import annotations

import re
import uuid
from typing import Any

import msgspec

from ..errors import InvalidConversationId, InvalidRequest

__all__ = ["CREDENTIAL_HEADERS", "RequestHeaders", "parse_model_request", "parse_node_id", "resolve_conversation_id",
           "valid_conversation_id"]

_CONVERSATION_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


# Our own request headers: each may be given once (or repeated with the same value).
_SINGLE = frozenset({"x-conversation-id", "x-parent-node-id", "x-node-kind", "x-context-mode"})
# Headers that carry a credential: never forwarded as they came, masked wherever echoed back.
CREDENTIAL_HEADERS = frozenset({"authorization", "api-key", "x-api-key", "proxy-authorization"})


class RequestHeaders:
    """The raw ASGI headers, decoded once (latin-1: every byte is kept, whatever it is): a list to
    forward and a dict to look up. Our own headers may not disagree with themselves."""

    __slots__ = ("items", "lookup")

    def __init__(self, scope: Any) -> None:
        self.items = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
        self.lookup: dict[str, str] = {}
        for k, v in self.items:
            name = k.lower()
            if name in _SINGLE and self.lookup.get(name, v) != v:
                raise InvalidConversationId(f"{k} is given twice with different values", param=k) \
                    if name == "x-conversation-id" else InvalidRequest(f"{k} is given twice with different values", param=k)
            self.lookup[name] = v

    def get(self, name: str) -> str | None:
        return self.lookup.get(name)

    def credentials(self) -> tuple[str, ...]:
        """Every credential the client sent (whole header values, and a bearer token alone)."""
        found: list[str] = []
        for k, v in self.items:
            if k.lower() in CREDENTIAL_HEADERS and v:
                found.append(v)
                scheme, _, token = v.partition(" ")
                if token.strip() and scheme.lower() in ("bearer", "basic"):
                    found.append(token.strip())
        return tuple(found)


def valid_conversation_id(value: str, *, source: str) -> str:
    if not _CONVERSATION_ID.fullmatch(value) or value in (".", ".."):
        raise InvalidConversationId(
            f"invalid conversation id in {source}: 1-128 characters of A-Za-z0-9._:- expected (not . or ..)",
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


_decode = msgspec.json.Decoder().decode


def parse_model_request(raw: bytes) -> dict[str, Any]:
    """A call's body (chat completions, Responses) as a dict, every field kept: a JSON object
    naming a model; anything else is refused with 400."""
    try:
        body = _decode(raw)
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"the request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise InvalidRequest("the request body is nested too deeply") from None
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model or "\x00" in model:
        raise InvalidRequest("'model' is required and must be a non-empty string", param="model")
    return body
