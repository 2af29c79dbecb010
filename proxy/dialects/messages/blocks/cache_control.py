"""``cache_control`` markers: those of the call being made, by position (``markers``), put back
on the assembled request with every earlier call's marker on an old block taken off
(``apply_markers``). Pure functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...chat.markers import unmarked

__all__ = ["MARKERS", "apply_markers", "markers"]

MARKERS = "_bp_cache_control"  # (in params) the call's cache_control markers, by position


# -- cache_control markers: the call's own, by position ----------------------------------------------


def markers(system: Any, messages: Sequence[Any]) -> list[list[Any]]:
    """Where the client put ``cache_control``: ``[message index from the end (0: the last; -1:
    the system field), block index, the marker]`` -- positions that hold in the assembled request
    too, whose last messages are the client's."""
    found: list[list[Any]] = []
    in_system = 0  # blocks of the system field so far (a string is one)
    if isinstance(system, list):
        for j, block in enumerate(system):
            if isinstance(block, dict) and block.get("cache_control") is not None:
                found.append([-1, j, block["cache_control"]])
        in_system = len(system)
    elif isinstance(system, str) and system:
        in_system = 1
    n = len(messages)
    leading = True  # system messages before any other go into the system field (``to_anthropic``)
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if leading and isinstance(message, dict) and message.get("role") == "system":
            if isinstance(content, list):
                for j, block in enumerate(content):
                    if isinstance(block, dict) and block.get("cache_control") is not None:
                        found.append([-1, in_system + j, block["cache_control"]])
                in_system += len(content)
            elif content:
                in_system += 1
            continue
        leading = False
        if isinstance(content, list):
            for j, block in enumerate(content):
                if isinstance(block, dict) and block.get("cache_control") is not None:
                    found.append([n - 1 - i, j, block["cache_control"]])
    return found


def apply_markers(system: Any, messages: list[dict[str, Any]], found: Sequence[Sequence[Any]]) -> Any:
    """The assembled request with exactly the call's markers: earlier calls' markers on old blocks
    removed (the provider allows only a few, and they would pin a stale prefix), the call's put back
    where the client had them. Returns the system field; ``messages`` are changed in place."""
    system = unmarked(system)
    if isinstance(system, str) and any(back == -1 for back, _, _ in found):
        system = [{"type": "text", "text": system}]
    for i, message in enumerate(messages):
        if isinstance(message.get("content"), list) and any(
                isinstance(b, dict) and "cache_control" in b for b in message["content"]):
            messages[i] = {**message, "content": unmarked(message["content"])}
    n = len(messages)
    for back, j, marker in found:
        if back == -1:
            if isinstance(system, list) and 0 <= j < len(system) and isinstance(system[j], dict):
                system[j] = {**system[j], "cache_control": marker}
            continue
        i = n - 1 - back
        if 0 <= i < n:
            content = messages[i].get("content")
            if isinstance(content, str) and j == 0:
                content = [{"type": "text", "text": content}]
            if isinstance(content, list) and 0 <= j < len(content) and isinstance(content[j], dict):
                content = list(content)
                content[j] = {**content[j], "cache_control": marker}
                messages[i] = {**messages[i], "content": content}
    return system
