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
``redacted_thinking`` block (in its ``data``) -- holding ``blob``'s text, which names the provider
that produced what it keeps. Reading the answer back as chat messages puts it on the answer's
message under ``assembly.KEPT`` (``restore``); assembly hands it to that provider only. The piece
itself is ours: no upstream ever gets it (``ours``). Pure functions.
"""

from __future__ import annotations

import base64
import binascii
import uuid
from typing import Any

import msgspec

from ..assembly import KEPT, OPAQUE
from .chat.completion import call_id

__all__ = ["Kept", "blob", "our_block", "ours", "read", "restore", "thinking_signature", "without_ours"]

_PREFIX = "bp-signed:"  # a blob of ours: base64 of a list of ``Kept``
_STANDARD = frozenset({"id", "type", "function", "index"})


class Kept(msgspec.Struct, omit_defaults=True):
    """What one provider's answer carried beyond what its translation says."""

    producer: str | None = None
    calls: dict[str, dict[str, Any]] = {}  # a call's other fields, by call id
    message: dict[str, Any] = {}  # the message's opaque reasoning (``assembly.OPAQUE``)


def blob(message: dict[str, Any], node_id: uuid.UUID, producer: str | None) -> str | None:
    """What of a chat answer, produced by ``producer``, its translation has no place for, as one
    opaque string (a call by the id its translation gives it: ``call_id``) -- with what the
    message keeps already (``KEPT``: an answer read back from such a piece); None when there is
    nothing."""
    calls: dict[str, Any] = {}
    tool_calls = message.get("tool_calls")
    for i, call in enumerate(tool_calls if isinstance(tool_calls, list) else ()):
        if not isinstance(call, dict):
            continue
        other = {k: v for k, v in call.items() if k not in _STANDARD and v is not None}
        if other:
            calls[call_id(call, node_id, i)] = other
    opaque = {k: message[k] for k in OPAQUE if message.get(k)}
    kept = [Kept(producer, calls, opaque)] if calls or opaque else []
    already = message.get(KEPT)
    kept.extend(msgspec.convert(already, list[Kept]) if isinstance(already, list) else ())
    if not kept:
        return None
    return _PREFIX + base64.b64encode(msgspec.json.encode(kept)).decode()


def thinking_signature(producer: str | None) -> str:
    """The signature of a ``thinking`` block made of another model's reasoning (a chat answer's
    ``reasoning_content``): ours, naming its producer. Anthropic's blocks are always signed, and
    clients go by it -- pydantic-ai sends an unsigned one back as text in a user turn, a history
    that matches nothing stored; the block goes back to no upstream as it is (``ours``)."""
    return _PREFIX + base64.b64encode(msgspec.json.encode([Kept(producer)])).decode()


def ours(value: Any) -> bool:
    """Is ``value`` (an ``encrypted_content``, a ``redacted_thinking`` block's ``data``, a ``thinking``
    block's ``signature``) a blob of ours?"""
    return isinstance(value, str) and value.startswith(_PREFIX)


def read(value: Any) -> list[Kept] | None:
    """What a ``blob`` keeps; None for any other value (not ours, or not readable)."""
    if not ours(value):
        return None
    try:
        return msgspec.json.decode(base64.b64decode(value[len(_PREFIX):], validate=True), type=list[Kept])
    except (binascii.Error, ValueError, RecursionError, msgspec.DecodeError):
        return None


def without_ours(body: dict[str, Any]) -> bool:
    """Take our pieces out of a request passed through as the client sent it (in place): a
    Responses ``input``'s kept reasoning items, a Messages history's kept ``redacted_thinking``
    blocks and the ``thinking`` blocks we signed -- no upstream made them, and every one refuses
    them. Says whether any was there."""
    found = False
    items = body.get("input")
    if isinstance(items, list):
        kept = [i for i in items if not (type(i) is dict and i.get("type") == "reasoning" and ours(i.get("encrypted_content")))]
        found = len(kept) != len(items)
        body["input"] = kept
    for message in body.get("messages") if isinstance(body.get("messages"), list) else ():
        content = message.get("content") if type(message) is dict else None
        if isinstance(content, list) and any(our_block(b) for b in content):
            message["content"] = [b for b in content if not our_block(b)]
            found = True
    return found


def our_block(block: Any) -> bool:
    """Is ``block`` a Messages content block of ours (a kept ``redacted_thinking``, a ``thinking``
    block we signed), which no upstream takes?"""
    return type(block) is dict and ((block.get("type") == "redacted_thinking" and ours(block.get("data")))
                                    or (block.get("type") == "thinking" and ours(block.get("signature"))))


def restore(message: dict[str, Any], kept: list[Kept]) -> None:
    """Put what ``kept`` holds on the chat assistant ``message`` it was kept for (in place), under
    ``KEPT``: assembly gives it to its producer only (``assembly.unkept``)."""
    message[KEPT] = [*message.get(KEPT, ()), *msgspec.to_builtins(kept)]
