"""What a chat answer carries that a Responses or Anthropic client's answer has no place for --
a tool call's own fields beyond its id, type and function (Gemini's ``extra_content``: the call's
thought signature) and the message's signed or opaque reasoning (Claude's ``thinking_blocks``
with their signatures, ``reasoning_details``) -- kept through those dialects
(docs/behaviour.md#assembly).

A Responses ``function_call`` item and an Anthropic ``tool_use`` block keep a call's id, name and
arguments only; a ``reasoning`` summary keeps no signature. Gemini refuses a tool round whose calls
come back unsigned, and Anthropic one whose thinking comes back unsigned. So such an answer is
given, after everything else, one opaque piece of the kind each API keeps and sends back as it got
it: a ``reasoning`` item with no summary (in its ``encrypted_content``), an Anthropic
``redacted_thinking`` block (in its ``data``) -- holding ``blob``'s text. Reading the answer back
as chat messages puts them back (``read``, ``restore``); assembly sends them to the provider that
made them only. Pure functions.
"""

from __future__ import annotations

import base64
import binascii
import uuid
from typing import Any

import msgspec

from ..assembly import OPAQUE
from .chat.completion import call_id

__all__ = ["Kept", "blob", "read", "restore"]

_PREFIX = "bp-signed:"  # a blob of ours: base64 of {"calls": {call id: {field: value}}, "message": {field: value}}
_STANDARD = frozenset({"id", "type", "function", "index"})


class Kept(msgspec.Struct, omit_defaults=True):
    calls: dict[str, dict[str, Any]] = {}  # a call's other fields, by call id
    message: dict[str, Any] = {}  # the message's opaque reasoning (``assembly.OPAQUE``)


def blob(message: dict[str, Any], node_id: uuid.UUID) -> str | None:
    """What of a chat answer its translation has no place for, as one opaque string (a call by
    the id its translation gives it: ``call_id``); None when there is nothing."""
    calls: dict[str, Any] = {}
    tool_calls = message.get("tool_calls")
    for i, call in enumerate(tool_calls if isinstance(tool_calls, list) else ()):
        if not isinstance(call, dict):
            continue
        other = {k: v for k, v in call.items() if k not in _STANDARD and v is not None}
        if other:
            calls[call_id(call, node_id, i)] = other
    opaque = {k: message[k] for k in OPAQUE if message.get(k)}
    if not calls and not opaque:
        return None
    return _PREFIX + base64.b64encode(msgspec.json.encode(Kept(calls, opaque))).decode()


def read(value: Any) -> Kept | None:
    """What a ``blob`` keeps; None for any other value (not ours)."""
    if not isinstance(value, str) or not value.startswith(_PREFIX):
        return None
    try:
        kept = msgspec.json.decode(base64.b64decode(value[len(_PREFIX):], validate=True), type=Kept)
    except (binascii.Error, ValueError, msgspec.DecodeError):
        return None
    return kept


def restore(message: dict[str, Any], kept: Kept) -> None:
    """Put what ``kept`` holds back on the chat assistant ``message`` (in place): on each call
    it names, its fields (never its id, type or function); on the message, its reasoning."""
    for call in message.get("tool_calls") or ():
        named = call.get("id") if isinstance(call, dict) else None
        if isinstance(named, str) and isinstance(kept.calls.get(named), dict):
            call.update({k: v for k, v in kept.calls[named].items() if k not in _STANDARD})
    for key, value in kept.message.items():
        if key in OPAQUE:
            message[key] = value
