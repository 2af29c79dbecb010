"""When to compact and what stays raw -- pure functions over the settings and the path.

- ``Thresholds``: a model's input limit and the hard/soft thresholds as token counts, the
  summary budget, and context editing's threshold and least step (0: clearing off);
- ``Edits``: a call's own clearing of old tool results (Anthropic's ``clear_tool_uses`` edit,
  carried out by the proxy towards an upstream of another API), in place of the configured one;
- ``split_recent``: the older part (summarised) and the recent part (kept raw) of a path's items,
  never separating a tool call from its result.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from config import CompactionSettings, ContextEditingSettings, Settings

__all__ = ["Edits", "Limits", "Thresholds", "split_recent", "unanswered_tail_calls"]


def _role(item: Any) -> Any:
    return item.get("role") if isinstance(item, dict) else None


@dataclass(frozen=True, slots=True)
class Limits:
    input: int  # the model's input limit: context window less the reserved output
    hard: int  # above this, compact before the call
    soft: int  # after a turn above this, compact in the background
    summary_budget: int  # the most tokens a summary may take
    clear: int = 0  # above this, old tool results are cleared before a call (0: never)
    clear_at_least: int = 0  # ... when that frees at least this many tokens


@dataclass(frozen=True, slots=True)
class Edits:
    """A call's own clearing of old tool results, instead of ``[context_editing]``'s: above
    ``trigger_tokens`` input tokens, or above ``trigger_uses`` tool results in the context (one of
    the two), every result but the ``keep`` most recent and those of ``exclude`` is cleared --
    when that frees at least ``at_least`` tokens."""

    trigger_tokens: int | None = 100_000
    trigger_uses: int | None = None
    keep: int = 3
    at_least: int = 0
    exclude: frozenset[str] = frozenset()


class Thresholds:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.compaction: CompactionSettings = settings.compaction
        self.editing: ContextEditingSettings = settings.context_editing
        self.exclude_tools = frozenset(settings.context_editing.exclude_tools)
        self._limits: dict[str, Limits] = {}

    def limits(self, model: str) -> Limits:
        found = self._limits.get(model)
        if found is None:
            limit = self.settings.limits_for(model).input_limit
            c, e = self.compaction, self.editing
            found = Limits(limit, int(limit * c.hard), int(limit * c.soft), max(64, int(limit * c.summary_budget)),
                           int(limit * e.clear_tool_results), int(limit * e.clear_at_least))
            if len(self._limits) < 4096:  # model names come from clients: bounded
                self._limits[model] = found
        return found


def split_recent(items: Sequence[dict[str, Any]], keep: int,
                 pinned_calls: frozenset[Any] = frozenset()) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(older, recent): the last ``keep`` items stay raw, moved back so that no tool result is
    separated from the call it answers, and no call in ``pinned_calls`` (answered by items that
    come later, outside ``items``) leaves the raw part."""
    s = max(0, len(items) - keep)
    while True:
        calls_in_older: dict[Any, int] = {}
        for i in range(s):
            calls = items[i].get("tool_calls") if isinstance(items[i], dict) else None
            for call in calls or ():
                if isinstance(call, dict):
                    calls_in_older[call.get("id")] = i
        needed = [calls_in_older[c] for c in pinned_calls if c in calls_in_older]
        needed += [calls_in_older[item.get("tool_call_id")] for item in items[s:]
                   if _role(item) == "tool" and item.get("tool_call_id") in calls_in_older]
        if not needed:
            return list(items[:s]), list(items[s:])
        s = min(needed)


def unanswered_tail_calls(body: Sequence[dict[str, Any]]) -> frozenset[Any]:
    """Tool calls of the last assistant message that have no result yet (a turn between rounds)."""
    for item in reversed(body):
        if _role(item) == "assistant":
            answered = {i.get("tool_call_id") for i in body if _role(i) == "tool"}
            return frozenset(c.get("id") for c in item.get("tool_calls") or () if isinstance(c, dict)) - answered
    return frozenset()
