"""A chat tool call's own fields beyond its id, type and function -- Gemini's ``extra_content``,
which holds the call's thought signature -- carried through the dialects that have no place for
them (docs/behaviour.md#assembly).

A Responses ``function_call`` item and an Anthropic ``tool_use`` block keep a call's id, name and
arguments only, and Gemini refuses a tool round whose calls come back unsigned. So a chat answer
whose calls carry such fields is given, after its calls, one opaque piece of the kind each API
keeps and sends back as it got it: a ``reasoning`` item with no summary (its
``encrypted_content``), an Anthropic ``redacted_thinking`` block (its ``data``). Its text is
``blob``'s: the fields by call id. Reading the answer back as chat messages puts them on the
calls they name (``read``); assembly sends them to the provider that made them only. Pure
functions.
"""

from __future__ import annotations

import base64
import binascii
import uuid
from typing import Any

import msgspec

from .chat.completion import call_id

__all__ = ["blob", "read", "restore"]

_PREFIX = "bp-calls:"  # a blob of ours: base64 of {call id: {field: value}}
_STANDARD = frozenset({"id", "type", "function", "index"})


def blob(message: dict[str, Any], node_id: uuid.UUID) -> str | None:
    """The other fields of a chat answer's tool calls, by call id (``call_id``: the id the
    translated answer gives each call), as one opaque string; None when no call has any."""
    carried: dict[str, Any] = {}
    calls = message.get("tool_calls")
    for i, call in enumerate(calls if isinstance(calls, list) else ()):
        if not isinstance(call, dict):
            continue
        other = {k: v for k, v in call.items() if k not in _STANDARD and v is not None}
        if other:
            carried[call_id(call, node_id, i)] = other
    if not carried:
        return None
    return _PREFIX + base64.b64encode(msgspec.json.encode(carried)).decode()


def read(value: Any) -> dict[str, dict[str, Any]]:
    """The calls' fields a ``blob`` carries, by call id; {} for any other value (not ours)."""
    if not isinstance(value, str) or not value.startswith(_PREFIX):
        return {}
    try:
        carried = msgspec.json.decode(base64.b64decode(value[len(_PREFIX):], validate=True))
    except (binascii.Error, ValueError, msgspec.DecodeError):
        return {}
    if not isinstance(carried, dict):
        return {}
    return {k: {f: x for f, x in v.items() if f not in _STANDARD} for k, v in carried.items() if isinstance(v, dict)}


def restore(calls: list[dict[str, Any]], carried: dict[str, dict[str, Any]]) -> None:
    """Put the fields ``carried`` holds back on the chat ``calls`` they name (in place)."""
    for call in calls:
        named = call.get("id")
        if isinstance(named, str) and named in carried:
            call.update(carried[named])
