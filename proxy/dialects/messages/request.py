"""A client's Messages request, read and checked (every field kept), and what it sends: its
``system`` field (the system rule's system message) and its messages, as fragments."""

from __future__ import annotations

from typing import Any

from ...errors import InvalidRequest
from ...key_order import with_key_order
from .. import parse_model_request, refuse_own_keys
from .blocks import MARKERS, NO_SYSTEM, fragments, markers

__all__ = ["CLEAR_THINKING", "CLEAR_TOOL_USES", "call_items", "call_params", "check_message", "clearing_edit",
           "kept_thinking_turns", "parse_messages_body"]

_ROLES = frozenset({"user", "assistant", "system"})  # (system: a message of its own, where the client put it)


# what the proxy reads of a block, by type: each of these fields, when present, of this type
_FIELDS: dict[str, tuple[tuple[str, type | tuple[type, ...], bool], ...]] = {  # (field, type, required)
    "text": (("text", str, True),),
    "tool_use": (("id", str, True), ("name", str, True), ("input", dict, False)),
    "server_tool_use": (("id", str, True), ("name", str, False)),
    "tool_result": (("tool_use_id", str, True), ("content", (str, list), False), ("is_error", bool, False)),
    "thinking": (("thinking", str, True), ("signature", str, False)),
    "redacted_thinking": (("data", str, True),),
    "image": (("source", dict, True),),
    "document": (("source", dict, True),),
}


_NAMES = {str: "a string", dict: "an object", bool: "a boolean", (str, list): "a string or an array of blocks"}


def _check_blocks(blocks: list[Any], where: str) -> None:
    """Refuse (400) a block the proxy could not read the way Anthropic does: every block an object
    with a string type, and the fields the proxy uses of the known types as the API defines them."""
    for j, block in enumerate(blocks):
        at = f"{where}.{j}"
        if not isinstance(block, dict) or type(block.get("type")) is not str:
            raise InvalidRequest(f"{at}: each content block is an object with a string 'type'", param=at)
        for field, kind, required in _FIELDS.get(block["type"], ()):
            value = block.get(field)
            if value is None and not required:
                continue
            if not isinstance(value, kind):
                raise InvalidRequest(f"{at}.{field}: {_NAMES.get(kind, 'of another type')} in a {block['type']} block",
                                     param=f"{at}.{field}")
        if block["type"] == "tool_result" and isinstance(block.get("content"), list):
            _check_blocks(block["content"], f"{at}.content")


def check_message(m: Any, at: str) -> None:
    """Refuse (400) a message the proxy could not read: its role, and its content -- a string or
    blocks (``_check_blocks``). Also what an import checks a stored fragment by (one reads as a
    message: ``blocks.fragments``)."""
    role = m.get("role") if isinstance(m, dict) else None
    if not isinstance(role, str) or role not in _ROLES:
        raise InvalidRequest(f"{at}: each message is an object whose role is 'user', 'assistant' or 'system'", param=at)
    content = m.get("content")
    if not isinstance(content, (str, list)):
        raise InvalidRequest(f"{at}.content: a string or an array of content blocks", param=f"{at}.content")
    if isinstance(content, list):
        _check_blocks(content, f"{at}.content")


def parse_messages_body(raw: bytes) -> dict[str, Any]:
    body = parse_model_request(raw)
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise InvalidRequest("messages: Field required (an array of messages)", param="messages")
    for i, m in enumerate(messages):
        check_message(m, f"messages.{i}")
        refuse_own_keys(m, f"messages.{i}")
    system = body.get("system")
    if system is not None and not isinstance(system, (str, list)):
        raise InvalidRequest("system: a string or an array of text blocks", param="system")
    if isinstance(system, list):
        _check_blocks(system, "system")
    tools = body.get("tools")
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
        raise InvalidRequest("tools: an array of objects", param="tools")
    if body.get("stream") is not None and not isinstance(body["stream"], bool):
        raise InvalidRequest("stream: a boolean", param="stream")
    return body


def call_items(body: dict[str, Any]) -> list[dict[str, Any]]:
    """What the call sends: the system item, then its messages cut into fragments."""
    return fragments(body.get("system"), body["messages"])


