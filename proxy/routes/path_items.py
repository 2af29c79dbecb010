"""The items of a conversation's head path, as OpenAI's Conversations API lists them
(docs/behaviour.md#the-conversations-api): what each path node contributes (a Responses call's
instructions aside, answers read as output items), with stable ids -- the ones given, or made from
the node and the place; through summaries, the ids the items had before them -- and no id twice.
Read by the Conversations routes and by the Responses API's input items and references."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import msgspec

from storage import AdminStore, NodeRow

from ..compaction.clearing import METHOD as CLEARING
from ..dialects import message_path
from ..dialects.responses import translate
from ..dialects.responses.compaction import compaction_item, compaction_node_of, is_compaction_item
from ..dialects.responses.items import ITEMS, items_of
from ..dialects.responses.outbound import to_items
from ..dialects.signed import our_block
from ..errors import ConversationNotFound, NodeNotFound

__all__ = ["ITEM_IDS", "Item", "answer_items", "has_instructions", "input_items", "kept_items", "listed_item", "node_items", "path_items",
           "resolve_compactions", "with_parts"]

_encode_key = msgspec.json.Encoder(order="sorted").encode  # (a signature as a dict key, whatever its parts hold)

ITEM_IDS = "_bp_item_ids"  # an items node's params: the ids of its items, in order


@dataclass(slots=True)
class Item:
    """One item on a head path: as stored (``raw``, what assembly reads) and as listed (``listed``,
    with its id), and the path node that holds it."""

    raw: dict[str, Any]
    listed: dict[str, Any]
    node: NodeRow
    own: str  # the id made from its node and place: what it is listed as when its id is taken (``_unique``)
    hidden: bool = False  # context, not an item: a Responses call's instructions a summary carried (``_carry_system``)


def with_parts(item: dict[str, Any]) -> dict[str, Any]:
    """A message item as OpenAI's lists carry it: its text in content parts."""
    if item.get("type") == "message" and isinstance(item.get("content"), str):
        part = "output_text" if item.get("role") == "assistant" else "input_text"
        return {**item, "content": [{"type": part, "text": item["content"]}]}
    return item


# the items a list shows as completed (a message, the calls a client answers and their results)
_FINISHED = frozenset({"message", "function_call", "function_call_output", "custom_tool_call", "custom_tool_call_output",
                       "tool_search_call", "tool_search_output"})


def listed_item(item: dict[str, Any], item_id: str) -> dict[str, Any]:
    kind = item.get("type") or ("message" if "role" in item else "item")
    out = with_parts({**item, "type": kind, "id": item_id})
    if kind in _FINISHED:  # (OpenAI's lists say so)
        out.setdefault("status", "completed")
    return out


def has_instructions(node: NodeRow) -> bool:
    """Does the node's ``sent`` begin with a Responses call's instructions (no item of its own)?
    Not every such call stores them: in full-history mode the system message is stored only when
    it changed, and the call's first item is then its own."""
    instructions = node.params.get("instructions")
    if node.api != "responses" or not isinstance(instructions, str) or not instructions or not node.sent:
        return False
    first = node.sent[0]
    return isinstance(first, dict) and first.get("role") == "system" and first.get("content") == instructions


def _signed(message: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic answer's chat message with its signed thinking as ``thinking_blocks`` (a
    chat node's has them already; a Messages node's are in its blocks): its items then keep them
    (``translate.kept_item``) -- a copy made from the items (a deleted item's) sends Claude its
    thinking back signed."""
    if items_of(message) != "messages" or message.get("thinking_blocks"):
        return message
    signed = [b for fragment in message.get(ITEMS) or () if isinstance(fragment, dict)
              for b in (fragment.get("content") if isinstance(fragment.get("content"), list) else ())
              if isinstance(b, dict) and not our_block(b)  # (ours: no upstream's to take back)
              and ((b.get("type") == "thinking" and b.get("signature")) or b.get("type") == "redacted_thinking")]
    return {**message, "thinking_blocks": signed} if signed else message


def answer_items(node: NodeRow) -> list[dict[str, Any]]:
    """What a node received, as Responses output items: a Responses call's as stored; another
    API's answer (a chat or a Messages call's) translated -- the same items whether the
    conversation's items list or the node read as a response shows them."""
    if node.api == "responses":
        return list(node.received or [])
    return _translated(node, message_path([node])[0].received)


def _translated(node: NodeRow, received: list[Any] | None) -> list[dict[str, Any]]:
    """A chat or Messages node's answer (its messages as assembly reads them) as output items."""
    out: list[dict[str, Any]] = []
    for message in received or ():
        if isinstance(message, dict) and message.get("role") == "assistant":
            out.extend(translate.output_items(_signed(message), node.id, node.params.get("tools"), node.provider))
    return out


