"""Errors Branchpoint answers with, all rendered in OpenAI's shape
``{"error": {"message", "type", "param", "code"}}``.

    BranchpointError                    (status, type, code)
     ├── InvalidRequest                 400 invalid_request_error / invalid_request
     │    └── InvalidConversationId     400 invalid_conversation_id
     ├── AuthenticationFailed           401 invalid_api_key
     ├── CrossSiteRefused               403 cross_site_request (a browser page of another site, auth "none")
     ├── NotFound                       404
     │    ├── NodeNotFound              404 node_not_found
     │    └── ConversationNotFound      404 conversation_not_found
     ├── Conflict                       409 (conversation_exists)  x-should-retry: false
     │    ├── ConversationBusy          409 conversation_busy          (retryable)
     │    ├── NodeInFlight              409 node_pending               (retryable)
     │    └── ParentBeforeCompaction    409 parent_before_compaction  x-should-retry: false
     ├── RequestTimeout                 408 request_timeout (the client's body did not arrive in time)
     └── UpstreamFailure                (the upstream could not give an answer)
          ├── UpstreamUnreachable       502 upstream_unreachable
          ├── UpstreamBadResponse       502 upstream_bad_response
          ├── UpstreamTooLarge          502 upstream_response_too_large  x-should-retry: false
          ├── UpstreamHeadersTooLarge   502 upstream_headers_too_large   x-should-retry: false
          └── UpstreamTimeout           504 upstream_timeout

Errors of other layers are translated once, where they cross into the HTTP layer: httpx errors
in ``proxy.upstream`` (``map_exceptions``); storage refusals by ``from_refusal`` (the app's
exception handler, or a caller that knows a better ``param``); the database being away becomes
503 ``database_unavailable`` in the app's exception handler.
"""

from __future__ import annotations

from typing import Any

import msgspec

import storage

__all__ = [
    "AuthenticationFailed",
    "BranchpointError",
    "Conflict",
    "ConversationBusy",
    "ConversationNotFound",
    "CrossSiteRefused",
    "InvalidConversationId",
    "InvalidRequest",
    "NodeInFlight",
    "NodeNotFound",
    "NotFound",
    "ParentBeforeCompaction",
    "RequestTimeout",
    "UpstreamBadResponse",
    "UpstreamFailure",
    "UpstreamHeadersTooLarge",
    "UpstreamTimeout",
    "UpstreamTooLarge",
    "UpstreamUnreachable",
    "error_body",
    "from_refusal",
]

_encode = msgspec.json.Encoder().encode


def error_body(message: str, type_: str, code: str | None = None, param: str | None = None) -> bytes:
    """The JSON bytes of an OpenAI-shaped error; all four keys always present."""
    return _encode({"error": {"message": message, "type": type_, "param": param, "code": code}})


class BranchpointError(Exception):
    """The base of the table above: a subclass names what it changes as keywords of its ``class``
    line (``status``, ``type_``, ``code``) and inherits the rest."""

    status: int = 500
    type: str = "server_error"
    code: str | None = "internal_error"
    # said to the official SDKs, which retry every 408, 409, 429 and 5xx unless told not to
    # (``x-should-retry: false``): only where asking again can help
    retryable: bool = True

    def __init_subclass__(cls, *, status: int | None = None, type_: str | None = None, code: str | None = None,
                          **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if status is not None:
            cls.status = status
        if type_ is not None:
            cls.type = type_
        if code is not None:
            cls.code = code

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        self.headers = headers or {}
        if not self.retryable:
            self.headers.setdefault("x-should-retry", "false")

    def body(self) -> bytes:
        return error_body(self.message, self.type, self.code, self.param)


class InvalidRequest(BranchpointError, status=400, type_="invalid_request_error", code="invalid_request"):
    def __init__(self, message: str, *, status: int = 400, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.status = status


class InvalidConversationId(InvalidRequest, code="invalid_conversation_id"): ...
class AuthenticationFailed(BranchpointError, status=401, type_="authentication_error", code="invalid_api_key"): ...
class CrossSiteRefused(BranchpointError, status=403, type_="permission_error", code="cross_site_request"): ...


class NotFound(BranchpointError, status=404, type_="not_found_error", code="not_found"): ...
class NodeNotFound(NotFound, code="node_not_found"): ...
class ConversationNotFound(NotFound, code="conversation_not_found"): ...


class Conflict(BranchpointError, status=409, type_="conflict_error", code="conflict"):
    retryable = False  # (a name taken, a parent compacted away: the same again)


class ConversationBusy(Conflict, code="conversation_busy"):
    retryable = True  # (the turn in flight ends: the SDK's retry may then go through)


class NodeInFlight(Conflict, code="node_pending"):
    retryable = True  # (the same: once the node's call has ended)


class ParentBeforeCompaction(Conflict, code="parent_before_compaction"): ...


class RequestTimeout(BranchpointError, status=408, type_="invalid_request_error", code="request_timeout"): ...


class UpstreamFailure(BranchpointError, status=502, type_="upstream_error", code="upstream_error"):
    """No usable answer came from the upstream (no HTTP status of its own, or garbage)."""


class UpstreamUnreachable(UpstreamFailure, code="upstream_unreachable"): ...
class UpstreamBadResponse(UpstreamFailure, code="upstream_bad_response"): ...
class UpstreamTooLarge(UpstreamFailure, code="upstream_response_too_large"):
    # (the upstream made and billed an answer past ``max_response_bytes``: an SDK's two retries
    # would pay for two more, as large as likely)
    retryable = False


class UpstreamHeadersTooLarge(UpstreamFailure, code="upstream_headers_too_large"):
    retryable = False  # (the same upstream answers with the same headers)


class UpstreamTimeout(UpstreamFailure, status=504, code="upstream_timeout"): ...


def from_refusal(exc: storage.Refused, *, param: str | None = None) -> BranchpointError:
    """The HTTP error for a refusal of the tree's rules (``storage.Refused``)."""
    message = str(exc)
    if isinstance(exc, storage.Busy):
        return ConversationBusy(message)
    if isinstance(exc, storage.ConversationMissing):
        return ConversationNotFound(message)
    if isinstance(exc, storage.NodeMissing):
        return NodeNotFound(message, param=param or "node_id")
    if isinstance(exc, storage.BeforeCompaction):
        return ParentBeforeCompaction(message, param=param)
    if isinstance(exc, storage.ConversationExists):
        return Conflict(message, code="conversation_exists", param=param or "conversation_id")
    if isinstance(exc, storage.NodePending):
        return NodeInFlight(message, param=param or "node_id")
    return InvalidRequest(message, param=param)
