"""The Responses API (``POST /v1/responses``) on the tree (docs/behaviour.md#the-responses-api).

    request.py    a client's Responses request read and checked; the items it sends
    checks.py     items checked before they are stored unsent (a conversation's added items)
    items.py      Responses items -> chat messages; response ids <-> node ids; an upstream's response read
    parts.py      an item's content parts in chat terms (a tool output's images and files as lines)
    outbound.py   chat messages -> Responses items: what a Responses upstream gets, what a chat node lists as
    translate.py  a Responses request for a chat upstream, and the response objects we serve
    stream.py     Responses event streams: translated from a chat stream, or relayed natively
    for_chat.py   chat-completions clients over a Responses upstream: request, answer, stream
    exchange.py   the three ways an answer travels back (native, from chat, to chat)
    tools.py      its tools over a chat upstream: functions, custom tools, namespaces of them, hosted tools dropped
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ...key_order import with_key_order
from .. import Transcript
from . import for_chat, items, outbound, tools, translate
from .exchange import ChatOverResponses, ResponsesNative, ResponsesOverChat
from .request import call_items, parse_responses_body

__all__ = ["DIALECT", "Responses"]


class Responses:
    name = "responses"
    parent_param = "previous_response_id"
    endpoint = "responses"

    def parse(self, raw: bytes) -> dict[str, Any]:
        return parse_responses_body(raw)

    def items(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        return call_items(body)

    def params(self, body: dict[str, Any]) -> dict[str, Any]:
        # (the instructions stay among them too: the answer's response object repeats them; the
        # order of its schemas' properties, which jsonb does not keep: ``key_order``)
        return with_key_order({k: v for k, v in body.items() if k != "input"})

    def read(self, items_: list[dict[str, Any]]) -> Transcript:
        messages, ordinals = items.convert(items_)
        return Transcript(messages, ordinals)

    def to_messages(self, items_: Iterable[Any], provider: str | None) -> list[dict[str, Any]]:
        return items.to_messages(items_, provider)

    def error_body(self, failure: Any) -> bytes:
        return failure.body

    def cleared(self, item: dict[str, Any], text: str) -> dict[str, Any] | None:
        return items.cleared(item, text)

    def params_to_chat(self, params: dict[str, Any]) -> dict[str, Any]:
        return translate.chat_params(params)

    def params_from_chat(self, params: dict[str, Any]) -> dict[str, Any]:
        return for_chat.request_fields(params)

    def check_from_chat(self, params: dict[str, Any], name: Callable[[str], str] = str) -> None:
        for_chat.check_fields(params, name)

    def chat_field(self, name: str) -> str:
        return translate.CHAT_FIELDS.get(name, name)

    def check_to_chat(self, params: dict[str, Any]) -> None:
        translate.check_to_chat(params)

    def unsupported_by_chat(self, params: dict[str, Any]) -> list[str]:
        return tools.hosted(params.get("tools"))

    def unsupported_from_chat(self, params: dict[str, Any]) -> list[str]:
        return []  # (custom tools too: the Responses API has them)

    def history_params(self, params: dict[str, Any], messages: Iterable[dict[str, Any]]) -> dict[str, Any]:
        # (read only when the call offers a tool search the client runs: most calls need no scan)
        return self.summary_keys(messages) if tools.searches(params.get("tools")) else {}

    def reasoning_turns(self, params: dict[str, Any]) -> int | None:
        return None

    def summary_keys(self, messages: Iterable[dict[str, Any]]) -> dict[str, Any]:
        loaded = items.loaded_tools(messages)
        return {tools.LOADED: loaded} if loaded else {}

    def native_params(self, params: dict[str, Any]) -> dict[str, Any]:
        return translate.native_params(params)

    def request_body(self, fields: dict[str, Any], messages: Sequence[dict[str, Any]], provider: str | None, *,
                     stream: bool) -> bytes:
        return outbound.request_body(fields, messages, provider, stream=stream)

    def relay(self, *, node_id: uuid.UUID, params: dict[str, Any], provider: str) -> ResponsesNative:
        return ResponsesNative(node_id=node_id, params=params, provider=provider)

    def over_chat(self, *, node_id: uuid.UUID, params: dict[str, Any], provider: str) -> ResponsesOverChat:
        return ResponsesOverChat(node_id=node_id, params=params, instructions=params.get("instructions"),
                                 provider=provider)

    def for_chat(self, *, node_id: uuid.UUID, provider: str) -> ChatOverResponses:
        return ChatOverResponses(node_id=node_id, provider=provider)


DIALECT = Responses()
