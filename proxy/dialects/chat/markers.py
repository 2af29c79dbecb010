"""A chat client's ``cache_control`` markers -- Anthropic's prompt caching as OpenAI-compatible
gateways (OpenRouter, LiteLLM) take it: on a content part, or on a message. The markers of the
call being made are recorded by position (``markers``, kept in the node's params) and put back on
the assembled messages, every marker an earlier call left on a stored message taken off
(``apply_markers``): a client that marks its newest message on every call sends the upstream one
marker, not one per turn so far (Anthropic refuses more than four). Pure functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["MARKERS", "apply_markers", "markers", "unmarked"]

MARKERS = "_bp_chat_cache_control"  # (in params) the call's cache_control markers, by position
MESSAGE = -1  # a marker's part index when it is on the message itself


def markers(messages: Sequence[Any]) -> list[list[Any]]:
    """Where the client put ``cache_control``: ``[where, part, marker]`` -- ``where`` a message's
    index from the end among the messages that are not system/developer ones (0: the last), or,
    for a system/developer message, ``-1 - k`` with ``k`` its index from the end among those;
    ``part`` the content part's index, or ``MESSAGE``. Positions that hold in the assembled
    request too: it ends with the client's messages, and its system messages in effect are the
    client's last ones, first (delta mode's system rule) or where the client had them (full
    history)."""
    found: list[list[Any]] = []
    systems = sum(1 for m in messages if type(m) is dict and m.get("role") in ("system", "developer"))
    others = len(messages) - systems
    seen_system = seen_other = 0
    for message in messages:
        if type(message) is not dict:
            seen_other += 1
            continue
        if message.get("role") in ("system", "developer"):
            where = -1 - (systems - 1 - seen_system)
            seen_system += 1
        else:
            where = others - 1 - seen_other
            seen_other += 1
        if message.get("cache_control") is not None:
            found.append([where, MESSAGE, message["cache_control"]])
        content = message.get("content")
        if type(content) is list:
            for j, part in enumerate(content):
                if type(part) is dict and part.get("cache_control") is not None:
                    found.append([where, j, part["cache_control"]])
    return found


def unmarked(parts: Any) -> Any:
    """Content parts without their ``cache_control`` markers: the same list when none has one."""
    if type(parts) is not list or not any(type(p) is dict and "cache_control" in p for p in parts):
        return parts
    return [{k: v for k, v in p.items() if k != "cache_control"} if type(p) is dict and "cache_control" in p else p
            for p in parts]


def _unmarked(message: dict[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    if (stripped := unmarked(content)) is not content:
        message = {**message, "content": stripped}
    if "cache_control" in message:
        message = {k: v for k, v in message.items() if k != "cache_control"}
    return message


def apply_markers(messages: Sequence[dict[str, Any]], found: Sequence[Sequence[Any]]) -> list[dict[str, Any]]:
    """The assembled messages with exactly the call's markers: earlier calls' markers on stored
    messages removed, the call's put back where the client had them (a marker on the first part of
    a message stored with string content: that string as a text part). A new list; the messages
    given (the path's, shared) are not changed."""
    out = [_unmarked(m) for m in messages]
    if not found:
        return out
    system = [i for i, m in enumerate(out) if m.get("role") in ("system", "developer")]
    others = [i for i, m in enumerate(out) if m.get("role") not in ("system", "developer")]
    for where, part, marker in found:
        among, back = (system, -1 - where) if where < 0 else (others, where)
        if not 0 <= back < len(among):
            continue
        i = among[len(among) - 1 - back]
        message = out[i]
        if part == MESSAGE:
            out[i] = {**message, "cache_control": marker}
            continue
        content = message.get("content")
        if type(content) is str and part == 0:
            content = [{"type": "text", "text": content}]
        if type(content) is list and 0 <= part < len(content) and type(content[part]) is dict:
            content = list(content)
            content[part] = {**content[part], "cache_control": marker}
            out[i] = {**message, "content": content}
    return out