def node_items(node: NodeRow, *, answers: bool = True) -> list[Item]:
    """The items one path node contributes to its conversation: what it sent (a Responses call's
    instructions aside), then -- when it succeeded, and ``answers`` are asked for -- what it
    received. A response's input items are the first part (``response_objects``)."""
    with_received = answers and node.status == "success"
    if node.api == "responses":
        sent = list(node.sent[1:] if has_instructions(node) else node.sent)
        received = list(node.received or []) if with_received else []
    else:  # (its messages read once, for both halves)
        chat = message_path([node])[0]
        sent = to_items(chat.sent)
        received = _translated(node, chat.received) if with_received else []
    given = node.params.get(ITEM_IDS) if node.kind == "items" else None
    out = []
    for i, item in enumerate(sent):
        if not isinstance(item, dict):
            continue
        item_id = given[i] if isinstance(given, list) and i < len(given) and isinstance(given[i], str) else None
        if item_id is None:
            item_id = item.get("id") if isinstance(item.get("id"), str) else None
        kind = item.get("type") or ("message" if "role" in item else "item")
        own = translate.input_item_id(kind, node.id, i)
        out.append(Item(item, listed_item(item, item_id or own), node, own))
    if node.kind == "compaction" and (getattr(node, "params", None) or {}).get("method", "summary") != CLEARING:
        # a summary is listed as the compaction item a client can send back (and /responses/compact gives)
        at = next((k for k, it in enumerate(out) if it.listed.get("role") not in ("system", "developer")), None)
        if at is not None:
            out[at] = Item(out[at].raw, compaction_item(node), node, out[at].own)
    for i, item in enumerate(received):
        if isinstance(item, dict):
            kind = item.get("type") or "item"
            own = f"{translate.item_id_prefix(kind)}_{node.id.hex}_r{i}"
            out.append(Item(item, listed_item(item, item.get("id") if isinstance(item.get("id"), str) else own), node, own))
    return out


async def _head_path(admin: AdminStore, conv: Any) -> list[NodeRow]:
    """The head path whose items a conversation holds (``_path_to`` its head)."""
    return [] if conv.head_node_id is None else await _path_to(admin, conv.tree_id, conv.head_node_id)


async def _path_to(admin: AdminStore, tree_id: uuid.UUID, node_id: uuid.UUID) -> list[NodeRow]:
    """The path to a node whose items the conversation lists, read through the clearings of old
    tool results on it (context editing: a request's edit, not the conversation's): its items, and
    their ids, are what they were before any clearing."""
    # (the plain path: what the items are made of -- no sibling counts, which a deep path pays for)
    return await _through_clearings(admin, tree_id, await admin.path_rows(tree_id, node_id))


async def _through_clearings(admin: AdminStore, tree_id: uuid.UUID, path: list[NodeRow]) -> list[NodeRow]:
    while path and path[0].kind == "compaction" and path[0].compacted_from is not None \
            and path[0].params.get("method") == CLEARING:
        path = await admin.path_rows(tree_id, path[0].compacted_from) + path[1:]
    return path


_SUMMARIES_READ = 8  # summaries read through for the ids of the items they kept (older ones keep the node's)


async def _items_of(admin: AdminStore, tree_id: uuid.UUID, path: list[NodeRow], depth: int = 0) -> list[Item]:
    """The items of a head path (as ``_head_path`` reads it), with stable ids: the items a summary
    kept raw have the ids they had before it (read from the path it replaced), not ids of the
    summary's node."""
    items = [item for node in path for item in node_items(node)]
    first = path[0] if path else None
    if first is not None and first.kind == "compaction" and first.compacted_from is not None and depth < _SUMMARIES_READ:
        before = await _through_clearings(admin, tree_id, await admin.path_rows(tree_id, first.compacted_from))
        earlier = await _items_of(admin, tree_id, before, depth + 1)
        compacted = [i for i in items if i.node.id == first.id]
        _carry_ids(compacted, earlier)
        _carry_system(compacted, earlier)
    return _unique(items)


def _unique(items: list[Item]) -> list[Item]:
    """No two items of a path share an id: an item whose id an earlier one has (a client added an
    item with an id that was taken, or sent an answer back with its id) is listed under its own
    (made from its node and place), so each id names one item -- to read, and to delete."""
    seen: set[str] = set()
    for item in items:
        if item.listed["id"] in seen:
            item.listed["id"] = item.own
        seen.add(item.listed["id"])
    return items


