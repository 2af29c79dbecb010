"""Context editing (docs/behaviour.md#context-editing): old tool results cleared -- no model call,
nothing lost (the originals stay on the tree) -- before anything is summarised.

Pure functions over a path read as chat messages (``dialects.message_path``):

- ``tool_results``: the tool results of a path's items, each with the tool that made it and the
  node that holds it;
- ``plan``: which of them a clearing would replace -- every result but the most recent
  ``keep_tool_results`` (counted over the path and the call's new items), those of
  ``exclude_tools`` and those already cleared -- and the path's items with each replaced by a
  placeholder naming the tool, its size and the node holding the original. Calls and results stay
  paired: only a result's content changes (and, where a dialect's own item stands behind the
  message -- a Responses ``function_call_output``, an Anthropic ``tool_result`` block --, that
  item's output: ``dialects.cleared_result``).

Whether to clear is the compactor's (``Compactor.before_call``; ``Clearer.clear`` in
``clearer.py``): only above ``clear_tool_results`` of the input limit, and only when the plan
frees at least ``clear_at_least`` of it -- so the request shrinks in steps and is otherwise a
byte-for-byte extension of the one before (provider prompt caches keep hitting between steps).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..assembly import PathLike, carried
from ..dialects import cleared_result

__all__ = ["METHOD", "PLACEHOLDER_PREFIX", "Plan", "ToolResult", "cleared_in", "is_cleared", "placeholder", "plan", "renamed",
           "tool_results"]

METHOD = "clear_tool_results"  # a clearing compaction node's ``params.method`` (a summary's: "summary")
PLACEHOLDER_PREFIX = "[Tool result cleared to save context"


def placeholder(tool: str | None, chars: int, tokens: int, node: uuid.UUID) -> str:
    """The text that stands for a cleared tool result."""
    name = f"`{tool}`" if tool else "a tool"
    return (f"{PLACEHOLDER_PREFIX}: {name} returned {chars:,} characters (about {tokens:,} tokens). "
            f"The original is kept by the proxy in node {node}.]")


def is_cleared(message: Any) -> bool:
    """Is this a tool result that a clearing already replaced?"""
    content = message.get("content") if isinstance(message, dict) else None
    return isinstance(content, str) and content.startswith(PLACEHOLDER_PREFIX)


_ORIGINAL_TOKENS = re.compile(r"\(about ([0-9,]+) tokens\)")


def cleared_in(path: Sequence[PathLike]) -> tuple[int, int]:
    """(tool results, their originals' tokens as their placeholders say): what a request assembled
    from ``path`` carries cleared -- a call's own edit as it stands in its request, which is what
    Anthropic's ``applied_edits`` count (it edits each request anew). Placeholders are a clearing
    node's, which only begins a path."""
    results = tokens = 0
    for node in path[:1]:
        if node.kind != "compaction":
            continue
        for message in carried(node)[1]:
            if is_cleared(message):
                results += 1
                said = _ORIGINAL_TOKENS.search(message["content"])
                tokens += int(said.group(1).replace(",", "")) if said else 0
    return results, tokens


_NODE_IN_PLACEHOLDER = re.compile(r" in node ([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\.\]$")


def renamed(value: Any, ids: dict[uuid.UUID, uuid.UUID]) -> Any:
    """``value`` (a clearing node's items or params) with the nodes its placeholders and its list
    of what was cleared name renamed by ``ids`` (an import gives every node a new id): the
    original stays one click away in the copy. Anything else is returned as it is."""
    def node(text: str) -> str:
        try:
            return str(ids.get(uuid.UUID(text), text))
        except ValueError:
            return text

    def walk(v: Any, key: Any = None) -> Any:
        if isinstance(v, str):
            if key == "node_id":
                return node(v)
            if v.startswith(PLACEHOLDER_PREFIX):
                return _NODE_IN_PLACEHOLDER.sub(lambda m: f" in node {node(m.group(1))}.]", v)
            return v
        if isinstance(v, list):
            return [walk(x) for x in v]
        if isinstance(v, dict):
            return {k: walk(x, k) for k, x in v.items()}
        return v

    return walk(value)


def _role(item: Any) -> Any:
    return item.get("role") if isinstance(item, dict) else None


def _chars(content: Any) -> int:
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(_chars(p.get("text")) if isinstance(p, dict) and isinstance(p.get("text"), str) else 0
                   for p in content)
    return 0


@dataclass(frozen=True, slots=True)
class ToolResult:
    index: int  # in the path's items (``Plan.items``)
    call_id: Any
    tool: str | None  # the name of the tool whose call it answers (None: not found)
    node: uuid.UUID  # the node on the path that holds it
    position: int = 0  # its place among that node's items


def tool_results(items: Sequence[dict[str, Any]], origins: Sequence[uuid.UUID],
                 positions: Sequence[int] | None = None) -> list[ToolResult]:
    """The tool results among ``items`` (``origins[i]``: the node item ``i`` came from,
    ``positions[i]``: its place there), oldest first, each with the name of the tool its call
    named."""
    names: dict[Any, str] = {}
    out: list[ToolResult] = []
    for i, item in enumerate(items):
        role = _role(item)
        if role == "assistant":
            for call in item.get("tool_calls") or ():
                if isinstance(call, dict) and isinstance(call.get("function"), dict):
                    name = call["function"].get("name")
                    key = call.get("id")
                    if isinstance(name, str) and isinstance(key, str | int):
                        names[key] = name
        elif role == "tool":
            key = item.get("tool_call_id")
            out.append(ToolResult(i, key, names.get(key) if isinstance(key, str | int) else None, origins[i],
                                  positions[i] if positions is not None else 0))
    return out


@dataclass(slots=True)
class Plan:
    """What a clearing would write: the path's system messages and items (with placeholders), the
    results it replaces and the tokens that frees."""

    system: list[dict[str, Any]]
    items: list[dict[str, Any]]
    cleared: list[dict[str, Any]] = field(default_factory=list)  # per result: tool, call id, node, chars, tokens
    freed: int = 0  # tokens

    @property
    def count(self) -> int:
        return len(self.cleared)


def path_with_origins(path: Sequence[Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[uuid.UUID], list[int]]:
    """(system messages, items, the node each item came from, its place among that node's items)
    of a path, as a compaction node keeps them (``assembly.carried``: answers whole, reasoning
    included, shaped for each later call's provider when sent -- a tool loop on a provider that
    wants its signed reasoning back goes on after a clearing)."""
    system: list[dict[str, Any]] = []
    items: list[dict[str, Any]] = []
    origins: list[uuid.UUID] = []
    positions: list[int] = []
    for node in path:
        node_system, node_items = carried(node)
        if node_system:
            system = node_system
        items.extend(node_items)
        origins.extend([node.id] * len(node_items))
        positions.extend(range(len(node_items)))
    return system, items, origins, positions


# a result's tokens by (its node, its place there, its size): a finished node never changes, so a
# result is tokenised once however many calls plan a clearing (its short placeholder is counted anew)
Memo = MutableMapping[tuple[uuid.UUID, int, int], int]
MEMO_ENTRIES = 100_000


def plan(path: Sequence[PathLike], new_items: Sequence[dict[str, Any]], *, keep: int, exclude: frozenset[str],
         count: Callable[[dict[str, Any]], int], everything: bool = False, memo: Memo | None = None) -> Plan:
    """The clearing of ``path`` before a call that sends ``new_items``: every tool result of the
    path but the ``keep`` most recent (counted over the path and ``new_items``), those of the tools
    in ``exclude`` and those already cleared, replaced by a placeholder. ``count``: a message's
    tokens. ``everything``: ``keep`` counts the path only (an admin's clearing, no call).
    ``memo``: what earlier plans counted (``Memo``), read and filled."""
    system, items, origins, positions = path_with_origins(path)
    results = tool_results(items, origins, positions)
    newer = 0 if everything else sum(1 for i in new_items if _role(i) == "tool")
    keep_in_path = max(0, keep - newer)
    clearable = results[:max(0, len(results) - keep_in_path)]
    out = Plan(system, list(items))
    for result in clearable:
        message = items[result.index]
        if is_cleared(message) or (result.tool is not None and result.tool in exclude):
            continue
        chars = _chars(message.get("content"))
        key = (result.node, result.position, chars)
        before = memo.get(key) if memo is not None else None
        if before is None:
            before = count(message)
            if memo is not None:
                if len(memo) >= MEMO_ENTRIES:
                    memo.clear()
                memo[key] = before
        text = placeholder(result.tool, chars, max(0, before - 3), result.node)  # (3: a message's framing)
        after_message = cleared_result(message, text)
        freed = before - count(after_message)
        if freed <= 0:  # a result shorter than its placeholder stays as it is
            continue
        out.items[result.index] = after_message
        out.freed += freed
        out.cleared.append({"tool": result.tool, "tool_call_id": result.call_id, "node_id": str(result.node),
                            "chars": chars, "tokens": freed})
    return out
