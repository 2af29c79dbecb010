"""Anthropic messages <-> chat messages: what lets a Messages call live on the same tree as chat
and Responses calls (docs/behaviour.md#the-messages-api). Pure functions.

A Messages request's items are its messages cut into **fragments**, one per chat message they read
as: a user message ``[tool_result A, tool_result B, text]`` is three fragments (two ``tool``
messages and a ``user`` one); the second and third carry ``CONT`` -- "the same Anthropic message as
the fragment before". A fragment is itself a valid Anthropic message (a role, content blocks), so
what a node stores reads as Messages; cutting them lets full-history matching end between a tool
result and the text after it without storing anything twice, and ``to_anthropic`` puts the
message back together exactly as the client sent it. The ``system`` field is a ``system`` item.

    fragment                                  chat message (``ITEMS``: [the fragment])
    system item                               system (text joined)
    user: tool_result                          tool (tool_use_id, content)
    user: text / image / document ...          user (text joined; other blocks as parts)
    assistant: text, tool_use, thinking ...    assistant (text joined, tool_calls, reasoning_content)

A ``system`` message among the messages (Claude Code sends one) is a system item marked ``INLINE``:
sent back in place when it follows other messages, else in the ``system`` field (where delta
mode's system rule -- system messages first -- always puts it; full-history calls keep the
client's order).

``cache_control`` and ``thinking`` / ``redacted_thinking`` blocks do not change the chat message
(so they take no part in matching); a ``thinking`` block goes back only to the provider that
produced it (``PRODUCER``), and ``cache_control`` markers are those of the call being made
(``markers`` / ``apply_markers``): a marker an earlier call put on an old block is not sent again.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from ..responses.items import ITEMS, PRODUCER

__all__ = [
    "CONT",
    "apply_markers",
    "cleared",
    "fragments",
    "markers",
    "to_anthropic",
    "to_messages",
]

CONT = "_bp_cont"  # this fragment continues the Anthropic message of the one before
INLINE = "_bp_inline"  # a system message among the messages (not the ``system`` field)
MARKERS = "_bp_cache_control"  # (in params) the call's cache_control markers, by position
_THINKING = frozenset({"thinking", "redacted_thinking"})

_encode = msgspec.json.Encoder().encode
_encode_sorted = msgspec.json.Encoder(order="sorted").encode
_decode = msgspec.json.Decoder().decode


def _blocks(content: Any) -> list[Any]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        return content
    return [] if content is None else [content]


# -- a request's messages -> fragments ------------------------------------------------------------


def fragments(system: Any, messages: Sequence[Any]) -> list[dict[str, Any]]:
    """A request's items: the system item (when ``system`` is given), then each message cut into
    the fragments it reads as (see the module docstring)."""
    out: list[dict[str, Any]] = []
    if system is not None and system != [] and system != "":
        out.append({"role": "system", "content": system})
    for message in messages:
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        content = message.get("content")
        if role == "system":
            out.append({**message, INLINE: True})
            continue
        if role != "user" or not isinstance(content, list) or not any(
                isinstance(b, dict) and b.get("type") == "tool_result" for b in content):
            out.append(message)  # one message, one fragment (as it came)
            continue
        extra = {k: v for k, v in message.items() if k not in ("role", "content")}
        groups: list[list[Any]] = []  # each tool result alone; the blocks between them together
        for block in content:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                groups.append([block])
                groups.append([])
            elif groups:
                groups[-1].append(block)
            else:
                groups.append([block])
        for i, group in enumerate(g for g in groups if g):
            out.append({"role": "user", "content": group, **extra, **({CONT: True} if i else {})})
    return out


# -- fragments -> chat messages -------------------------------------------------------------------


def _text(block: dict[str, Any]) -> str | None:
    text = block.get("text")
    return text if block.get("type") == "text" and isinstance(text, str) else None


def _image_part(block: dict[str, Any]) -> dict[str, Any]:
    source = block.get("source") if isinstance(block.get("source"), dict) else {}
    if source.get("type") == "base64":
        url = f"data:{source.get('media_type', '')};base64,{source.get('data', '')}"
    else:
        url = source.get("url") or source.get("file_id")
    return {"type": "image_url", "image_url": {"url": url}}


def _user_content(blocks: list[Any]) -> Any:
    """Chat content of user blocks: the text joined when there is only text, else parts."""
    parts: list[dict[str, Any]] = []
    only_text = True
    for block in blocks:
        if not isinstance(block, dict):
            continue
        text = _text(block)
        if text is not None:
            parts.append({"type": "text", "text": text})
        elif block.get("type") == "image":
            only_text = False
            parts.append(_image_part(block))
        else:  # documents, search results ...: as text a chat upstream can read
            only_text = False
            parts.append({"type": "text", "text": _as_text(block)})
    if only_text:
        return "".join(p["text"] for p in parts)
    return parts


def _as_text(block: dict[str, Any]) -> str:
    """A block chat has no part for, as text: a plain-text document's own text, a search result's
    texts, else a line saying what it was (its bytes stay in the fragment, for Anthropic)."""
    kind = block.get("type")
    source = block.get("source") if isinstance(block.get("source"), dict) else {}
    title = f" {block['title']}" if isinstance(block.get("title"), str) else ""
    if kind == "document" and source.get("type") == "text" and isinstance(source.get("data"), str):
        return f"[document{title}]\n{source['data']}"
    if kind == "search_result":
        texts = [b.get("text") for b in _blocks(block.get("content")) if isinstance(b, dict) and isinstance(b.get("text"), str)]
        return f"[search result{title}: {block.get('source', '')}]\n" + "\n".join(texts)
    media = source.get("media_type") or source.get("type") or ""
    return f"[{kind}{title}{f' ({media})' if media else ''}: not readable by this model]"


def _tool_content(content: Any) -> Any:
    if content is None or isinstance(content, str):
        return content or ""
    return _user_content(_blocks(content))


def _arguments(value: Any) -> str:
    return _encode(value if value is not None else {}).decode()


def _assistant(blocks: list[Any]) -> dict[str, Any]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    thinking: list[str] = []
    for block in blocks:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_use":
            calls.append({"id": block.get("id"), "type": "function",
                          "function": {"name": block.get("name"), "arguments": _arguments(block.get("input"))}})
        elif kind == "thinking" and isinstance(block.get("thinking"), str):
            thinking.append(block["thinking"])
        # redacted thinking, server tool uses and their results: kept in the fragment only
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        message["tool_calls"] = calls
    if thinking:
        message["reasoning_content"] = "".join(thinking)
    if message["content"] is None and not calls:
        message["content"] = ""
    return message


def to_message(fragment: dict[str, Any], producer: str | None = None) -> dict[str, Any]:
    """The chat message a fragment reads as, with the fragment kept under ``ITEMS``."""
    role = fragment.get("role")
    blocks = _blocks(fragment.get("content"))
    if role == "system":
        content = fragment.get("content")
        text = content if isinstance(content, str) else "\n".join(t for b in blocks if isinstance(b, dict)
                                                                   and (t := _text(b)) is not None)
        message: dict[str, Any] = {"role": "system", "content": text}
    elif role == "assistant":
        message = _assistant(blocks)
    elif len(blocks) == 1 and isinstance(blocks[0], dict) and blocks[0].get("type") == "tool_result":
        block = blocks[0]
        message = {"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": _tool_content(block.get("content"))}
    else:
        content = fragment.get("content")
        message = {"role": role or "user", "content": content if isinstance(content, str) else _user_content(blocks)}
    message[ITEMS] = [fragment]
    if producer is not None:
        message[PRODUCER] = producer
    return message


def to_messages(items: Iterable[Any], producer: str | None = None) -> list[dict[str, Any]]:
    return [to_message(item, producer) for item in items if isinstance(item, dict)]


def cleared(fragment: dict[str, Any], text: str) -> dict[str, Any] | None:
    """A fragment that is one ``tool_result`` block with that block's content replaced by ``text``
    (a cleared tool result, docs/behaviour.md#context-editing; ``is_error`` and the rest kept);
    None for any other fragment."""
    content = fragment.get("content")
    if fragment.get("role") == "user" and isinstance(content, list) and len(content) == 1 \
            and isinstance(content[0], dict) and content[0].get("type") == "tool_result":
        return {**fragment, "content": [{**content[0], "content": text}]}
    return None


# -- chat messages -> an Anthropic request's system and messages -----------------------------------


def _parts_to_blocks(content: Any) -> list[dict[str, Any]]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    blocks = []
    for part in content if isinstance(content, list) else [content]:
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        if kind in ("text", "input_text", "output_text"):
            blocks.append({"type": "text", "text": part.get("text", "")})
        elif kind == "image_url":
            url = (part.get("image_url") or {}).get("url") or ""
            if url.startswith("data:") and ";base64," in url:
                media, data = url[5:].split(";base64,", 1)
                blocks.append({"type": "image", "source": {"type": "base64", "media_type": media, "data": data}})
            else:
                blocks.append({"type": "image", "source": {"type": "url", "url": url}})
        elif kind in ("image", "document", "search_result"):
            blocks.append(part)
        # (audio, files by id ...: nothing Anthropic reads)
    return blocks


def _input(arguments: Any) -> Any:
    if isinstance(arguments, dict):
        return arguments
    try:
        value = _decode(arguments) if isinstance(arguments, str | bytes) and arguments else {}
    except (msgspec.DecodeError, RecursionError):
        return {"arguments": arguments}  # (not JSON: kept, as a field)
    return value if isinstance(value, dict) else {"value": value}


def _from_chat(message: dict[str, Any], provider: str | None) -> tuple[str, list[dict[str, Any]]]:
    role = message.get("role")
    if role == "tool":
        content = message.get("content")
        block: dict[str, Any] = {"type": "tool_result", "tool_use_id": message.get("tool_call_id")}
        block["content"] = content if isinstance(content, str) else _parts_to_blocks(content)
        return "user", [block]
    if role == "assistant":
        blocks: list[dict[str, Any]] = []
        # a chat node's signed thinking: assembly kept it only towards the provider that produced it
        for b in message.get("thinking_blocks") if isinstance(message.get("thinking_blocks"), list) else ():
            if isinstance(b, dict) and type(b.get("type")) is str and b["type"] in _THINKING:
                blocks.append(b)
        blocks.extend(_parts_to_blocks(message.get("content")))
        if message.get("refusal") and not blocks:
            blocks.append({"type": "text", "text": str(message["refusal"])})
        for call in message.get("tool_calls") or ():
            if not isinstance(call, dict):
                continue
            fn = call.get("function") or {}
            blocks.append({"type": "tool_use", "id": call.get("id"), "name": fn.get("name"),
                           "input": _input(fn.get("arguments"))})
        return "assistant", blocks
    return "user", _parts_to_blocks(message.get("content"))


def _native(fragment: dict[str, Any], same: bool) -> dict[str, Any]:
    """A stored fragment fit to send back: thinking only to the provider that produced it; our own
    keys left out."""
    content = fragment.get("content")
    if isinstance(content, list) and not same and any(
            isinstance(b, dict) and b.get("type") in _THINKING for b in content):
        content = [b for b in content if not (isinstance(b, dict) and b.get("type") in _THINKING)]
    return {**{k: v for k, v in fragment.items() if not k.startswith("_bp_")}, "content": content}


def to_anthropic(messages: Iterable[dict[str, Any]], provider: str | None) -> tuple[Any, list[dict[str, Any]]]:
    """(system, messages) of an Anthropic request for assembled chat messages: those read from
    fragments are put back together from them; the others (chat nodes, summaries) translated, and
    joined to the message before when they have its role (tool results become one user message)."""
    system: list[Any] = []
    system_text_only = True
    out: list[dict[str, Any]] = []
    joinable = False  # the last message out may take translated blocks of its role

    def content_list(message: dict[str, Any]) -> list[Any]:
        if not isinstance(message.get("content"), list):
            message["content"] = _blocks(message.get("content"))
        return message["content"]

    for m in messages:
        native = m.get(ITEMS)
        fragment = native[0] if native and len(native) == 1 and isinstance(native[0], dict) else None
        role = m.get("role")
        if role in ("system", "developer"):
            if fragment is not None and fragment.get(INLINE) and out:  # a message of its own, in place
                out.append({k: v for k, v in fragment.items() if not k.startswith("_bp_")})
                joinable = False
                continue
            if fragment is not None and fragment.get("role") == "system":
                content = fragment.get("content")
                if isinstance(content, list):
                    system_text_only = False
                    system.extend(content)
                    continue
                text = content
            else:
                text = m.get("content") if isinstance(m.get("content"), str) else "".join(
                    b["text"] for b in _parts_to_blocks(m.get("content")) if b.get("type") == "text")
            if text:
                system.append({"type": "text", "text": text})
            continue
        if fragment is not None and fragment.get("role") in ("user", "assistant") and _still_whole(m, fragment):
            piece = _native(fragment, provider is not None and m.get(PRODUCER) == provider)
            if fragment.get(CONT) and out and out[-1]["role"] == piece["role"]:
                content_list(out[-1]).extend(_blocks(piece.get("content")))
            else:
                # (a list of its own: the fragments after it are joined into it, and the stored
                # fragment -- a path cache's, kept for later calls -- must not change)
                content = piece.get("content")
                out.append({**piece, "content": list(content)} if isinstance(content, list) else dict(piece))
            joinable = False
            continue
        new_role, blocks = _from_chat(m, provider)
        if out and out[-1]["role"] == new_role and (joinable or new_role == "user"):
            content_list(out[-1]).extend(blocks)
        else:
            out.append({"role": new_role, "content": blocks})
        joinable = True
    if system_text_only and len(system) == 1:
        return system[0]["text"], out
    return (system or None), out


def _still_whole(message: dict[str, Any], fragment: dict[str, Any]) -> bool:
    """Whether the pairing check left a fragment's assistant message whole (its tool uses are the
    message's tool calls)."""
    if message.get("role") != "assistant":
        return True
    uses = {b.get("id") for b in _blocks(fragment.get("content")) if isinstance(b, dict) and b.get("type") == "tool_use"}
    calls = {c.get("id") for c in message.get("tool_calls") or () if isinstance(c, dict)}
    return uses == calls


# -- cache_control markers: the call's own, by position ----------------------------------------------


def markers(system: Any, messages: Sequence[Any]) -> list[list[Any]]:
    """Where the client put ``cache_control``: ``[message index from the end (0: the last; -1:
    the system field), block index, the marker]`` -- positions that hold in the assembled request
    too, whose last messages are the client's."""
    found: list[list[Any]] = []
    in_system = 0  # blocks of the system field so far (a string is one)
    if isinstance(system, list):
        for j, block in enumerate(system):
            if isinstance(block, dict) and block.get("cache_control") is not None:
                found.append([-1, j, block["cache_control"]])
        in_system = len(system)
    elif isinstance(system, str) and system:
        in_system = 1
    n = len(messages)
    leading = True  # system messages before any other go into the system field (``to_anthropic``)
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if leading and isinstance(message, dict) and message.get("role") == "system":
            if isinstance(content, list):
                for j, block in enumerate(content):
                    if isinstance(block, dict) and block.get("cache_control") is not None:
                        found.append([-1, in_system + j, block["cache_control"]])
                in_system += len(content)
            elif content:
                in_system += 1
            continue
        leading = False
        if isinstance(content, list):
            for j, block in enumerate(content):
                if isinstance(block, dict) and block.get("cache_control") is not None:
                    found.append([n - 1 - i, j, block["cache_control"]])
    return found


def _unmarked(blocks: Any) -> Any:
    if not isinstance(blocks, list):
        return blocks
    return [{k: v for k, v in b.items() if k != "cache_control"} if isinstance(b, dict) and "cache_control" in b else b
            for b in blocks]


def apply_markers(system: Any, messages: list[dict[str, Any]], found: Sequence[Sequence[Any]]) -> Any:
    """The assembled request with exactly the call's markers: earlier calls' markers on old blocks
    removed (the provider allows only a few, and they would pin a stale prefix), the call's put back
    where the client had them. Returns the system field; ``messages`` are changed in place."""
    system = _unmarked(system)
    if isinstance(system, str) and any(back == -1 for back, _, _ in found):
        system = [{"type": "text", "text": system}]
    for i, message in enumerate(messages):
        if isinstance(message.get("content"), list) and any(
                isinstance(b, dict) and "cache_control" in b for b in message["content"]):
            messages[i] = {**message, "content": _unmarked(message["content"])}
    n = len(messages)
    for back, j, marker in found:
        if back == -1:
            if isinstance(system, list) and 0 <= j < len(system) and isinstance(system[j], dict):
                system[j] = {**system[j], "cache_control": marker}
            continue
        i = n - 1 - back
        if 0 <= i < n:
            content = messages[i].get("content")
            if isinstance(content, str) and j == 0:
                content = [{"type": "text", "text": content}]
            if isinstance(content, list) and 0 <= j < len(content) and isinstance(content[j], dict):
                content = list(content)
                content[j] = {**content[j], "cache_control": marker}
                messages[i] = {**messages[i], "content": content}
    return system
