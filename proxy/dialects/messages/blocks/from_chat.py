"""Assembled chat messages back into an Anthropic request's ``system`` field and messages
(``to_anthropic``): messages read from fragments put back together from them exactly as the
client sent them (a ``thinking`` block only to the provider that produced it), the others -- chat
nodes, summaries -- translated and joined to the message before when they have its role (a chat
node's answer from Claude that kept its blocks in ``thinking_blocks``: those blocks, when
assembly left them to it). Pure functions.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Iterable
from typing import Any

import msgspec

from ....surrogates import encode, loads
from ...responses.items import ITEMS, PRODUCER, items_of, tool_output_parts
from ...signed import our_block
from .to_chat import CONT, INLINE, _assistant, _blocks

__all__ = ["input_json", "sendable", "to_anthropic"]

_THINKING = frozenset({"thinking", "redacted_thinking"})


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
        kind = part.get("type", "text")
        if kind in ("text", "input_text", "output_text"):
            if part.get("text", "") != "":  # (an empty text block Anthropic refuses; it says nothing)
                blocks.append({"type": "text", "text": part.get("text")})
        elif kind == "image_url":
            blocks.append(_image(part.get("image_url")))
        elif kind == "file":
            blocks.append(_document(part.get("file") if isinstance(part.get("file"), dict) else {}))
        elif kind in ("image", "document", "search_result"):
            blocks.append(part)
        elif kind == "input_audio":  # (nothing Anthropic reads: a line saying so, never dropped unsaid)
            audio = part.get("input_audio") if isinstance(part.get("input_audio"), dict) else {}
            media = audio.get("format") if isinstance(audio.get("format"), str) and audio.get("format") else None
            blocks.append({"type": "text", "text": f"[audio{f' ({media})' if media else ''}: not readable by this model]"})
        elif kind == "refusal":  # (an assistant's refusal among its parts: what the model said)
            if isinstance(part.get("refusal"), str) and part["refusal"]:
                blocks.append({"type": "text", "text": part["refusal"]})
        else:  # a part Anthropic has no block for (video_url ...): a line saying so, as audio
            blocks.append({"type": "text", "text": f"[{kind if isinstance(kind, str) and kind else 'part'}: "
                                                   "not readable by this model]"})
    return blocks


def _image(image: Any) -> dict[str, Any]:
    """Chat's image part as Anthropic's image: a data URL's bytes, any other URL by URL -- the
    string form too (``"image_url": "https://..."``, which OpenAI-compatible servers take). One
    without a URL (null, a list, a number) is a line saying so: it made a 500, and so did every
    later call of its conversation to an Anthropic model."""
    url = image if isinstance(image, str) else image.get("url") if isinstance(image, dict) else None
    if not isinstance(url, str) or not url:
        return {"type": "text", "text": "[image without a URL: not readable by this model]"}
    if url.startswith("data:") and ";base64," in url:
        media, data = url[5:].split(";base64,", 1)
        return {"type": "image", "source": {"type": "base64", "media_type": media, "data": data}}
    return {"type": "image", "source": {"type": "url", "url": url}}


def _document(file: dict[str, Any]) -> dict[str, Any]:
    """Chat's file part as Anthropic's document: a PDF's bytes or URL as they are, a text file as
    its text; anything else (another provider's file id, a format Anthropic does not read) as a
    line saying what it was."""
    name = file.get("filename") if isinstance(file.get("filename"), str) and file.get("filename") else None
    data, url = file.get("file_data"), file.get("file_url")
    block: dict[str, Any] | None = None
    if isinstance(data, str) and data.startswith("data:") and ";base64," in data:
        media, payload = data[5:].split(";base64,", 1)
        if media == "application/pdf":
            block = {"type": "document", "source": {"type": "base64", "media_type": media, "data": payload}}
        elif media.startswith("text/"):
            try:
                text = base64.b64decode(payload, validate=True).decode()
            except (ValueError, UnicodeDecodeError):
                text = None
            if text is not None:
                block = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": text}}
    elif isinstance(url, str) and url:
        block = {"type": "document", "source": {"type": "url", "url": url}}
    if block is None:
        what = name or file.get("file_id") or "file"
        return {"type": "text", "text": f"[file {what}: not readable by this model]"}
    if name:
        block["title"] = name
    return block


def _input(arguments: Any) -> Any:
    if isinstance(arguments, dict):
        return arguments
    try:
        value = loads(arguments) if isinstance(arguments, str | bytes) and arguments else {}
    except (msgspec.DecodeError, RecursionError):
        return {"arguments": arguments}  # (not JSON: kept, as a field)
    return value if isinstance(value, dict) else {"value": value}


def input_json(arguments: str) -> str:
    """A chat tool call's arguments as a streamed ``tool_use`` input's JSON: as written when they
    are a JSON object, else the object ``_input`` makes of them -- what the answer whole and the
    stored answer say, and what an SDK can parse (it refuses anything but an object)."""
    try:
        if isinstance(loads(arguments), dict):
            return arguments
    except (msgspec.DecodeError, RecursionError):
        pass
    return encode(_input(arguments)).decode()  # (arguments cut mid-emoji: a lone surrogate kept)


def _from_chat(message: dict[str, Any], provider: str | None) -> tuple[str, list[dict[str, Any]]]:
    role = message.get("role")
    if role == "tool":
        content = tool_output_parts(message)  # (a Responses tool output's images and files: a tool result takes them)
        if content is None:
            content = message.get("content")
        block: dict[str, Any] = {"type": "tool_result", "tool_use_id": message.get("tool_call_id")}
        block["content"] = content if isinstance(content, str) else _parts_to_blocks(content)
        return "user", [block]
    if role == "assistant":
        # a chat node's signed thinking: assembly kept it only towards the provider that produced it
        kept = [b for b in message.get("thinking_blocks") if isinstance(b, dict) and type(b.get("type")) is str] \
            if isinstance(message.get("thinking_blocks"), list) else []
        if any(b["type"] not in _THINKING for b in kept) and _reads_as(kept, message.get("content")):
            blocks = list(kept)  # (Claude's answer whole but its tool uses: server tools, in their place)
        else:
            blocks = [b for b in kept if b["type"] in _THINKING]
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


def _reads_as(blocks: list[dict[str, Any]], content: Any) -> bool:
    """Whether an answer's kept blocks read as the message's content (``answers.chat_message``
    kept them so): then they stand for it; a content changed since says what is to be sent."""
    text = content if isinstance(content, str) else "".join(
        b["text"] for b in _parts_to_blocks(content) if b.get("type") == "text")
    return (_assistant(blocks).get("content") or "") == (text or "")


def _native(fragment: dict[str, Any], same: bool) -> dict[str, Any]:
    """A stored fragment fit to send back: thinking only to the provider that produced it; our own
    keys left out, and what we signed -- the block keeping what a translated answer kept, another
    model's reasoning as a thinking block (``signed``) -- never: Anthropic refuses it. (A client's
    own blocks are read as the node's provider's: one resending our signed thinking to Claude, in
    a history that matched nothing stored, must not send it on.)"""
    content = fragment.get("content")
    if isinstance(content, list) and any(isinstance(b, dict) and b.get("type") in _THINKING for b in content):
        content = [b for b in content if not (isinstance(b, dict) and b.get("type") in _THINKING
                                              and (not same or our_block(b)))]
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
        native = m.get(ITEMS) if items_of(m) == "messages" else None  # (another dialect's: translated)
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


# -- what Anthropic refuses, made acceptable ----------------------------------------------------------

_TOOL_ID = re.compile(r"[A-Za-z0-9_-]+")


def _tool_id(value: Any) -> Any:
    """A tool id as Anthropic takes it (``^[a-zA-Z0-9_-]+$``): other models make ids such as
    ``functions.Bash:0``. Its other characters become ``_`` and a short hash of it keeps two ids
    apart -- the same for a ``tool_use`` and the ``tool_result`` that answers it."""
    if not isinstance(value, str) or _TOOL_ID.fullmatch(value):
        return value
    return re.sub(r"[^A-Za-z0-9_-]", "_", value) + "_" + hashlib.sha256(value.encode()).hexdigest()[:8]


def _acceptable(block: Any) -> Any:
    if not isinstance(block, dict):
        return block
    kind = block.get("type")
    if kind == "tool_use" and block.get("id") != (clean := _tool_id(block.get("id"))):
        return {**block, "id": clean}
    if kind == "tool_result" and block.get("tool_use_id") != (clean := _tool_id(block.get("tool_use_id"))):
        return {**block, "tool_use_id": clean}
    return block


def _empty(content: Any) -> bool:
    return content is None or content == "" or content == []


def sendable(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """An Anthropic request's messages as Anthropic accepts them, whatever made them: tool ids of
    its pattern, and no message without content but a last one (Anthropic refuses such a request,
    and each later one of the conversation, which sends it again). An empty message comes from an
    answer with nothing an Anthropic upstream may read -- Claude's own ``content: []``, or another
    model's empty or reasoning-only answer, whose thinking Anthropic did not sign. Left
    out, its neighbours of one role are joined into one message, as Anthropic itself reads them.
    Runs after the cache_control markers are placed (their positions count from the end)."""
    out: list[dict[str, Any]] = []
    last = len(messages) - 1
    left_out = False  # since the last message kept
    for i, message in enumerate(messages):
        content = message.get("content")
        if isinstance(content, list):
            blocks = [_acceptable(b) for b in content]
            if any(a is not b for a, b in zip(blocks, content, strict=True)):
                message = {**message, "content": blocks}
        if _empty(message.get("content")) and i != last:
            left_out = True
            continue
        if left_out and out and out[-1].get("role") == message.get("role") and not _empty(message.get("content")):
            out[-1] = {**out[-1], "content": [*_blocks(out[-1].get("content")), *_blocks(message.get("content"))]}
        else:
            out.append(message)
        left_out = False
    return out