async def kept_items(admin: AdminStore, tree_id: uuid.UUID, node: Any) -> list[dict[str, Any]]:
    """The items a compaction node kept raw, listed as the conversation's items list has them --
    with the ids they had before it."""
    return [i.listed for i in _kept(await _items_of(admin, tree_id, [node]))]


def _kept(compacted: list[Item]) -> list[Item]:
    """A compaction node's items that it kept raw: those after its system messages and its summary."""
    return [i for i in compacted if i.listed.get("role") not in ("system", "developer")][1:]


def _carry_ids(compacted: list[Item], before: list[Item]) -> None:
    """Give the items a compaction node kept raw the ids of the same items before it, matched from
    the end, in order (a kept item found nowhere before -- added after the summarised path --
    keeps its own)."""
    said = [_signature(i.listed) for i in before]
    j = len(before) - 1
    for item in reversed(_kept(compacted)):
        sig = _signature(item.listed)
        p = j
        while p >= 0 and said[p] != sig:
            p -= 1
        if p >= 0:
            item.listed["id"] = before[p].listed["id"]
            j = p - 1


def _carry_system(compacted: list[Item], before: list[Item]) -> None:
    """Give the system/developer messages a summary carried the ids they had before it (the last
    one of the same text); one listed nowhere before -- a Responses call's instructions, which
    are context and never an item -- is hidden again (still the summary's context)."""
    said = {_encode_key(_signature(i.listed)): i.listed["id"] for i in before
            if i.listed.get("role") in ("system", "developer") and not i.hidden}
    for item in compacted:
        if item.listed.get("role") in ("system", "developer"):
            found = said.get(_encode_key(_signature(item.listed)))
            if found is None:
                item.hidden = True
            else:
                item.listed["id"] = found


def _signature(listed: dict[str, Any]) -> tuple[Any, ...]:
    """What an item says, whatever form it was listed in (parts or not, with or without status)."""
    content = listed.get("content")
    if isinstance(content, list):
        content = "".join(p.get("text") or "" for p in content if isinstance(p, dict))
    output = listed.get("output")
    if not (output is None or isinstance(output, str)):
        output = repr(output)
    return (listed.get("type"), listed.get("role"), content, listed.get("call_id"), listed.get("name"),
            listed.get("arguments"), output)


async def path_items(admin: AdminStore, tenant: str, cid: str) -> tuple[Any, list[Item], list[NodeRow]]:
    conv = await admin.conversation(tenant, cid)
    if conv is None:
        raise ConversationNotFound(f"conversation {cid!r} not found", param="conversation_id")
    path = await _head_path(admin, conv)
    return conv, await _items_of(admin, conv.tree_id, path), path


async def input_items(admin: AdminStore, node: NodeRow) -> list[Item]:
    """A stored call's input items: what its model was given -- the items of its path up to it, as
    its conversation's items list gives them (the same ids; a summary as its compaction item),
    then its own sent items (a Responses call's instructions aside), not its answer. OpenAI's
    lists them so: a chained response's input holds the earlier turns, a stateless one's the
    history it resent."""
    items = await _items_of(admin, node.tree_id, await _path_to(admin, node.tree_id, node.id))
    own = len(node_items(node, answers=False))
    listed = [*(i for i in items if i.node.id != node.id), *[i for i in items if i.node.id == node.id][:own]]
    return [i for i in listed if not i.hidden]  # (instructions a summary carried: context, never an item)


async def live_node(admin: AdminStore, tenant: str, node_id: uuid.UUID) -> NodeRow | None:
    """A node of the tenant as the Responses API finds it -- by its response id, an item's id or a
    compaction item's token alike: None when it is missing or withdrawn (its response deleted,
    its node kept as other calls' context)."""
    node = await admin.node(tenant, node_id)
    return None if node is None or node.response_deleted else node


async def resolve_compactions(items: list[dict[str, Any]], admin: AdminStore, tenant: str, *,
                              param: str) -> list[dict[str, Any]]:
    """Compaction items of ours a client puts among a conversation's items (or a stateless
    compaction's input), each as its compaction node gives it -- its summary the node's own -- so
    that they read as that summary (``dialects.responses.items.convert``); one that names no compaction of
    this tenant is 404, as everywhere a token is resolved. An upstream's own (OpenAI's, encrypted)
    stays as it came."""
    out = []
    for item in items:
        named = compaction_node_of(item) if is_compaction_item(item) else None
        if named is not None:
            node = await live_node(admin, tenant, named[0])
            if node is None or node.kind != "compaction":
                raise NodeNotFound("the compaction item names no compaction of this tenant", param=param)
            item = compaction_item(node, named[1])
        out.append(item)
    return out
