"""Anthropic messages <-> chat messages: what lets a Messages call live on the same tree as chat
and Responses calls (docs/behaviour.md#the-messages-api). Pure functions, in three modules:

    to_chat.py        a request's messages cut into fragments; each fragment read as a chat message
    from_chat.py      assembled chat messages back into an Anthropic request's system and messages
    cache_control.py  the call's cache_control markers, taken by position and put back

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
    user: text / image / document ...          user (text joined; other blocks as parts: a PDF as a file part)
    assistant: text, tool_use, thinking ...    assistant (text joined, tool_calls, reasoning_content;
                                                a server tool's call or result: a line in the text)

A ``system`` message among the messages (Claude Code sends one) is a system item marked ``INLINE``:
sent back in place when it follows other messages, else in the ``system`` field (where delta
mode's system rule -- system messages first -- always puts it; full-history calls keep the
client's order).

``cache_control`` and ``thinking`` / ``redacted_thinking`` blocks do not change the chat message
(so they take no part in matching); a ``thinking`` block goes back only to the provider that
produced it (``PRODUCER``), and ``cache_control`` markers are those of the call being made
(``markers`` / ``apply_markers``): a marker an earlier call put on an old block, or on a block
inside one, is not sent again.
"""

from __future__ import annotations

from .cache_control import LIMIT as LIMIT
from .cache_control import MARKERS as MARKERS
from .cache_control import NO_SYSTEM as NO_SYSTEM
from .cache_control import apply_markers, markers
from .cache_control import count as count
from .from_chat import sendable, to_anthropic
from .to_chat import CONT, cleared, fragments, to_messages
from .to_chat import INLINE as INLINE
from .to_chat import to_message as to_message

__all__ = [
    "CONT",
    "apply_markers",
    "cleared",
    "fragments",
    "markers",
    "sendable",
    "to_anthropic",
    "to_messages",
]
