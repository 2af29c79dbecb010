"""The chat-completions API (``POST /v1/chat/completions``): the pivot dialect.

    request.py     a client's chat request read and checked
    completion.py  a chat completion read (the assistant message, usage, finish reason)
    stream.py      chat streams: the chunks merged into the stored message, relayed as they arrive
    masking.py     the call's credentials masked in a chat stream's text, across its deltas
    markers.py     the client's cache_control markers: the call's own, by position, on the request

Its items are chat messages already, so every translation to or from chat is the identity here;
the other dialects translate to and from it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ...assembly import SYSTEM_AT, build_body, strip
from ...key_order import with_key_order
from ...secrets import Masker
from .. import Answer, Transcript
from .completion import Completion, NotACompletion, call_id, parse_completion
from .markers import MARKERS, markers
from .masking import masked_chunks
from .request import parse_chat_body
from .stream import ChatStream, StreamAccumulator

__all__ = ["DIALECT", "Chat", "ChatExchange", "ChatStream", "Completion", "NotACompletion", "StreamAccumulator",
           "call_id", "parse_completion"]


class ChatExchange:
    """A chat client and a chat upstream: the answer relayed as it is."""

    def answer(self, content: bytes) -> Answer:
        completion = parse_completion(content)
        return Answer(content, [completion.message], [completion.message], completion.usage, completion.finish_reason)

    def translator(self, *, wants_usage: bool, secrets: Sequence[str | None] = ()) -> ChatStream:
        return ChatStream(strip_usage=not wants_usage, masker=masked_chunks(secrets), whole=Masker(secrets) or None)

    def messages(self, received: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return received


_EXCHANGE = ChatExchange()


class Chat:
    name = "chat"
    parent_param = "X-Parent-Node-Id"
    endpoint = "chat/completions"

    def parse(self, raw: bytes) -> dict[str, Any]:
        return parse_chat_body(raw)

    def items(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        return body["messages"]

    def params(self, body: dict[str, Any], *, marked: bool = True, schemas: bool = True) -> dict[str, Any]:
        """Every other field, and where the client put its cache_control markers (``markers``:
        the builder puts back the call's own, and only those). ``marked``: False when the body is
        known to hold none (its bytes do not say ``cache_control``), which spares a long history
        the look at every message. ``schemas`` likewise for the order of a JSON Schema's
        properties (``key_order``: the body keeps the client's order there)."""
        params = {k: v for k, v in body.items() if k != "messages"}
        if schemas:
            params = with_key_order(params)
        found = markers(body["messages"]) if marked else None
        if found:
            params[MARKERS] = found
        return params

    def read(self, items: list[dict[str, Any]]) -> Transcript:
        return Transcript(items, None)

    def to_messages(self, items: Iterable[Any], provider: str | None) -> list[dict[str, Any]]:
        return items if isinstance(items, list) else list(items)

    def error_body(self, failure: Any) -> bytes:
        return failure.body

    def cleared(self, item: dict[str, Any], text: str) -> dict[str, Any] | None:
        return None  # (chat messages are the items themselves: nothing of its own beside them)

    def history_params(self, params: dict[str, Any], messages: Iterable[dict[str, Any]]) -> dict[str, Any]:
        return {}

    def reasoning_turns(self, params: dict[str, Any]) -> int | None:
        return None

    def summary_keys(self, messages: Iterable[dict[str, Any]]) -> dict[str, Any]:
        return {}

    def params_to_chat(self, params: dict[str, Any]) -> dict[str, Any]:
        return params

    def params_from_chat(self, params: dict[str, Any]) -> dict[str, Any]:
        return params

    def check_from_chat(self, params: dict[str, Any], name: Callable[[str], str] = str) -> None:
        return None

    def chat_field(self, name: str) -> str:
        return name

    def check_to_chat(self, params: dict[str, Any]) -> None:
        return None

    def unsupported_by_chat(self, params: dict[str, Any]) -> list[str]:
        return []

    def unsupported_from_chat(self, params: dict[str, Any]) -> list[str]:
        return []

    def native_params(self, params: dict[str, Any]) -> dict[str, Any]:
        if SYSTEM_AT in params or MARKERS in params:  # (our own keys: never sent)
            return {k: v for k, v in params.items() if k != SYSTEM_AT and k != MARKERS}
        return params

    def request_body(self, fields: dict[str, Any], messages: Sequence[dict[str, Any]], provider: str | None, *,
                     stream: bool) -> bytes:
        return build_body(fields, strip(messages), stream=stream)

    def relay(self, *, node_id: uuid.UUID, params: dict[str, Any], provider: str) -> ChatExchange:
        return _EXCHANGE

    over_chat = relay

    def for_chat(self, *, node_id: uuid.UUID, provider: str) -> ChatExchange:
        return _EXCHANGE


DIALECT = Chat()
