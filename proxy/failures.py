"""Failed calls: one ``NodeError`` (what a failed node stores) and one ``Failure`` (that error, its
``Outcome`` -- the row of the failure table, docs/behaviour.md#failures -- and what the client
gets). The failures read from what came back, or from an error, are built here:

- ``classify``: an upstream HTTP answer that is not a success (the upstream boundary's job);
- ``Failure.from_error``: a failure without an HTTP status (our ``UpstreamFailure``s, the
  proxy's own error) -- always transient;
- ``not_a_completion``: a 2xx that is not a chat completion (an error body in disguise, or garbage);
- ``from_stream_error``: an error event inside a stream;
- ``interrupted``: a call the proxy stopped itself, its shutdown grace having run out.

The rest are made with ``Failure.of`` where they happen: the relay's (``proxy.relay``: a stream
cut or ended without its end event, the relay's own error, ``client_disconnected``).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import msgspec

from storage import Outcome

from .errors import BranchpointError, InvalidRequest, UpstreamBadResponse, error_body
from .secrets import redact_bytes
from .surrogates import encode, loads

__all__ = ["Failure", "NodeError", "cancellation_handled", "classify", "from_stream_error", "interrupted",
           "not_a_completion", "reaped"]


class NodeError(msgspec.Struct, omit_defaults=True):
    """A failed node's ``error``. ``status`` is the upstream's HTTP status (None if it gave none)."""

    type: str
    code: str | None
    message: str
    status: int | None
    upstream_code: str | None = None  # overflows: the provider's own code, when it differs


@dataclass(frozen=True, slots=True)
class Failure:
    """A call that produced no answer: what the node stores and what the client gets."""

    outcome: Outcome
    error: NodeError
    status: int  # the client's HTTP status
    body: bytes  # the client's OpenAI-shaped error body
    retryable: bool = True  # False: answered with ``x-should-retry: false`` (``BranchpointError.retryable``)

    def headers(self) -> list[tuple[str, str]]:
        """What the client's answer says besides the node's headers: only whether to ask again."""
        return [] if self.retryable else [("x-should-retry", "false")]

    @classmethod
    def from_error(cls, exc: BranchpointError, *, status: int | None = None) -> Failure:
        """A failure without an upstream HTTP answer: transient (a retry may well succeed) -- but a
        refusal of our own (``InvalidRequest``: a field or tool we cannot translate) is invalid,
        and so never becomes context (the head stays)."""
        error = NodeError(type=exc.type, code=exc.code, message=exc.message, status=None)
        outcome = Outcome.INVALID if isinstance(exc, InvalidRequest) else Outcome.TRANSIENT
        return cls(outcome, error, status or exc.status, exc.body(), exc.retryable)

    @classmethod
    def of(cls, outcome: Outcome, type_: str, code: str, message: str, status: int = 502) -> Failure:
        """A failure of our own making (a cut stream, a client gone, the relay's own error)."""
        return cls(outcome, NodeError(type=type_, code=code, message=message, status=None), status,
                   error_body(message, type_, code))


# How providers say "your prompt does not fit" (OpenAI, Azure, Anthropic-compatible, vLLM, Ollama,
# Mistral, Groq, DeepSeek, llama.cpp, xAI, Gemini ...), in an error's code or type, or its text.
# Checked only on 400/413 answers -- and on a 422 only in text-generation-inference's words (a 422
# is a validation error: "n exceeds the maximum" is no overflow).
_OVERFLOW_STATUSES = frozenset({400, 413})
_TGI_OVERFLOW = re.compile(r"`?inputs`? tokens \+ `?max_new_tokens`? must be", re.IGNORECASE)
_OVERFLOW_CODES = frozenset({"context_length_exceeded", "context_window_exceeded", "prompt_too_long",
                             "exceed_context_size_error"})
_OVERFLOW_TEXT = re.compile(
    r"maximum context length|context[ _]length|context window|context size|prompt is too long|"
    r"maximum prompt length|input token count|too many (input )?tokens|input is too long|"
    r"exceeds? the (model'?s? )?(maximum|max)|reduce the length of the (messages|prompt)",
    re.IGNORECASE,
)


def _error_fields(body: bytes) -> tuple[str | None, str | None, str | None]:
    """(type, code, message) from an OpenAI-shaped (or close) error body; Nones if unreadable."""
    try:
        data = loads(body)
    except (msgspec.DecodeError, RecursionError):
        return None, None, None
    if isinstance(data, list) and len(data) == 1:  # (Gemini's OpenAI-compatible errors come in a list)
        data = data[0]
    err = data.get("error") if isinstance(data, dict) else None
    if isinstance(err, str):
        return None, None, err
    if not isinstance(err, dict):
        for key in ("message", "detail"):  # (a bare message; a FastAPI server's detail)
            if isinstance(data, dict) and isinstance(data.get(key), str):
                return None, None, data[key]
        return None, None, None
    code = err.get("code")
    return (
        err.get("type") if isinstance(err.get("type"), str) else None,
        str(code) if code is not None else None,
        err.get("message") if isinstance(err.get("message"), str) else None,
    )


# a request refused for its bytes, not its tokens (Anthropic's 413 "Request exceeds the maximum
# allowed number of bytes"): no summary makes it fit
_TOO_LARGE = "request_too_large"


def _is_overflow(type_: str | None, code: str | None, message: str | None) -> bool:
    if _TOO_LARGE in (type_, code):
        return False
    return code in _OVERFLOW_CODES or type_ in _OVERFLOW_CODES or bool(message and _OVERFLOW_TEXT.search(message))


def classify(status: int, body: bytes, secrets: Iterable[str | None] = ()) -> Failure:
    """A non-2xx upstream answer, by the failure table. The client gets the upstream's own status
    and body when the body is an OpenAI-shaped error, else an OpenAI-shaped wrapper of it --
    either way with any credential the upstream echoed back masked."""
    body = redact_bytes(body, secrets)
    type_, code, message = _error_fields(body)
    said = message if message is not None else body[:2000].decode("utf-8", "replace")  # (a plain-text error says it so)
    if (status in _OVERFLOW_STATUSES and _is_overflow(type_, code, said)) or \
            (status == 422 and _TGI_OVERFLOW.search(said)):
        outcome = Outcome.OVERFLOW
    elif status in (408, 429) or status >= 500:
        outcome = Outcome.TRANSIENT
    elif 400 <= status < 500:
        outcome = Outcome.INVALID
    else:  # 1xx/3xx: not an answer we can use
        outcome = Outcome.TRANSIENT
    if message is None:
        message = body[:500].decode("utf-8", "replace").strip() or f"upstream answered HTTP {status}"
    error = NodeError(
        type=type_ or "upstream_error",
        code="context_overflow" if outcome is Outcome.OVERFLOW else (code or f"http_{status}"),
        message=message[:2000],
        status=status,
        upstream_code=code if outcome is Outcome.OVERFLOW and code and code != "context_overflow" else None,
    )
    client_status = status if 400 <= status < 600 else 502
    return Failure(outcome, error, client_status, _client_error_body(body, error))


_ERROR_KEYS = ("message", "type", "param", "code")


def _client_error_body(body: bytes, error: NodeError) -> bytes:
    """The upstream's error body when it is OpenAI-shaped with all four keys (relayed byte for
    byte); else the same error with the missing keys filled in; else a wrapper of what it said."""
    try:
        data = loads(body)
    except (msgspec.DecodeError, RecursionError):
        data = None
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        upstream_error = data["error"]
        if all(k in upstream_error for k in _ERROR_KEYS):
            return body
        filled = {k: upstream_error.get(k) for k in _ERROR_KEYS}
        if filled["message"] is None:
            filled["message"] = error.message
        if filled["type"] is None:
            filled["type"] = error.type
        if data.get("object") == "response":  # (a Responses upstream's failed response: the error is all it says)
            return msgspec.json.encode({"error": {**upstream_error, **filled}})
        return msgspec.json.encode({**data, "error": {**upstream_error, **filled}})
    return error_body(error.message, error.type, error.code)


def not_a_completion(content: bytes, reason: str, secrets: Iterable[str | None], status: int = 200) -> Failure:
    """A 2xx (``status``) whose body is not a completion: an error body in disguise (classified like
    a 502 -- but an overflow it says, a Responses upstream's failed response among them, is one, as
    in a stream's error event: answered 400, the head stays), or garbage (502
    ``upstream_bad_response``) -- the node's error keeps the status it came with, as every failure
    the upstream answered with a status does."""
    try:
        data = loads(content)
    except (msgspec.DecodeError, RecursionError):
        data = None
    if isinstance(data, dict) and data.get("error"):
        failure = classify(400, content, secrets)
        if failure.outcome is not Outcome.OVERFLOW:
            failure = classify(502, content, secrets)
    else:
        failure = Failure.from_error(UpstreamBadResponse(f"the upstream answered 2xx without a completion ({reason})"))
    client_status = failure.status if failure.outcome is Outcome.OVERFLOW else 502
    return Failure(failure.outcome, msgspec.structs.replace(failure.error, status=status), client_status, failure.body)


def from_stream_error(error: Any, secrets: Iterable[str | None]) -> Failure:
    """An error event inside a stream: an overflow if it says so, an invalid request if its type
    says that (OpenAI's and Anthropic's ``invalid_request_error``: a stream that refused the
    request as its first word -- the head stays), else transient. Its code is the event's own, else
    ``stream_error`` (no HTTP status said it: the stream came with a 200)."""
    body = encode({"error": error if isinstance(error, dict) else {"message": str(error)}})  # (a lone surrogate: as its escape)
    failure = classify(400, body, secrets)
    if failure.outcome is not Outcome.OVERFLOW and not (isinstance(error, dict)
                                                         and error.get("type") == "invalid_request_error"):
        failure = classify(502, body, secrets)
    error_fields = failure.error
    if error_fields.code != "context_overflow" and not (isinstance(error, dict) and error.get("code") is not None):
        error_fields = msgspec.structs.replace(error_fields, code="stream_error")  # (no status of its own to name)
    return Failure(failure.outcome, msgspec.structs.replace(error_fields, status=None), failure.status, failure.body)


def interrupted(message: str) -> Failure:
    """A call still running when the proxy's shutdown grace ran out (docs/behaviour.md#shutdown):
    transient, like a call the reaper finds after its process died -- the same type and code --,
    and 503 to the client, whose SDK retries it elsewhere."""
    return Failure.of(Outcome.TRANSIENT, "interrupted", "interrupted", message, 503)


def reaped() -> Failure:
    """An answer whose node was reaped before it could be stored (its lease ran out: a process cut
    off from the database for longer): its client is told the call was interrupted, never that it
    succeeded -- the answer is stored nowhere."""
    return interrupted("the call's lease ran out before its answer could be stored; send it again")


def cancellation_handled() -> None:
    """The server's cancellation of the current task has been answered (``interrupted``, or the
    answer itself when it was being stored): undo it, so that later waits in the task are not
    taken for cancelled ones."""
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()