def call_params(body: dict[str, Any]) -> dict[str, Any]:
    """Every other field (stored, forwarded), and where the client put its cache_control markers."""
    params = with_key_order({k: v for k, v in body.items() if k not in ("messages", "system")})
    found = markers(body.get("system"), body["messages"])
    if found:
        params[MARKERS] = found
    if body.get("system") in (None, "", []):  # (the stored system goes on, with its client's markers)
        params[NO_SYSTEM] = True
    return params


CLEAR_TOOL_USES = "clear_tool_uses_20250919"
CLEAR_THINKING = "clear_thinking_20251015"


def kept_thinking_turns(params: dict[str, Any]) -> int | None:
    """The request's ``clear_thinking`` edit as the proxy carries it out for a chat upstream that
    takes readable reasoning back (``accepts_reasoning``): how many of the most recent assistant
    turns keep their reasoning (Anthropic's default: 1) -- None when it asks for no such edit, or
    keeps ``"all"``. (Towards any other upstream there is nothing to do: thinking goes back only
    to the provider that wrote it.) A malformed edit keeps everything: the call was checked as
    it came in."""
    management = params.get("context_management")
    edits = management.get("edits") if isinstance(management, dict) else None
    for edit in edits if isinstance(edits, list) else ():
        if not isinstance(edit, dict) or edit.get("type") != CLEAR_THINKING:
            continue
        keep = edit.get("keep")
        if keep is None:
            return 1
        if isinstance(keep, dict) and keep.get("type") == "thinking_turns" and type(keep.get("value")) is int \
                and keep["value"] >= 0:
            return keep["value"]
        return None
    return None


def _amount(value: Any, kind: str, at: str, least: int = 0) -> int | None:
    """``{"type": kind, "value": N}`` (N >= ``least``) read as N; None when not given."""
    if value is None:
        return None
    if not isinstance(value, dict) or value.get("type") != kind or isinstance(value.get("value"), bool) \
            or not isinstance(value.get("value"), int) or value["value"] < least:
        raise InvalidRequest(f"{at}: expected {{\"type\": \"{kind}\", \"value\": <a whole number of at least "
                             f"{least}>}}", param=at)
    return int(value["value"])


def clearing_edit(body: dict[str, Any]) -> dict[str, Any] | None:
    """The request's ``clear_tool_uses`` edit (``context_management.edits``), read and checked, as
    the proxy carries it out for an upstream that is not Anthropic's (``compaction.Edits``'
    fields; Anthropic's defaults where a field is left out) -- or None when it asks for none.
    Other edits are not done here: ``clear_thinking`` asks for what such an upstream mostly never
    gets (thinking goes back only to the provider that wrote it; for one that takes reasoning
    back: ``kept_thinking_turns``), and an edit type it does not know is left out, as the field is."""
    management = body.get("context_management")
    if management is None:
        return None
    edits = management.get("edits") if isinstance(management, dict) else None
    if not isinstance(edits, list):
        raise InvalidRequest("context_management.edits: an array of edits", param="context_management.edits")
    for i, edit in enumerate(edits):
        at = f"context_management.edits.{i}"
        if not isinstance(edit, dict) or edit.get("type") != CLEAR_TOOL_USES:
            continue
        trigger = edit.get("trigger")
        uses = _amount(trigger, "tool_uses", f"{at}.trigger", 1) if isinstance(trigger, dict) \
            and trigger.get("type") == "tool_uses" else None
        tokens = None if uses is not None else _amount(trigger, "input_tokens", f"{at}.trigger", 1)
        exclude = edit.get("exclude_tools")
        if exclude is not None and (not isinstance(exclude, list) or not all(isinstance(t, str) for t in exclude)):
            raise InvalidRequest(f"{at}.exclude_tools: an array of tool names", param=f"{at}.exclude_tools")
        keep = _amount(edit.get("keep"), "tool_uses", f"{at}.keep")
        return {
            "trigger_tokens": 100_000 if tokens is None and uses is None else tokens,
            "trigger_uses": uses,
            "keep": 3 if keep is None else keep,
            "at_least": _amount(edit.get("clear_at_least"), "input_tokens", f"{at}.clear_at_least") or 0,
            "exclude": frozenset(exclude or ()),
        }
    return None
