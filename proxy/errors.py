"""Errors Branchpoint answers with, all rendered in OpenAI's shape
``{"error": {"message", "type", "param", "code"}}``.

    BranchpointError                    (status, type, code)
     ├── InvalidRequest                 400 invalid_request_error / invalid_request
     │    ├── InvalidConversationId     400 invalid_conversation_id
     │    └── PayloadTooLarge           413 payload_too_large
     ├── AuthenticationFailed           401 invalid_api_key
     ├── NotFound                       404
     │    ├── NodeNotFound              404 node_not_found
     │    └── ConversationNotFound      404 conversation_not_found
     ├── Conflict                       409
     │    ├── ConversationBusy          409 conversation_busy
     │    └── ParentBeforeCompaction    409 parent_before_compaction
     ├── UpstreamFailure                (the upstream could not give an answer)
     │    ├── UpstreamUnreachable       502 upstream_unreachable
     │    ├── UpstreamBadResponse       502 upstream_bad_response
     │    └── UpstreamTimeout           504 upstream_timeout
     └── ServiceUnavailable             503 database_unavailable

Errors of other layers are translated once, where they cross into the HTTP layer: httpx errors
in ``proxy.upstream``, storage errors in the app's exception handlers.
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = [
    "AuthenticationFailed",
    "BranchpointError",
    "Conflict",
    "ConversationBusy",
    "ConversationNotFound",
    "InvalidConversationId",
    "InvalidRequest",
    "NodeNotFound",
    "NotFound",
    "ParentBeforeCompaction",
    "PayloadTooLarge",
    "ServiceUnavailable",
    "UpstreamBadResponse",
    "UpstreamFailure",
    "UpstreamTimeout",
    "UpstreamUnreachable",
    "error_body",
]

_encode = msgspec.json.Encoder().encode


def error_body(message: str, type_: str, code: str | None = None, param: str | None = None) -> bytes:
    """The JSON bytes of an OpenAI-shaped error; all four keys always present."""
    return _encode({"error": {"message": message, "type": type_, "param": param, "code": code}})


class BranchpointError(Exception):
    status: int = 500
    type: str = "server_error"
    code: str | None = "internal_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        self.headers = headers or {}

    def body(self) -> bytes:
        return error_body(self.message, self.type, self.code, self.param)

    def as_dict(self) -> dict[str, Any]:
        return {"message": self.message, "type": self.type, "param": self.param, "code": self.code}


class InvalidRequest(BranchpointError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_request"

    def __init__(self, message: str, *, status: int = 400, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.status = status


class InvalidConversationId(InvalidRequest):
    code = "invalid_conversation_id"


class PayloadTooLarge(InvalidRequest):
    code = "payload_too_large"

    def __init__(self, message: str, **kw: Any) -> None:
        super().__init__(message, status=413, **kw)


class AuthenticationFailed(BranchpointError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class NotFound(BranchpointError):
    status = 404
    type = "not_found_error"
    code = "not_found"


class NodeNotFound(NotFound):
    code = "node_not_found"


class ConversationNotFound(NotFound):
    code = "conversation_not_found"


class Conflict(BranchpointError):
    status = 409
    type = "conflict_error"
    code = "conflict"


class ConversationBusy(Conflict):
    code = "conversation_busy"


class ParentBeforeCompaction(Conflict):
    code = "parent_before_compaction"


class UpstreamFailure(BranchpointError):
    """No usable answer came from the upstream (no HTTP status of its own, or garbage)."""

    status = 502
    type = "upstream_error"
    code = "upstream_error"


class UpstreamUnreachable(UpstreamFailure):
    code = "upstream_unreachable"


class UpstreamBadResponse(UpstreamFailure):
    code = "upstream_bad_response"


class UpstreamTimeout(UpstreamFailure):
    status = 504
    code = "upstream_timeout"


class ServiceUnavailable(BranchpointError):
    status = 503
    type = "service_unavailable"
    code = "database_unavailable"
