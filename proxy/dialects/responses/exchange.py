"""How a stored call's answer travels back when the Responses API is on one side of it:

    client      upstream    exchange
    chat        responses   ChatOverResponses    translated both ways (for_chat)
    responses   chat        ResponsesOverChat    translated both ways (translate, stream.FromChat)
    responses   responses   ResponsesNative      relayed, with the node's response id and item ids (relayed.Native)

Each turns the upstream's answer into what the client gets and what is stored (``answer``), and
gives the stream relay its translator.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import msgspec

from ...relay import Translator
from ...secrets import Masker
from ...surrogates import loads
from .. import Answer
from ..chat import parse_completion
from ..chat.masking import masked_chunks
from . import for_chat, translate
from . import stream as responses_stream
from .compaction import compaction_item
from .items import read_response, response_id, to_messages
from .relayed import Deltas, Native
from .tools import offered

__all__ = ["ChatOverResponses", "ResponsesNative", "ResponsesOverChat", "compaction_output", "own_item_ids"]

_COMPACTED = "_bp_compacted"  # (proxy.call.COMPACTED: the compaction node the call was compacted under)


def compaction_output(params: dict[str, Any], node_id: uuid.UUID) -> list[dict[str, Any]]:
    """The compaction item a client's answer begins with (none when the call was not compacted
    under its client's compaction controls). Never stored with the node: it stands for its path."""
    node = params.get(_COMPACTED)
    return [] if node is None else [compaction_item(node, node_id)]

_encode = msgspec.json.Encoder().encode


class ChatOverResponses:
    def __init__(self, *, node_id: uuid.UUID, provider: str) -> None:
        self.node_id = node_id
        self.provider = provider

    def answer(self, content: bytes) -> Answer:
        data = read_response(content)
        body, message = for_chat.completion(data, self.node_id, self.provider)
        choice = body["choices"][0]
        return Answer(_encode(body), [message], [message], body["usage"], choice["finish_reason"])

    def translator(self, *, wants_usage: bool, secrets: Sequence[str | None] = ()) -> Translator:
        # each event masked whole, and the chunks' text across deltas: a chat client gets no done
        # events, only the deltas (docs/behaviour.md#limits-and-hostile-peers)
        return for_chat.ToChat(node_id=self.node_id, provider=self.provider, wants_usage=wants_usage,
                               masker=Masker(secrets) or None, chunks=masked_chunks(secrets))

    def messages(self, received: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return received


class ResponsesOverChat:
    def __init__(self, *, node_id: uuid.UUID, params: dict[str, Any], instructions: Any, provider: str) -> None:
        self.node_id = node_id
        self.params = params
        self.instructions = instructions
        self.provider = provider

    def answer(self, content: bytes) -> Answer:
        completion = parse_completion(content)
        output = translate.output_items(completion.message, self.node_id, offered(self.params), self.provider)
        usage = translate.usage_of(completion.usage)
        response = translate.response_object(node_id=self.node_id, params=self.params,
                                             output=[*compaction_output(self.params, self.node_id), *output],
                                             usage=usage, instructions=self.instructions,
                                             finish_reason=completion.finish_reason, model=loads(content).get("model"))
        return Answer(_encode(response), output, self.messages(output), usage, completion.finish_reason)

    def translator(self, *, wants_usage: bool, secrets: Sequence[str | None] = ()) -> Translator:
        return responses_stream.FromChat(node_id=self.node_id, params=self.params, instructions=self.instructions,
                                         provider=self.provider,
                                         masker=masked_chunks(secrets),
                                         compaction=compaction_output(self.params, self.node_id))

    def messages(self, received: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return to_messages(received, self.provider)


class ResponsesNative:
    def __init__(self, *, node_id: uuid.UUID, params: dict[str, Any], provider: str) -> None:
        self.node_id = node_id
        self.params = params
        self.provider = provider

    def answer(self, content: bytes) -> Answer:
        data = read_response(content)
        data.update(id=response_id(self.node_id), **translate.client_fields(self.params))
        output = own_item_ids([item for item in data["output"] if isinstance(item, dict)], self.node_id)
        data["output"] = [*compaction_output(self.params, self.node_id), *output]
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else None
        finish = translate.finish_of(data)
        return Answer(_encode(data), output, self.messages(output), usage, finish)

    def translator(self, *, wants_usage: bool, secrets: Sequence[str | None] = ()) -> Translator:
        # each event masked whole, and the deltas' text across the events of a part
        # (docs/behaviour.md#limits-and-hostile-peers)
        return Native(node_id=self.node_id, client=translate.client_fields(self.params), masker=Masker(secrets) or None,
                      deltas=Deltas(secrets) or None, compaction=compaction_output(self.params, self.node_id))

    def messages(self, received: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return to_messages(received, self.provider)


def own_item_ids(output: list[dict[str, Any]], node_id: uuid.UUID) -> list[dict[str, Any]]:
    """Output items with ids of the node's (``translate.gets_our_id``; reasoning items keep the
    provider's, which their encrypted content belongs to): a client that later references one
    (``item_reference``) names a stored node, which the proxy resolves."""
    out = []
    for i, item in enumerate(output):
        if translate.gets_our_id(item):
            item = {**item, "id": translate.output_item_id(node_id, i, item["type"])}
        out.append(item)
    return out
