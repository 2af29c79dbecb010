"""Anthropic's Messages API (``POST /v1/messages``) on the tree (docs/behaviour.md#the-messages-api).
Its client side is the ``messages`` dialect (a node's ``api``); an upstream that speaks it has
``api = "anthropic"`` -- the same dialect under its provider's name.

    request.py    a client's Messages request read and checked; the items it sends (fragments)
    blocks/       Anthropic messages <-> chat messages; cache_control markers; thinking kept to its provider
    translate.py  requests and answers in chat terms, both ways
    stream.py     Messages event streams: relayed natively, from chat, to chat
    exchange.py   the three ways an answer travels back (native, from chat, to chat)
    errors.py     Anthropic-shaped errors
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ...key_order import KEY_ORDER, encode_sorted
from .. import Transcript
from . import blocks, errors, translate
from .exchange import ChatOverMessages, MessagesNative, MessagesOverChat
from .request import call_items, call_params, kept_thinking_turns, parse_messages_body

__all__ = ["DIALECT", "Messages"]



class Messages:
    name = "messages"
    parent_param = "X-Parent-Node-Id"
    endpoint = "messages"

    def parse(self, raw: bytes) -> dict[str, Any]:
        return parse_messages_body(raw)

    def items(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        return call_items(body)

    def params(self, body: dict[str, Any]) -> dict[str, Any]:
        return call_params(body)

    def read(self, items: list[dict[str, Any]]) -> Transcript:
        return Transcript(blocks.to_messages(items), None)  # (one fragment, one message)

    def to_messages(self, items: Iterable[Any], provider: str | None) -> list[dict[str, Any]]:
        return blocks.to_messages(items, provider)

    def error_body(self, failure: Any) -> bytes:
        return errors.error_body(failure.status, errors.in_anthropic_words(failure.error), failure.error)

    def cleared(self, item: dict[str, Any], text: str) -> dict[str, Any] | None:
        return blocks.cleared(item, text)

    def history_params(self, params: dict[str, Any], messages: Iterable[dict[str, Any]]) -> dict[str, Any]:
        return {}

    def reasoning_turns(self, params: dict[str, Any]) -> int | None:
        return kept_thinking_turns(params)  # (its clear_thinking edit)

    def summary_keys(self, messages: Iterable[dict[str, Any]]) -> dict[str, Any]:
        return {}

    def params_to_chat(self, params: dict[str, Any]) -> dict[str, Any]:
        return translate.chat_params(params)

    def params_from_chat(self, params: dict[str, Any]) -> dict[str, Any]:
        return translate.request_fields(params)

    def check_from_chat(self, params: dict[str, Any], name: Callable[[str], str] = str) -> None:
        translate.check_fields(params, name)

    def chat_field(self, name: str) -> str:
        return translate.CHAT_FIELDS.get(name, name)

    def check_to_chat(self, params: dict[str, Any]) -> None:
        return None  # (the fields it cannot carry are documented as not sent: thinking, top_k ...)

    def unsupported_by_chat(self, params: dict[str, Any]) -> list[str]:
        return translate.hosted(params.get("tools")) + translate.mcp_servers(params.get("mcp_servers"))

    def unsupported_from_chat(self, params: dict[str, Any]) -> list[str]:
        return translate.untaken(params.get("tools"))

    def native_params(self, params: dict[str, Any]) -> dict[str, Any]:
        # the client's fields as they came (our own keys but the markers, which request_body uses)
        return {k: v for k, v in params.items()
                if not k.startswith("_bp_") or k in (blocks.MARKERS, blocks.NO_SYSTEM, KEY_ORDER)}

    def request_body(self, fields: dict[str, Any], messages: Sequence[dict[str, Any]], provider: str | None, *,
                     stream: bool) -> bytes:
        """An Anthropic upstream's request: the fields, the system field and the messages put back
        together from the assembled chat messages, with the call's cache_control markers."""
        fields = dict(fields)
        found = fields.pop(blocks.MARKERS, ())
        # a call without a system field goes on with the stored one, the markers its client put on
        # it kept as far as Anthropic's limit allows beside this call's own
        keep = blocks.LIMIT - len(found) - blocks.count(fields) if fields.pop(blocks.NO_SYSTEM, False) else 0
        system, out = blocks.to_anthropic(messages, provider)
        system = blocks.apply_markers(system, out, found, keep_system=keep)
        body = {**fields, "messages": blocks.sendable(out)}
        if system:
            body["system"] = system
        if stream:
            body["stream"] = True
        return encode_sorted(body)

    def relay(self, *, node_id: uuid.UUID, params: dict[str, Any], provider: str) -> MessagesNative:
        return MessagesNative(provider=provider)

    def over_chat(self, *, node_id: uuid.UUID, params: dict[str, Any], provider: str) -> MessagesOverChat:
        return MessagesOverChat(node_id=node_id, params=params, provider=provider)

    def for_chat(self, *, node_id: uuid.UUID, provider: str) -> ChatOverMessages:
        return ChatOverMessages(node_id=node_id, provider=provider)


DIALECT = Messages()
