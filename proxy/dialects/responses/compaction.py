"""OpenAI's compaction items, readable (docs/behaviour.md#the-conversations-api).

A call compacted under its client's compaction controls (``context_management``, ``truncation:
"auto"``) answers with an output item standing for everything before it::

    {"type": "compaction", "id": "cmp_<node>", "encrypted_content": "<token>",
     "summary": [{"type": "summary_text", "text": "<the summary>"}]}

The summary is the compaction node's own, readable. The token is opaque to the client but not
secret: it only names the compaction node (and the call that was compacted under it), so a
stateless client can send the item back in place of the items before it, and the proxy resolves
it -- for the caller's tenant only. Pure functions.
"""

from __future__ import annotations

import base64
import binascii
import uuid
from typing import Any

__all__ = ["TOKEN_PREFIX", "compaction_item", "compaction_node_of", "is_compaction_item", "read_token", "summary_of"]

TOKEN_PREFIX = "bpcmp1."


def token(node_id: uuid.UUID, call_node: uuid.UUID | None = None) -> str:
    raw = node_id.bytes + (call_node.bytes if call_node is not None else b"")
    return TOKEN_PREFIX + base64.urlsafe_b64encode(raw).decode().rstrip("=")


def read_token(value: Any) -> tuple[uuid.UUID, uuid.UUID | None] | None:
    """(the compaction node, the call compacted under it or None) a token names; None: not ours."""
    if not isinstance(value, str) or not value.startswith(TOKEN_PREFIX):
        return None
    text = value[len(TOKEN_PREFIX):]
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        return None
    if len(raw) == 16:
        return uuid.UUID(bytes=raw), None
    if len(raw) == 32:
        return uuid.UUID(bytes=raw[:16]), uuid.UUID(bytes=raw[16:])
    return None


def is_compaction_item(item: Any) -> bool:
    return isinstance(item, dict) and item.get("type") in ("compaction", "compaction_summary")


def compaction_node_of(item: dict[str, Any]) -> tuple[uuid.UUID, uuid.UUID | None] | None:
    """The nodes a compaction item a client sent back names (its token; else its ``cmp_`` id)."""
    found = read_token(item.get("encrypted_content"))
    if found is not None:
        return found
    item_id = item.get("id")
    if isinstance(item_id, str) and item_id.startswith("cmp_") and len(item_id) == 36:
        try:
            return uuid.UUID(hex=item_id[4:]), None
        except ValueError:
            return None
    return None


def summary_of(sent: list[Any]) -> str:
    """The summary text of a compaction node's ``sent`` (system prompt first, then the summary)."""
    for message in sent:
        if isinstance(message, dict) and message.get("role") not in ("system", "developer"):
            content = message.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                return "".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
            return ""
    return ""


def compaction_item(node: Any, call_node: uuid.UUID | None = None) -> dict[str, Any]:
    """The output item for a compaction node (``storage.PathNode`` or row: ``id``, ``sent``)."""
    return {"type": "compaction", "id": f"cmp_{node.id.hex}", "encrypted_content": token(node.id, call_node),
            "summary": [{"type": "summary_text", "text": summary_of(list(node.sent))}]}
