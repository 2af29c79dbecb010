"""What a conversation id may be: 1-128 characters of ``A-Za-z0-9._:-``, not ``.`` or ``..`` --
checked wherever one comes in (a route's path or header, the command line's ``--as``)."""

from __future__ import annotations

import re

from .errors import InvalidConversationId

__all__ = ["valid_conversation_id"]

_CONVERSATION_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def valid_conversation_id(value: str, *, source: str) -> str:
    if not _CONVERSATION_ID.fullmatch(value) or value in (".", ".."):
        raise InvalidConversationId(
            f"invalid conversation id in {source}: 1-128 characters of A-Za-z0-9._:- expected (not . or ..)",
            param=source,
        )
    return value
