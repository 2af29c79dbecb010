"""What several routes need: the request's headers, the conversation id, a node id."""

from __future__ import annotations

import uuid
from typing import Any, Literal

import httpx

from ..decoding import DECODED_CODINGS, decoder_of
from ..errors import InvalidConversationId, InvalidRequest, UpstreamTooLarge
from ..ids import valid_conversation_id
from ..limits import hold

__all__ = ["CREDENTIAL_HEADERS", "RequestHeaders", "context_mode", "decoded_body", "node_kind", "parent_of",
           "parse_node_id", "resolve_conversation_id",
           "valid_conversation_id"]



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


_KINDS = frozenset({"turn", "transform"})
_MODES = frozenset({"delta", "full"})


def node_kind(headers: RequestHeaders) -> Literal["turn", "transform"]:
    """``X-Node-Kind``: a turn (the default) or a transform."""
    kind = (headers.get("x-node-kind") or "turn").strip().lower()
    if kind not in _KINDS:
        raise InvalidRequest("X-Node-Kind must be 'turn' or 'transform'", param="X-Node-Kind")
    return kind  # type: ignore[return-value]


def context_mode(headers: RequestHeaders, default: str) -> str:
    """``X-Context-Mode``: delta or full; ``default`` when it is not given."""
    value = (headers.get("x-context-mode") or "").strip().lower()
    if not value:
        return default
    if value not in _MODES:
        raise InvalidRequest("X-Context-Mode must be 'delta' or 'full'", param="X-Context-Mode")
    return value


def parent_of(headers: RequestHeaders, mode: str) -> tuple[str, uuid.UUID | None]:
    """``X-Parent-Node-Id``: (parent mode, node) -- the head (not given), ``root``, or a node;
    refused in full-history mode, where the messages decide the parent."""
    value = headers.get("x-parent-node-id")
    if value is None or not value.strip():
        return "head", None
    if mode == "full":
        raise InvalidRequest("X-Parent-Node-Id cannot be used in full-history mode: the messages decide the parent",
                             param="X-Parent-Node-Id")
    if value.strip().lower() == "root":
        return "root", None
    return "node", parse_node_id(value, param="X-Parent-Node-Id")


async def decoded_body(request: Any, raw: bytes) -> bytes:
    """A request body as a route that reads it sees it: its ``Content-Encoding`` (gzip, deflate,
    zstd, one or several) undone, inflated no further than ``[server] max_body_bytes`` -- past it
    413, as a body that large; a coding the proxy cannot undo (br, say) 415, naming it. What it
    inflated to counts against ``max_bytes_in_flight`` with the request (``limits.hold``). Such a
    route passes a call through decoded (``Forwarder.forward``)."""
    codings = [c.strip().lower() for v in request.headers.getall("content-encoding", []) for c in v.split(",")]
    codings = [c for c in codings if c and c != "identity"]
    if not codings:
        return raw
    unknown = next((c for c in codings if c not in DECODED_CODINGS), None)
    if unknown is not None:
        raise InvalidRequest(f"the request body's Content-Encoding {unknown!r} is not supported (gzip, deflate and "
                             "zstd are)", status=415, code="unsupported_media_type", param="Content-Encoding")
    limit = request.app.state.runtime.settings.server.max_body_bytes
    decoder = decoder_of(codings, limit)
    if decoder is None:  # (never: every coding is one it knows)
        return raw
    try:
        decoded = b"".join([*decoder.decode(raw), *decoder.flush()])
    except UpstreamTooLarge:
        raise InvalidRequest(f"the request body is larger than {limit} bytes once decoded (server.max_body_bytes)",
                             status=413, code="payload_too_large") from None
    except httpx.DecodingError:
        raise InvalidRequest("the request body is not what its Content-Encoding says",
                             param="Content-Encoding") from None
    await hold(len(decoded) - len(raw))  # (the body as it arrived is counted already)
    return decoded
