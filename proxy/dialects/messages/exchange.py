"""How a stored call's answer travels back when the Messages API is on one side of it:

    client      upstream    exchange
    chat        anthropic   ChatOverMessages     translated both ways
    messages    chat        MessagesOverChat     translated both ways (stream.FromChat)
    messages    anthropic   MessagesNative       relayed as it came; reassembled for storage

Each turns the upstream's answer into what the client gets and what is stored (``answer``), and
gives the stream relay its translator.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import msgspec

from ...relay import Translator
from ...surrogates import loads
from .. import Answer
from ..chat import NotACompletion, parse_completion
from ..chat.masking import masked_chunks
from . import answers, stream, translate
from .blocks import to_messages

__all__ = ["ChatOverMessages", "MessagesNative", "MessagesOverChat", "read_message"]

_encode = msgspec.json.Encoder().encode


def read_message(content: bytes) -> dict[str, Any]:
    """An Anthropic upstream's answer, decoded; raises ``NotACompletion`` unless it is a message."""
    try:
        data = loads(content)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise NotACompletion(f"invalid JSON: {type(exc).__name__}") from None
    if not answers.read_message(data):
        raise NotACompletion("not a message")
    return data


class MessagesNative:
    def __init__(self, *, provider: str) -> None:
        self.provider = provider

    def answer(self, content: bytes) -> Answer:
        data = read_message(content)
        received = [{"role": "assistant", "content": [b for b in data["content"] if isinstance(b, dict)]}]
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else None
        return Answer(content, received, self.messages(received), usage, answers.finish_reason(data.get("stop_reason")))

    def translator(self, *, wants_usage: bool, secrets: Sequence[str | None] = ()) -> Translator:
        return stream.Native(secrets=secrets)

    def messages(self, received: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return to_messages(received, self.provider)


class MessagesOverChat:
    def __init__(self, *, node_id: uuid.UUID, params: dict[str, Any], provider: str) -> None:
        self.node_id = node_id
        self.params = params
        self.provider = provider

    def answer(self, content: bytes) -> Answer:
        completion = parse_completion(content)
        blocks = answers.content_of(completion.message, self.node_id, self.provider)
        model = loads(content).get("model") or self.params.get("model")
        body = answers.message_object(node_id=self.node_id, model=model, content=blocks,
                                        stop=answers.stop_reason(completion.finish_reason,
                                                                  any(b.get("type") == "tool_use" for b in blocks)),
                                        usage=answers.anthropic_usage(completion.usage),
                                        applied_edits=self.params.get(translate.APPLIED_EDITS))
        received = [{"role": "assistant", "content": blocks}]
        # (stored: the upstream's usage in chat's terms, whole -- Anthropic's has no word for its
        # reasoning tokens or its total; the client gets its own API's)
        return Answer(_encode(body), received, self.messages(received), completion.usage, completion.finish_reason)

    def translator(self, *, wants_usage: bool, secrets: Sequence[str | None] = ()) -> Translator:
        return stream.FromChat(node_id=self.node_id, params=self.params, provider=self.provider,
                               masker=masked_chunks(secrets))

    def messages(self, received: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return to_messages(received, self.provider)


class ChatOverMessages:
    def __init__(self, *, node_id: uuid.UUID, provider: str) -> None:
        self.node_id = node_id
        self.provider = provider

    def answer(self, content: bytes) -> Answer:
        data = read_message(content)
        body, message = answers.completion(data, self.node_id, self.provider)
        choice = body["choices"][0]
        return Answer(_encode(body), [message], [message], body["usage"], choice["finish_reason"])

    def translator(self, *, wants_usage: bool, secrets: Sequence[str | None] = ()) -> Translator:
        return stream.ToChat(node_id=self.node_id, provider=self.provider, wants_usage=wants_usage, secrets=secrets)

    def messages(self, received: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return received
