"""Responses items checked before they are stored without an upstream to check them: the items a
client adds to a conversation (docs/behaviour.md#the-conversations-api), and those of an import
(``proxy.transfer``: a chat message's content is checked as a message's here). A call's own input goes
to the upstream, which refuses what it cannot take -- and a refused call is no one's context. An
added item has no such check: stored as it came, a malformed one would go upstream with every
later call of its conversation, and each would be refused.

The checks are those of the item types the proxy reads (a message, the calls a client answers
and their outputs, reasoning, compaction), with the fields OpenAI requires of them. An item of a
type it does not know is kept and forwarded as it came, as unknown fields are: OpenAI adds item
types, and a conversation holding one should not wait for the proxy to learn it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["content_problem", "item_problem"]

ROLES = ("user", "assistant", "system", "developer")

# content part type -> the fields of which it needs one (a string each)
_PART_NEEDS: dict[str, tuple[str, ...]] = {
    "input_text": ("text",),
    "text": ("text",),  # (a chat message's)
    "output_text": ("text",),
    "summary_text": ("text",),
    "reasoning_text": ("text",),
    "refusal": ("refusal",),
    "input_image": ("image_url", "file_id"),
    "input_file": ("file_id", "file_data", "file_url"),
}

# item type -> its required string fields
_STRINGS: dict[str, tuple[str, ...]] = {
    "function_call": ("call_id", "name", "arguments"),
    "function_call_output": ("call_id",),
    "custom_tool_call": ("call_id", "name", "input"),
    "custom_tool_call_output": ("call_id",),
}

_OUTPUTS = ("function_call_output", "custom_tool_call_output")  # output: a string or an array of parts


def item_problem(item: dict[str, Any]) -> tuple[str, str] | None:
    """Why ``item`` cannot be stored as context, and the field at fault (relative to the item:
    ``""``, ``".role"``, ``".content[2].text"``) -- or None."""
    if item.get("id") is not None and not isinstance(item["id"], str):  # (null: none, as an SDK's dump writes it)
        return "an item's id must be a string", ".id"
    kind = item.get("type", "message")
    if kind == "message":
        return _message_problem(item)
    if kind == "item_reference":  # (what a call's input names is resolved before it is stored)
        return "an item reference cannot be stored as context", ""
    for field in _STRINGS.get(kind, ()):
        if not isinstance(item.get(field), str):
            return f"a {kind} item needs '{field}' (a string)", f".{field}"
    if kind in _OUTPUTS:
        output = item.get("output")
        if isinstance(output, list):
            return _parts_problem(output, ".output")
        if not isinstance(output, str):
            return f"a {kind} item needs 'output' (a string or an array of content parts)", ".output"
    if kind == "compaction" and not isinstance(item.get("encrypted_content"), str) and not (
            item.get("encrypted_content") is None and isinstance(item.get("id"), str)):
        # (its token, or -- one of ours -- its id alone: cmp_<node>)
        return "a compaction item needs 'encrypted_content' (a string)", ".encrypted_content"
    if kind == "reasoning":
        if not isinstance(item.get("summary"), list):
            return "a reasoning item needs 'summary' (an array of summary parts)", ".summary"
        if (problem := _parts_problem(item["summary"], ".summary")) is not None:
            return problem
        if item.get("encrypted_content") is not None and not isinstance(item["encrypted_content"], str):
            return "a reasoning item's encrypted_content must be a string", ".encrypted_content"
        if isinstance(item.get("content"), list):
            return _parts_problem(item["content"], ".content")
    return None


def _message_problem(item: dict[str, Any]) -> tuple[str, str] | None:
    role = item.get("role")
    if role not in ROLES:
        return (f"Invalid value: {role!r}. Supported values are: 'assistant', 'system', 'developer', and 'user'.",
                ".role")
    return content_problem(item.get("content"))


def content_problem(content: Any) -> tuple[str, str] | None:
    """Why a message's ``content`` is none: a string, or an array of content parts."""
    if isinstance(content, str):
        return None
    if not isinstance(content, list):
        return "a message needs 'content': a string or an array of content parts", ".content"
    return _parts_problem(content, ".content")


def _parts_problem(parts: list[Any], param: str) -> tuple[str, str] | None:
    for i, part in enumerate(parts):
        at = f"{param}[{i}]"
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            return "a content part is an object with a type", at
        needs = _PART_NEEDS.get(part["type"])
        if needs and not any(isinstance(part.get(field), str) for field in needs):
            named = " or ".join(f"'{f}'" for f in needs)
            return f"a {part['type']} part needs {named} (a string)", f"{at}.{needs[0]}"
    return None
