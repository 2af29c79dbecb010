"""OpenAPI documentation of our error shape, so the published schema says what clients get."""

from __future__ import annotations

import msgspec
from litestar.openapi.datastructures import ResponseSpec

__all__ = ["AnthropicErrorResponse", "ErrorBody", "ErrorResponse", "errors"]


class ErrorBody(msgspec.Struct):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(msgspec.Struct):
    """Every error Branchpoint answers with (OpenAI's shape)."""

    error: ErrorBody


_DESCRIPTIONS = {
    400: "Invalid request (invalid_request, invalid_conversation_id)",
    401: "Missing or invalid API key (invalid_api_key)",
    404: "Unknown -- or another tenant's -- conversation or node (conversation_not_found, node_not_found)",
    409: "Conflict (conversation_busy, parent_before_compaction, conversation_exists, node_pending)",
    413: "Request body above server.max_body_bytes (payload_too_large)",
    502: "The upstream could not be reached or answered garbage",
    503: "The database is unavailable (database_unavailable)",
    504: "The upstream did not answer in time (upstream_timeout)",
}


class AnthropicErrorBody(msgspec.Struct):
    type: str
    message: str


class AnthropicErrorResponse(msgspec.Struct):
    """The errors of Anthropic's Messages API routes (its shape)."""

    type: str
    error: AnthropicErrorBody


def errors(*codes: int, anthropic: bool = False) -> dict[int, ResponseSpec]:
    """``responses=`` for a route handler: the error statuses it can answer with (``anthropic``:
    in Anthropic's shape, for the Messages API's routes)."""
    chosen = codes or (400, 401, 404, 409, 413, 503)
    container = AnthropicErrorResponse if anthropic else ErrorResponse
    return {c: ResponseSpec(data_container=container, description=_DESCRIPTIONS[c], generate_examples=False)
            for c in chosen}
