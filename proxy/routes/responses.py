"""The Responses API on the tree (docs/behaviour.md#the-responses-api): ``POST /v1/responses``
(also under ``/c/{id}/v1`` and ``/auto/v1``) and ``POST /v1/responses/compact``. The stored
responses themselves -- ``GET``/``DELETE /v1/responses/{id}``, its input items -- are
``proxy.routes.response_objects``'.

A call is stored when it names a conversation (header, path prefix or ``/auto/v1``) or carries the
``previous_response_id`` of a stored response of the caller's tenant; otherwise it passes through.
HTTP only: the call itself is the lifecycle's, like a chat call.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import msgspec
from litestar import Request, route
from litestar.di import NamedDependency
from litestar.types import ASGIApp

from storage import AdminStore, NodeRow, TreeStore, transcript

from ..auth import Caller
from ..call import Call, items_after
from ..compaction import Compactor
from ..dialects import message_path, parse_model_request
from ..dialects.responses import DIALECT as RESPONSES
from ..dialects.responses import items as responses_items
from ..dialects.responses import translate
from ..dialects.responses.compaction import compaction_item, compaction_node_of, is_compaction_item
from ..errors import (
    ConversationBusy,
    ConversationNotFound,
    InvalidConversationId,
    InvalidRequest,
    NodeNotFound,
    NotFound,
    UpstreamFailure,
)
from ..http import RawResponse
from ..ids import valid_conversation_id
from ..lifecycle import CallLifecycle
from .common import RequestHeaders, context_mode, node_kind, parent_of, resolve_conversation_id
from .context import CallContext
from .conversations import items_node, new_conversation_id
from .docs import errors
from .passthrough import Forwarder
from .path_items import kept_items, node_items, resolve_compactions, with_parts
from .response_objects import response_of, stored_response

__all__ = ["responses_compact", "responses_create"]

_encode = msgspec.json.Encoder().encode


def _node_of_item(item_id: Any) -> uuid.UUID | None:
    """The node an output item id of ours names (``msg_``/``fc_``/``rs_`` + the node's hex ...)."""
    if not isinstance(item_id, str) or "_" not in item_id:
        return None
    rest = item_id.split("_", 1)[1][:32]
    try:
        return uuid.UUID(hex=rest) if len(rest) == 32 else None
    except ValueError:
        return None


async def _resolve_references(items: list[dict[str, Any]], admin: AdminStore, caller: Caller) -> list[dict[str, Any]]:
    """Input items that reference stored output items (``item_reference``, as clients send when
    they take ``store: true`` at its word) replaced by the items themselves -- the proxy stores
    them, so it resolves them."""
    if not any(i.get("type") == "item_reference" for i in items):
        return items
    found: dict[str, dict[str, Any]] = {}
    for node_id in {_node_of_item(i.get("id")) for i in items if i.get("type") == "item_reference"} - {None}:
        node = await admin.node(caller.tenant, node_id)
        if node is None:
            continue
        if node.api == "responses":
            for item in [*(node.received or []), *node.sent]:
                if isinstance(item, dict) and isinstance(item.get("id"), str):
                    found.setdefault(item["id"], item)
        # the Conversations API's ids -- given, or made from the node and the place (a chat node's
        # items too, read as Responses items: GET /v1/responses/{id} names them so) -- and what a
        # list names an item whose own id an earlier one had
        for item in node_items(node):
            found.setdefault(item.listed["id"], item.raw)
            found.setdefault(item.own, item.raw)
    out = []
    for item in items:
        if item.get("type") == "item_reference":
            if item.get("id") not in found:
                raise NotFound(f"no stored item {item.get('id')!r}", code="item_not_found", param="input")
            item = found[item["id"]]
        out.append(item)
    return out


async def _named_conversation(value: Any, cid: str | None, previous: Any, admin: AdminStore, caller: Caller) -> str | None:
    """The conversation a call's ``conversation`` field names (an id, or ``{"id": ...}``): one of
    the caller's conversations -- a ``conv_`` one the Conversations API made, or any other."""
    if value is None:
        return cid
    if previous is not None:
        raise InvalidRequest("conversation and previous_response_id cannot be used together", param="conversation")
    named = value.get("id") if isinstance(value, dict) else value
    if not isinstance(named, str):
        raise InvalidRequest("conversation must be a conversation id or an object with its id", param="conversation")
    valid_conversation_id(named, source="conversation")
    if cid is not None and cid != named:
        raise InvalidConversationId("the conversation of the body and of the path or X-Conversation-Id disagree",
                                    param="conversation")
    if await admin.conversation_metadata(caller.tenant, named) is None:
        raise ConversationNotFound(f"conversation {named!r} not found", param="conversation")
    return named


def _holds_compaction(body: dict[str, Any]) -> bool:
    """Does the input hold a compaction item of ours (a stateless client continuing from one)?"""
    value = body.get("input")
    return isinstance(value, list) and any(is_compaction_item(i) and compaction_node_of(i) for i in value)


def _compaction_controls(body: dict[str, Any]) -> tuple[int | None, bool, bool]:
    """(the call's own compaction threshold, truncation "auto", whether it asked for either) --
    OpenAI's compaction controls, read and checked; the proxy applies them (never the upstream)."""
    threshold, asked = None, False
    management = body.get("context_management")
    if management is not None:
        if not isinstance(management, list):
            raise InvalidRequest("context_management must be an array", param="context_management")
        for i, entry in enumerate(management):
            if not isinstance(entry, dict) or entry.get("type") != "compaction":
                raise InvalidRequest("context_management entries are {\"type\": \"compaction\", ...}",
                                     param=f"context_management[{i}]")
            asked = True
            value = entry.get("compact_threshold")
            if value is not None:
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise InvalidRequest("compact_threshold must be a positive number of tokens",
                                         param=f"context_management[{i}].compact_threshold")
                threshold = value
    truncation = body.get("truncation")
    if truncation not in (None, "auto", "disabled"):
        raise InvalidRequest("truncation must be 'auto' or 'disabled'", param="truncation")
    return threshold, truncation == "auto", asked or truncation == "auto"


def _messages_digests(items: list[dict[str, Any]]) -> tuple[list[bytes], list[int] | None]:
    transcript_ = RESPONSES.read(items)
    return transcript.digests(transcript_.messages), transcript_.ordinals


async def _resume_compaction(items: list[dict[str, Any]], admin: AdminStore, tree: TreeStore, caller: Caller,
                             cid: str | None) -> tuple[list[dict[str, Any]], uuid.UUID, str] | None:
    """A stateless client's input holding a compaction item of ours: the node to continue from
    and the items that are new after it -- or None when the input holds none. The item stands for
    everything before it: the compaction node (its summary and kept items), and the call that was
    compacted under it when the items that follow begin with that call's answer (by its items' ids,
    or by content: a client may send them back without ids). What the client resends after that
    is matched on the tree from there, as a full history is from the root: the deepest node it
    already holds is the parent, and only what follows is new -- every later turn of a client
    that keeps resending its window continues the same line. Returns the new items, the parent
    and its conversation (the one named, ``cid``, or the compaction's)."""
    at = max((i for i, item in enumerate(items) if is_compaction_item(item)), default=None)
    if at is None:
        return None
    named = compaction_node_of(items[at])
    node = await admin.node(caller.tenant, named[0]) if named else None
    if node is None or node.kind != "compaction":  # not ours, another tenant's, or gone
        raise NodeNotFound("the compaction item names no compaction of this tenant", param="input")
    rest = [item for item in items[at + 1:] if not is_compaction_item(item)]
    anchor: NodeRow = node
    call = await admin.node(caller.tenant, named[1]) if named and named[1] else None
    if call is not None and call.parent_id == node.id and call.status == "success" and not call.response_deleted:
        answer = response_of(call)["output"]
        if answer and [i.get("id") for i in rest[:len(answer)]] == [i.get("id") for i in answer]:
            rest, anchor = rest[len(answer):], call
        else:
            answered = _messages_digests(answer)[0]
            digests, ordinals = _messages_digests(rest)
            if answered and digests[:len(answered)] == answered:
                rest, anchor = items_after(rest, ordinals, len(answered), with_system=True), call
    if anchor is node:
        # the compaction's kept items, when the client sends them back (as /v1/responses/compact gave them)
        kept = [m for m in node.sent if not (isinstance(m, dict) and m.get("role") in ("system", "developer"))][1:]
        kept_digests = transcript.digests(kept)
        digests, ordinals = _messages_digests(rest)
        same = 0
        while same < min(len(kept_digests), len(digests)) and kept_digests[same] == digests[same]:
            same += 1
        if same:
            rest = items_after(rest, ordinals, same, with_system=True)
    digests, ordinals = _messages_digests(rest)
    conversation = cid or anchor.conversation_id
    # (the last message is the call's own: never matched, so a retry of a failed turn hangs beside it)
    found = await tree.resumed_node(caller.tenant, anchor.tree_id, anchor.id, conversation, digests[:-1])
    if found is not None:
        node_id, k = found  # (a node the conversation sees: maybe its source's)
        return items_after(rest, ordinals, k, with_system=True), node_id, conversation
    return rest, anchor.id, conversation


async def _create(request: Request[Any, Any, Any], calls: CallLifecycle, forwarder: Forwarder, caller: Caller,
                  admin: AdminStore, path_cid: str | None, *, auto: bool = False) -> ASGIApp:
    headers = RequestHeaders(request.scope)
    cid = resolve_conversation_id(path_cid, headers.get("x-conversation-id"))
    raw = await request.body()
    body = RESPONSES.parse(raw)
    previous = body.get("previous_response_id")
    named = body.get("conversation") is not None
    if "conversation" in body:  # OpenAI's conversation state: the call belongs to it, as under /c/{id}/v1
        cid = await _named_conversation(body.pop("conversation"), cid, previous, admin, caller)
        if named:
            body["conversation"] = cid  # (kept with the call, never sent: its response names it, as OpenAI's)
    ours = responses_items.node_id_of(previous) is not None  # our ids name nodes; an upstream's do not
    parent = await stored_response(admin, caller, previous) if ours else None
    # (to any upstream: an OpenAI one configured as api = "chat" serves the Responses API too)
    if cid is None and not auto and not ours and not _holds_compaction(body):
        return await forwarder.forward(request, "responses", raw, headers, caller)
    if previous and parent is None:  # another tenant's, deleted, or an upstream's in a stored call
        raise NodeNotFound(f"no stored response {previous!r}", param="previous_response_id")

    kind = node_kind(headers)
    given = bool((headers.get("x-parent-node-id") or "").strip())
    if given and parent is not None:
        raise InvalidRequest("give the parent once: previous_response_id or X-Parent-Node-Id", param="X-Parent-Node-Id")
    if parent is not None:  # the parent decides; the conversation is the named one, or the parent's
        mode, parent_mode, parent_id = "delta", "node", parent.id
        cid = cid or parent.conversation_id
    else:
        # (conversation=: its input holds the new items, whatever the path or the headers say)
        mode = "delta" if named else "full" if auto else context_mode(headers, calls.default_mode)
        # X-Parent-Node-Id as for chat (a node, or root: an edit of the first question); refused in full history
        parent_mode, parent_id = parent_of(headers, mode)
    items = await _resolve_references(RESPONSES.items(body), admin, caller)
    resumed_call = False
    if parent is None and not named and not given:
        resumed = await _resume_compaction(items, admin, calls.tree, caller, cid)
        if resumed is not None:  # a stateless client continuing from a compaction item of ours
            items, parent_id, cid = resumed
            resumed_call = True
            mode, parent_mode = "delta", "node"
    if named:  # (conversation=: the input's items are added to it -- a compaction item too, read as its summary)
        items = await resolve_compactions(items, admin, caller.tenant, param="input")
    else:
        items = [item for item in items if not is_compaction_item(item)]  # (what they stand for is the parent's path)
    threshold, truncation_auto, controls = _compaction_controls(body)
    call = Call(
        tenant=caller.tenant, conversation_id=cid, kind=kind, mode=mode, parent_mode=parent_mode, parent_id=parent_id,
        body=body, items=items, stream=body.get("stream") is True, client_key=caller.client_key,
        headers=headers.items, dialect=RESPONSES, credentials=headers.credentials(),
        compact_threshold=threshold, truncation_auto=truncation_auto, compaction_controls=controls,
        new_items=resumed_call or named,  # (conversation=: its input holds the new items, never a history)
    )
    return await calls.run(call, request.receive)


_ERRORS = errors(400, 401, 404, 409, 413, 502, 503, 504)


@route(["/v1/responses", "/c/{conversation_id:str}/v1/responses", "/auto/v1/responses"], http_method=["POST"],
       summary="Create a response (stored when it names a conversation or continues a stored response)",
       tags=["responses"], status_code=200, responses=_ERRORS)
async def responses_create(request: Request[Any, Any, Any], call: NamedDependency[CallContext]) -> ASGIApp:
    path_cid = request.path_params.get("conversation_id")
    return await _create(request, call.calls, call.forwarder, call.caller, call.admin, path_cid,
                         auto=request.scope["path"].startswith("/auto/"))


@route(["/v1/responses/compact", "/c/{conversation_id:str}/v1/responses/compact"], http_method=["POST"],
       summary="Compact a conversation, a stored response's path or the given input now", tags=["responses"],
       status_code=200, responses=errors(400, 401, 404, 409, 502))
async def responses_compact(request: Request[Any, Any, Any], call: NamedDependency[CallContext],
                            compactor: NamedDependency[Compactor]) -> ASGIApp:
    caller, admin = call.caller, call.admin
    headers = RequestHeaders(request.scope)
    cid = resolve_conversation_id(request.path_params.get("conversation_id"), headers.get("x-conversation-id"))
    raw = await request.body()
    body = parse_model_request(raw)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("model is required", param="model")
    previous = body.get("previous_response_id")
    if "conversation" in body:
        cid = await _named_conversation(body["conversation"], cid, previous, admin, caller)
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
            items = await _resolve_references(RESPONSES.items(RESPONSES.parse(raw)), admin, caller)
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
    elif result.reason in ("empty", "nothing_to_compact"):  # nothing to summarise: the context as it is
        output = [with_parts(item) for n in source for item in responses_items.to_items([*n.sent, *(n.received or [])])]
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
