"""``POST /v1/responses/compact`` (also under ``/c/{id}/v1`` and ``/auto/v1``): compact a conversation, a stored
response's path or the given input now, as OpenAI's endpoint does -- the summary written as a
compaction node, and the compacted window answered (docs/behaviour.md#the-responses-api).
HTTP only: the compaction itself is the compactor's.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import msgspec
from litestar import Request, route
from litestar.di import NamedDependency
from litestar.types import ASGIApp

from storage import AdminStore

from ..compaction import Compactor
from ..dialects import message_path, parse_model_request
from ..dialects.responses import DIALECT as RESPONSES
from ..dialects.responses import items as responses_items
from ..dialects.responses import translate
from ..dialects.responses.compaction import compaction_item
from ..dialects.responses.outbound import to_items
from ..errors import (
    ConversationBusy,
    ConversationNotFound,
    InvalidRequest,
    NodeNotFound,
    UpstreamFailure,
)
from ..http import RawResponse
from .common import RequestHeaders, decoded_body, resolve_conversation_id
from .context import CallContext
from .conversations import items_node, new_conversation_id
from .docs import errors
from .path_items import kept_items, resolve_compactions, with_parts
from .response_objects import stored_response
from .responses import named_conversation, resolve_references

__all__ = ["responses_compact"]

_encode = msgspec.json.Encoder().encode


@route(["/v1/responses/compact", "/c/{conversation_id:str}/v1/responses/compact", "/auto/v1/responses/compact"],
       http_method=["POST"],
       summary="Compact a conversation, a stored response's path or the given input now", tags=["responses"],
       status_code=200, responses=errors(400, 401, 404, 409, 502))
async def responses_compact(request: Request[Any, Any, Any], call: NamedDependency[CallContext],
                            compactor: NamedDependency[Compactor]) -> ASGIApp:
    caller, admin = call.caller, call.admin
    headers = RequestHeaders(request.scope)
    cid = resolve_conversation_id(request.path_params.get("conversation_id"), headers.get("x-conversation-id"))
    raw = await request.body()
    body = parse_model_request(await decoded_body(request, raw))
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("model is required", param="model")
    previous = body.get("previous_response_id")
    if "conversation" in body:
        cid = await named_conversation(body["conversation"], cid, previous, admin, caller)
    if body.get("input") is not None and (previous is not None or cid is not None):
        # (one of the three: the input would have to be stored under the response or in the
        # conversation before the summary -- and stay there, added again by each retry, when the
        # compaction then fails; dropped, a client replacing its window with the answer loses it)
        raise InvalidRequest("input cannot be compacted together with "
                             f"{'previous_response_id' if previous is not None else 'a conversation'}: add it to the "
                             "conversation (or continue the response with it) first, or compact the input alone",
                             param="input")
    if previous is not None:
        node = await stored_response(admin, caller, previous)
        if node is None:
            raise NodeNotFound(f"no stored response {previous!r}", param="previous_response_id")
        path = message_path(await admin.path_rows(node.tree_id, node.id))
        tree_id = node.tree_id

        async def compact(keep_recent: int | None) -> Any:
            # (no lease held: the head moves to the summary if it is still on the response)
            return await compactor.summaries.compact(tenant=caller.tenant, conversation_id=node.conversation_id,
                                                     tree_id=node.tree_id, path=path, model=model,
                                                     client_key=caller.client_key, mode="full", trigger="admin",
                                                     keep_recent=keep_recent)
        source: list[Any] = path
    else:
        if cid is None:  # the input alone: it becomes a conversation of its own, then compacted
            if body.get("input") is None:
                raise InvalidRequest("input, previous_response_id or conversation is required", param="input")
            # (its instructions, a system message, first)
            items = await resolve_references(RESPONSES.items(RESPONSES.parse(raw)), admin, caller)
            # (a window that holds a compaction item -- OpenAI's stateless loop compacting again -- reads as its summary)
            items = await resolve_compactions(items, admin, caller.tenant, param="input")
            cid = new_conversation_id()
            await admin.add_items(caller.tenant, cid, [items_node(items)], create=True, metadata={})
        conv = await admin.conversation(caller.tenant, cid)
        if conv is None:
            raise ConversationNotFound(f"conversation {cid!r} not found", param="conversation")

        async def compact(keep_recent: int | None) -> Any:
            return await compactor.compact_now(conv, caller.client_key, default_model=model, keep_recent=keep_recent)
        source = [] if conv.head_node_id is None else message_path(await admin.path_rows(conv.tree_id, conv.head_node_id))
        tree_id = conv.tree_id
    result = await compact(None)
    if result.reason == "nothing_to_compact" and not (len(source) == 1 and source[0].kind == "compaction"):
        # asked to compact now, with too few messages to keep the usual recent ones raw: all of
        # them are summarised, and the summary alone stays (a path that is one compaction and
        # nothing since is answered with that compaction as it is, below)
        result = await compact(0)
    if result.compacted and result.node is not None:
        node = result.node
        output = await _compacted_output(admin, tree_id, node)
        usage = translate.usage_of(node.usage) if node.usage and "prompt_tokens" in node.usage else node.usage
        rid = responses_items.response_id(node.id)
    elif result.reason == "nothing_to_compact" and source and source[0].kind == "compaction":
        output = await _compacted_output(admin, tree_id, source[0])
        usage = {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}
        rid = responses_items.response_id(source[0].id)
    elif result.reason in ("empty", "nothing_to_compact", "head_failed"):
        # nothing to summarise, or a head on a failed call (its items its retry's): the context as it is
        output = [with_parts(item) for n in source for item in to_items([*n.sent, *(n.received or [])])]
        usage = {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}
        rid = responses_items.response_id(source[-1].id) if source else "resp_" + "0" * 32
    elif result.reason in ("moved", "busy"):
        raise ConversationBusy("the conversation moved while compacting; retry")
    else:
        raise UpstreamFailure(f"the summary could not be made ({result.reason}); nothing was compacted")
    return RawResponse(200, _encode({"id": rid, "object": "response.compaction", "created_at": int(time.time()),
                                     "output": output, "usage": usage}))


async def _compacted_output(admin: AdminStore, tree_id: uuid.UUID, node: Any) -> list[dict[str, Any]]:
    """A compaction node as ``/responses/compact`` answers it: its compaction item, then the items
    it kept raw as the conversation's items list has them (typed, with the same ids)."""
    return [compaction_item(node), *await kept_items(admin, tree_id, node)]
