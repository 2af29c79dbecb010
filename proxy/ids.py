"""What a conversation id may be: 1-128 characters of ``A-Za-z0-9._:-``, not ``.`` or ``..`` --
checked wherever one comes in (a route's path or header, the command line's ``--as``); and what a
conversation's metadata may be (the Conversations API's, and an import's)."""

from __future__ import annotations

import re
from typing import Any

from .errors import InvalidConversationId

__all__ = ["MAX_METADATA", "metadata_problem", "valid_conversation_id"]

_CONVERSATION_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def valid_conversation_id(value: str, *, source: str) -> str:
    if not _CONVERSATION_ID.fullmatch(value) or value in (".", ".."):
        raise InvalidConversationId(
            f"invalid conversation id in {source}: 1-128 characters of A-Za-z0-9._:- expected (not . or ..)",
            param=source,
        )
    return value


MAX_METADATA = 16  # metadata pairs; keys at most 64 characters, values at most 512 (OpenAI's)


def metadata_problem(value: Any) -> tuple[str, str] | None:
    """What is wrong with a conversation's metadata, as (the message, the field at fault) -- None
    when it is an object of at most ``MAX_METADATA`` string pairs within OpenAI's lengths."""
    if not isinstance(value, dict):
        return "metadata must be an object of string pairs", "metadata"
    if len(value) > MAX_METADATA:
        return f"metadata holds {len(value)} pairs; at most {MAX_METADATA}", "metadata"
    for k, v in value.items():
        if not isinstance(v, str) or len(k) > 64 or len(v) > 512:
            return "metadata keys are at most 64 characters and values strings of at most 512", f"metadata.{k}"
    return None
