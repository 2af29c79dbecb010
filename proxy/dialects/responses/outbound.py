"""Chat messages -> Responses items: the input a Responses upstream gets for assembled messages
(``request_body``), and the items a chat node reads as (``to_items``: the Conversations API,
``GET /v1/responses/{id}/input_items``) -- the way back of ``items`` (docs/behaviour.md#the-responses-api).
Pure functions.

    a message made from Responses items     its own items again (ids dropped; reasoning only to
                                            its producer, with its encrypted content)
    tool message                            function_call_output (its text parts joined, a line
                                            each; an image or a file as input parts)
    assistant message                       message item, then a function_call per tool call (a
                                            namespaced one, by the request's tools, with its
                                            namespace again)
    any other message                       message item (content parts as input parts)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ...key_order import encode_sorted
from ...surrogates import encode
from ..signed import ours
from .items import CALLS, ITEMS, PRODUCER, RESULTS, client_search, items_of
from .tools import split_name

__all__ = ["request_body", "to_items"]

# the items any Responses upstream may get back (others -- a server's tool search, a web search
# call -- only the provider that produced them)
_PORTABLE = frozenset({"message", "function_call", "custom_tool_call", *RESULTS})


def request_body(fields: dict[str, Any], messages: Iterable[dict[str, Any]], provider: str | None, *,
                 stream: bool = False) -> bytes:
    """A Responses upstream's request: ``fields`` (``store: false`` among them -- the proxy owns the
    state) and the assembled messages as input items; the twin of ``assembly.build_body``."""
    body = {**fields, "input": _with_namespaces(to_items(messages, provider), fields.get("tools"))}
    if stream:
        body["stream"] = True
    return encode_sorted(body)


def _with_namespaces(items: list[dict[str, Any]], tools: Any) -> list[dict[str, Any]]:
    """Function calls translated from chat messages under the flat name a namespaced function has
    over chat (``<namespace>__<name>``: a chat client's own answers, stored as messages) given
    their namespace again, by the tools the request offers."""
    if not isinstance(tools, list) or not any(isinstance(t, dict) and t.get("type") == "namespace" for t in tools):
        return items
    out = []
    for item in items:
        if item.get("type") == "function_call" and "namespace" not in item:
            namespace, name = split_name(item.get("name"), tools)
            if namespace is not None:
                item = {**item, "namespace": namespace, "name": name}
        out.append(item)
    return out





def _content_to_parts(content: Any, *, output: bool) -> Any:
    if content is None:
        return [] if output else ""
    if isinstance(content, str):
        return [{"type": "output_text", "text": content, "annotations": []}] if output else content
    parts = []
    for part in content if isinstance(content, list) else [content]:
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        if kind == "text":
            parts.append({"type": "output_text", "text": part.get("text", ""), "annotations": []} if output
                         else {"type": "input_text", "text": part.get("text", "")})
        elif kind == "image_url":
            image = part.get("image_url")
            image = {"url": image} if isinstance(image, str) else image if isinstance(image, dict) else {}
            parts.append({"type": "input_image", "image_url": image.get("url"), "detail": image.get("detail", "auto")})
        elif kind == "file":
            file = part.get("file")
            parts.append({"type": "input_file", **(file if isinstance(file, dict) else {})})
        else:
            parts.append(part)
    return parts


def _native(items: Sequence[dict[str, Any]], message: dict[str, Any], provider: str | None) -> list[dict[str, Any]]:
    """A message's own items, fit to send back: item ids dropped (nothing is stored upstream),
    reasoning only to the provider that produced it and only with its encrypted content; other
    items of a provider's only to it -- those a client added itself (the Conversations API's
    items, which no call's upstream produced) to any Responses upstream, as they came."""
    producer = message.get(PRODUCER)
    same = provider is not None and producer == provider
    out = []
    for item in items:
        if item.get("type") == "reasoning":
            if same and item.get("encrypted_content") and not ours(item["encrypted_content"]):  # (ours: signed.py)
                out.append(item)
            continue
        if item.get("type") in _PORTABLE or client_search(item) or "role" in item:
            out.append({k: v for k, v in item.items() if k not in ("id", "status")})
        elif same or producer is None:
            out.append(item)
    return out


def _tool_output(content: Any) -> Any:
    """A chat tool message's content as a ``function_call_output``'s output: a string; its text
    parts joined; other parts as Responses input parts (an image, a file)."""
    if content is None or isinstance(content, str):
        return content or ""
    parts = _content_to_parts(content, output=False)
    if isinstance(parts, list) and all(isinstance(p, dict) and p.get("type") == "input_text" for p in parts):
        return "\n".join(str(p.get("text") or "") for p in parts)
    return parts if isinstance(parts, list) else encode(content).decode()


def to_items(messages: Iterable[dict[str, Any]], provider: str | None = None) -> list[dict[str, Any]]:
    """Responses input items for assembled chat messages (those made from items get their own
    items back, as ``_native`` allows)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        native = m.get(ITEMS)
        if native and items_of(m) == "responses":  # (another dialect's: translated from the message)
            kept = _native(native, m, provider)
            calls_kept = {i.get("call_id") for i in kept if i.get("type") in CALLS}
            calls_now = {c.get("id") for c in m.get("tool_calls") or () if isinstance(c, dict)}
            if calls_kept == calls_now:  # the pairing check left the message whole
                out.extend(kept)
                continue
        role = m.get("role")
        if role == "tool":
            out.append({"type": "function_call_output", "call_id": m.get("tool_call_id"),
                        "output": _tool_output(m.get("content"))})
            continue
        if role == "assistant":
            if m.get("content") or m.get("refusal"):
                parts = _content_to_parts(m.get("content"), output=True)
                if m.get("refusal"):
                    parts.append({"type": "refusal", "refusal": m["refusal"]})
                out.append({"type": "message", "role": "assistant", "content": parts})
            for call in m.get("tool_calls") or ():
                fn = call.get("function") or {}
                out.append({"type": "function_call", "call_id": call.get("id"), "name": fn.get("name"),
                            "arguments": fn.get("arguments") or ""})
            continue
        out.append({"type": "message", "role": role or "user", "content": _content_to_parts(m.get("content"), output=False)})
    return out
