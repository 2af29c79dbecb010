"""Which answer of ours an item sent back came from, by its id, and how a second message item of
one answer joins the first -- chat has one assistant message for an answer, and a Responses
client resends it as several items (docs/behaviour.md#the-responses-api). Pure functions, read by
``items.convert``."""

from __future__ import annotations

import re
from typing import Any

__all__ = ["after", "call_of", "joins", "message_of"]

_CALL = re.compile(r"(?:fc|ctc|tsc)_([0-9a-f]{32})_\d+")
_MESSAGE = re.compile(r"msg_([0-9a-f]{32})(?:_\d+)?")


def call_of(item_id: Any) -> str | None:
    """The node whose answer a call item of ours came from (``fc_<node>_<i>``, a custom tool's
    ``ctc_``, a tool search's ``tsc_``), else None."""
    match = _CALL.fullmatch(item_id) if isinstance(item_id, str) else None
    return match.group(1) if match else None


def message_of(item_id: Any) -> str | None:
    """The node whose answer a message item of ours came from (``msg_<node>``, or
    ``msg_<node>_<i>``: a second message of one answer), else None."""
    match = _MESSAGE.fullmatch(item_id) if isinstance(item_id, str) else None
    return match.group(1) if match else None


def joins(item: dict[str, Any], answered: tuple[dict[str, Any], str, int] | None) -> dict[str, Any] | None:
    """The assistant message an assistant message item belongs with: that of the answer before it
    (``answered``: its message, its node, its number) when the item is of that answer
    (``message_of``) -- a stream whose call came before its text, or whose text went on after a
    call or after more reasoning, gave the items in that order (an item's place is its
    output_index). Its text then follows the message's own, as the answer was stored: chat has one
    message for an answer, and a second assistant message between the calls and their results
    would part them."""
    if answered is None or item.get("role") != "assistant":
        return None
    message = answered[0]
    if message_of(item.get("id")) != answered[1] or message.get("refusal") \
            or not isinstance(message.get("content"), (str, type(None))):
        return None
    return message


def after(before: str | None, content: Any, refusal: str | None) -> tuple[Any, str | None]:
    """(content, refusal): a message's text (``before``, if any) with what a second message item
    of its answer says after it."""
    if not before:
        return content, refusal
    if isinstance(content, str):
        return before + content, refusal
    if isinstance(content, list):
        return [{"type": "text", "text": before}, *content], refusal
    return before, refusal
