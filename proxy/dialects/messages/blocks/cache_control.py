"""``cache_control`` markers: those of the call being made, by position (``markers``), put back
on the assembled request with every earlier call's marker on an old block taken off
(``apply_markers``) -- on a message's blocks and on the blocks inside them alike (a tool result's
or a search result's content, a document's ``content`` source). Pure functions.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

__all__ = ["LIMIT", "MARKERS", "NO_SYSTEM", "apply_markers", "count", "markers"]

MARKERS = "_bp_cache_control"  # (in params) the call's cache_control markers, by position
NO_SYSTEM = "_bp_no_system"  # (in params) the call sent no system field: the stored one's markers stay
LIMIT = 4  # cache_control markers Anthropic accepts in one request


# -- cache_control markers: the call's own, by position ----------------------------------------------


def _inside(block: dict[str, Any]) -> Iterator[tuple[tuple[str, ...], list[Any]]]:
    """The blocks a block holds, by the keys that lead to them: a tool result's or a search
    result's ``content``, a document's ``content`` source."""
    if isinstance(block.get("content"), list):
        yield ("content",), block["content"]
    source = block.get("source")
    if isinstance(source, dict) and isinstance(source.get("content"), list):
        yield ("source", "content"), source["content"]


def _nested(block: dict[str, Any]) -> Iterator[tuple[list[Any], Any]]:
    """The markers inside a block: ``(the path to the block that has it, the marker)``."""
    for keys, inner in _inside(block):
        for k, b in enumerate(inner):
            if isinstance(b, dict):
                if b.get("cache_control") is not None:
                    yield [*keys, k], b["cache_control"]
                for path, marker in _nested(b):
                    yield [*keys, k, *path], marker


def _found(back: int, j: int, block: Any) -> list[list[Any]]:
    """A block's markers, its own and those inside it: ``[back, j, marker]``, ``[back, j, marker,
    path]`` (path: keys and indexes into the block, ``["content", 0]``)."""
    if not isinstance(block, dict):
        return []
    found = [[back, j, block["cache_control"]]] if block.get("cache_control") is not None else []
    return found + [[back, j, marker, path] for path, marker in _nested(block)]


def markers(system: Any, messages: Sequence[Any]) -> list[list[Any]]:
    """Where the client put ``cache_control``: ``[message index from the end (0: the last; -1:
    the system field), block index, the marker]``, and a fourth element, the path inside the
    block, for a marker on a block a block holds -- positions that hold in the assembled request
    too, whose last messages are the client's."""
    found: list[list[Any]] = []
    in_system = 0  # blocks of the system field so far (a string is one)
    if isinstance(system, list):
        for j, block in enumerate(system):
            found += _found(-1, j, block)
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
                    found += _found(-1, in_system + j, block)
                in_system += len(content)
            elif content:
                in_system += 1
            continue
        leading = False
        if isinstance(content, list):
            for j, block in enumerate(content):
                found += _found(n - 1 - i, j, block)
    return found


def _unmarked(block: Any) -> Any:
    """A block without ``cache_control``, nor any block inside it: the same block when none has one."""
    if not isinstance(block, dict):
        return block
    out = {k: v for k, v in block.items() if k != "cache_control"} if "cache_control" in block else block
    for keys, inner in _inside(block):
        stripped = _unmarked_all(inner)
        if stripped is not inner:
            out = {**out, "content": stripped} if keys == ("content",) else {
                **out, "source": {**out["source"], "content": stripped}}
    return out


def _unmarked_all(blocks: Any) -> Any:
    """Blocks without their markers (``_unmarked``): the same list when none has one."""
    if not isinstance(blocks, list):
        return blocks
    stripped = [_unmarked(b) for b in blocks]
    return blocks if all(a is b for a, b in zip(stripped, blocks, strict=True)) else stripped


def _marked(node: Any, path: Sequence[Any], marker: Any) -> Any:
    """``node`` with ``marker`` on the block at ``path`` inside it, copied along the way (the
    stored fragments are not changed); as it was when the path leads to no block."""
    if not path:
        return {**node, "cache_control": marker} if isinstance(node, dict) else node
    key, rest = path[0], path[1:]
    if isinstance(node, dict) and isinstance(key, str) and key in node:
        return {**node, key: _marked(node[key], rest, marker)}
    if isinstance(node, list) and type(key) is int and 0 <= key < len(node):
        return [*node[:key], _marked(node[key], rest, marker), *node[key + 1:]]
    return node


def count(value: Any) -> int:
    """The cache_control markers in a value (a request's other fields: its tools ...)."""
    if isinstance(value, dict):
        return (value.get("cache_control") is not None) + sum(count(v) for v in value.values())
    if isinstance(value, list):
        return sum(count(v) for v in value)
    return 0


def _system_kept(system: Any, budget: int) -> Any:
    """The stored system field with its own markers, the last ``budget`` of them (the others
    taken off): what a call that sends no system field goes on with."""
    if not isinstance(system, list):
        return system
    marked = [j for j, b in enumerate(system) if isinstance(b, dict) and b.get("cache_control") is not None]
    keep = set(marked[len(marked) - budget:]) if budget > 0 else set()
    if len(keep) == len(marked):
        return system
    return [b if j in keep or not isinstance(b, dict) else _unmarked(b) for j, b in enumerate(system)]


def apply_markers(system: Any, messages: list[dict[str, Any]], found: Sequence[Sequence[Any]],
                  keep_system: int = 0) -> Any:
    """The assembled request with exactly the call's markers: earlier calls' markers on old blocks
    removed, at every depth (the provider allows only a few, and they would pin a stale prefix),
    the call's put back where the client had them. ``keep_system``: the call sent no system
    field, and the stored one (the system rule's) keeps up to this many of the markers its client
    put on it -- a client that sends its system prompt only once keeps it cached. Returns the
    system field; ``messages`` are changed in place."""
    system = _system_kept(system, keep_system) if keep_system > 0 else _unmarked_all(system)
    if isinstance(system, str) and any(entry[0] == -1 for entry in found):
        system = [{"type": "text", "text": system}]
    for i, message in enumerate(messages):
        content = message.get("content")
        if (stripped := _unmarked_all(content)) is not content:
            messages[i] = {**message, "content": stripped}
    n = len(messages)
    for entry in found:
        back, j, marker = entry[0], entry[1], entry[2]
        path = entry[3] if len(entry) > 3 and isinstance(entry[3], list) else []
        if back == -1:
            if isinstance(system, list) and 0 <= j < len(system) and isinstance(system[j], dict):
                system[j] = _marked(system[j], path, marker)
            continue
        i = n - 1 - back
        if 0 <= i < n:
            content = messages[i].get("content")
            if isinstance(content, str) and j == 0 and not path:
                content = [{"type": "text", "text": content}]
            if isinstance(content, list) and 0 <= j < len(content) and isinstance(content[j], dict):
                content = list(content)
                content[j] = _marked(content[j], path, marker)
                messages[i] = {**messages[i], "content": content}
    return system
