"""The Responses API on the tree (docs/behaviour.md#the-responses-api): ``POST /v1/responses``
(also under ``/c/{id}/v1`` and ``/auto/v1``). The stored
responses themselves -- ``GET``/``DELETE /v1/responses/{id}``, its input items -- are
``proxy.routes.response_objects``', and compaction ``proxy.routes.responses_compact``'.

A call is stored when it names a conversation (header, path prefix or ``/auto/v1``) or carries the
``previous_response_id`` of a stored response of the caller's tenant; otherwise it passes through
(translated, unstored, for an Anthropic upstream, which has no Responses endpoint). HTTP only: the
call itself is the lifecycle's, like a chat call.
"""

from __future__ import annotations

import uuid
from typing import Any

import msgspec
from litestar import Request, route
from litestar.di import NamedDependency
from litestar.types import ASGIApp

from storage import AdminStore, NodeRow, TreeStore, transcript

from ..auth import Caller
from ..call import Call, items_after
from ..dialects import signed
from ..dialects.responses import DIALECT as RESPONSES
from ..dialects.responses import items as responses_items
from ..dialects.responses.compaction import compaction_node_of, is_compaction_item
from ..errors import (
    ConversationNotFound,
    InvalidConversationId,
    InvalidRequest,
    NodeNotFound,
    NotFound,
)
from ..ids import valid_conversation_id
from ..lifecycle import CallLifecycle
from ..surrogates import encode
from .common import RequestHeaders, context_mode, decoded_body, node_kind, parent_of, resolve_conversation_id
from .context import CallContext
from .docs import errors
from .passthrough import Forwarder
from .path_items import live_node, node_items, path_items, resolve_compactions
from .response_objects import response_of, stored_response

__all__ = ["named_conversation", "resolve_references", "responses_create"]

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


async def resolve_references(items: list[dict[str, Any]], admin: AdminStore, caller: Caller,
                             cid: str | None = None) -> list[dict[str, Any]]:
    """Input items that reference stored items (``item_reference``, as clients send when they take
    ``store: true`` at its word) replaced by the items themselves -- the proxy stores them, so it
    resolves them. An id is found as the API shows it, and only so:

    - a response's item (its id names the call's node): while the response is there -- a withdrawn
      response's items are not found, as the response itself is not;
    - an item added to a conversation (Conversations API): while its conversation lists it -- a
      deleted item is not found, though its node stays as a branch;
    - an id the client gave an item (it names no node): among the items of ``cid``, the
      conversation the call continues.

    What was deleted is not sent upstream again."""
    references = [i for i in items if i.get("type") == "item_reference"]
    if not references:
        return items
    wanted = {i["id"] for i in references if isinstance(i.get("id"), str)}
    found: dict[str, dict[str, Any]] = {}
    listings: dict[str, dict[str, dict[str, Any]]] = {}

    async def listed(conversation: str) -> dict[str, dict[str, Any]]:
        """The items a conversation lists now (its head path's), by id."""
        if conversation not in listings:
            try:
                _, on_path, _ = await path_items(admin, caller.tenant, conversation)
            except ConversationNotFound:
                on_path = []
            # (a withdrawn response's items stay on the path as context, never found by a reference)
            listings[conversation] = {i.listed["id"]: i.raw for i in on_path
                                      if not i.hidden and not i.node.response_deleted}
        return listings[conversation]

    for node_id in {_node_of_item(i) for i in wanted} - {None}:
        node = await live_node(admin, caller.tenant, node_id)
        if node is None:
            continue
        if node.kind == "items":  # not a response's: found while its conversation lists it
            shown = await listed(node.conversation_id)
            found.update({k: shown[k] for k in wanted if k in shown and k not in found})
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
    if cid is not None and wanted - found.keys():  # (ids the client gave, or ours it copied into its own)
        shown = await listed(cid)
        found.update({k: shown[k] for k in wanted - found.keys() if k in shown})
    out = []
    for item in items:
        if item.get("type") == "item_reference":
            if not isinstance(item.get("id"), str) or item["id"] not in found:
                raise NotFound(f"no stored item {item.get('id')!r}", code="item_not_found", param="input")
            item = found[item["id"]]
        out.append(item)
    return out


async def named_conversation(value: Any, cid: str | None, previous: Any, admin: AdminStore, caller: Caller) -> str | None:
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
    node = await live_node(admin, caller.tenant, named[0]) if named else None
    if node is None or node.kind != "compaction":  # not ours, another tenant's, gone or withdrawn
        raise NodeNotFound("the compaction item names no compaction of this tenant", param="input")
    rest = [item for item in items[at + 1:] if not is_compaction_item(item)]
    anchor: NodeRow = node
    call = await live_node(admin, caller.tenant, named[1]) if named and named[1] else None
    if call is not None and call.parent_id == node.id and call.status == "success":
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
    decoded = await decoded_body(request, raw)
    body = RESPONSES.parse(decoded)
    previous = body.get("previous_response_id")
    named = body.get("conversation") is not None
    if "conversation" in body:  # OpenAI's conversation state: the call belongs to it, as under /c/{id}/v1
        cid = await named_conversation(body.pop("conversation"), cid, previous, admin, caller)
        if named:
            body["conversation"] = cid  # (kept with the call, never sent: its response names it, as OpenAI's)
    ours = responses_items.node_id_of(previous) is not None  # our ids name nodes; an upstream's do not
    parent = await stored_response(admin, caller, previous) if ours else None
    if cid is None and not auto and not ours and not _holds_compaction(body):
        upstream = forwarder.route(decoded)
        # (passed through to an OpenAI-compatible upstream: one configured as api = "chat" serves the
        # Responses API too; an Anthropic upstream has no endpoint for it -- translated, nothing stored)
        if upstream.api != "anthropic":
            if b"bp-signed:" in decoded and signed.without_ours(body):  # (our pieces: no upstream's to take)
                decoded = encode(body)
            return await forwarder.forward(request, "responses", raw, headers, caller, upstream=upstream,
                                           decoded=decoded)
        if previous:  # (an upstream's response, which this upstream cannot continue)
            raise NodeNotFound(f"no stored response {previous!r}", param="previous_response_id")
        body = {**body, "store": False}  # (its answer says so: nothing to retrieve or continue later)
        call = Call(tenant=caller.tenant, conversation_id=None, kind="turn", mode="delta", parent_mode="head",
                    parent_id=None, body=body, items=await resolve_references(RESPONSES.items(body), admin, caller),
                    stream=body.get("stream") is True, client_key=caller.client_key, headers=headers.items,
                    dialect=RESPONSES, credentials=headers.credentials(), store=False)
        return await calls.run(call, request.receive)
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
    items = await resolve_references(RESPONSES.items(body), admin, caller, cid)
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
