"""Clearing old tool results (context editing, docs/behaviour.md#context-editing) as a compaction
node: ``Clearer`` plans a clearing off the event loop (``clearing.plan``, with the tool results it
has counted remembered), writes it (``params.method = clear_tool_results``, one statement:
``bp_apply_compaction``) when it frees at least ``clear_at_least`` of the model's input limit, and
tells the background jobs whether clearing before the next call will do instead of a summary
(``suffices``). When to clear is the compactor's (``Compactor.before_call``, ``compact_now``).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from storage import PathNode, TreeStore, uuid7

from ..metrics import Metrics
from ..tokens import TokenCounter, estimate_request, off_loop
from . import clearing
from .policy import Edits, Thresholds
from .results import CompactionResult

__all__ = ["Clearer"]

log = logging.getLogger("branchpoint.compaction")


def path_chars(path: Sequence[PathNode]) -> int:
    """About how many characters counting ``path`` reads at most (for ``off_loop``)."""
    return sum(len(m["content"]) if isinstance(m, dict) and isinstance(m.get("content"), str) else 100
               for n in path for m in [*n.sent, *(n.received or ())])


class Clearer:
    def __init__(self, *, tree: TreeStore, thresholds: Thresholds, tokens: TokenCounter, metrics: Metrics,
                 provider: Callable[[str], str]) -> None:
        self.tree = tree
        self.thresholds = thresholds
        self.tokens = tokens
        self.metrics = metrics
        self.provider = provider  # the provider a model is routed to (the node's ``provider``)
        self._counted: clearing.Memo = {}  # (tool results counted by earlier plans: ``clearing.plan``)

    async def plan(self, path: Sequence[PathNode], new_items: Sequence[dict[str, Any]] = (), *,
                   everything: bool = False, edits: Edits | None = None) -> clearing.Plan:
        """Which of ``path``'s tool results a clearing before a call sending ``new_items`` would
        replace, and the tokens that frees (``clearing.plan``; counted off the event loop when the
        results are large). ``edits``: the call's own ``keep`` and ``exclude``, not the configured."""
        keep = self.thresholds.editing.keep_tool_results if edits is None else edits.keep
        exclude = self.thresholds.exclude_tools if edits is None else edits.exclude
        chars = sum(len(m["content"]) if isinstance(m.get("content"), str) else 1_000
                    for node in path for m in node.sent if isinstance(m, dict) and m.get("role") == "tool")
        planning = partial(clearing.plan, keep=keep, exclude=exclude, count=self.tokens.message, everything=everything,
                           memo=self._counted)
        return await off_loop(planning, path, new_items, chars=chars)

    async def clear(self, *, tenant: str, conversation_id: str, tree_id: uuid.UUID, path: Sequence[PathNode],
                    model: str, mode: str, trigger: str, call_node: uuid.UUID | None = None,
                    new_items: Sequence[dict[str, Any]] = (), everything: bool = False,
                    estimate: int | None = None, edits: Edits | None = None) -> CompactionResult:
        """Clear ``path``'s old tool results and write that as a compaction node (``method =
        clear_tool_results``), in one go -- when it frees at least ``clear_at_least`` of the
        model's input limit (``everything``: whatever it frees; an admin's clearing; ``edits``:
        the call's own ``at_least``, ``keep`` and ``exclude``). ``mode`` as for
        ``Summaries.compact``. The result says why nothing was written."""
        if not path:
            return CompactionResult(False, "empty", method=clearing.METHOD)
        planned = await self.plan(path, new_items, everything=everything, edits=edits)
        if not planned.count:
            return self._not_cleared(trigger, "nothing_to_clear", conversation_id)
        at_least = self.thresholds.limits(model).clear_at_least if edits is None else edits.at_least
        if not everything and planned.freed < at_least:
            return self._not_cleared(trigger, "too_little_to_clear", conversation_id)
        node_id = uuid7()
        sent = [*planned.system, *planned.items]
        params: dict[str, Any] = {
            "method": clearing.METHOD,
            "format": "text",
            "trigger": trigger,
            "cleared_results": planned.count,
            "freed_tokens": planned.freed,
            "keep_tool_results": self.thresholds.editing.keep_tool_results if edits is None else edits.keep,
            "cleared": planned.cleared,
        }
        if edits is not None:
            params["requested"] = True  # (the call's own edit, not [context_editing]'s)
        if estimate is not None:
            params["estimate_before"] = estimate
        provider = self.provider(model)
        outcome = await self.tree.apply_compaction(
            tenant=tenant, conversation_id=conversation_id, tree_id=tree_id, node_id=node_id,
            compacted_from=path[-1].id, sent=sent, model=model, provider=provider, params=params, usage=None,
            mode=mode, call_node=call_node, request=None)
        if outcome != "ok":
            return self._not_cleared(trigger, outcome, conversation_id)
        self.metrics.compactions.labels(f"{trigger}_clear", "ok").inc()
        self.metrics.cleared_results.inc(planned.count)
        log.info("tool results cleared", extra={"conversation_id": conversation_id, "node_id": str(node_id),
                                                "trigger": trigger, "cleared": planned.count, "freed_tokens": planned.freed})
        node = PathNode(id=node_id, parent_id=None, kind="compaction", status="success", sent=sent, received=None,
                        provider=provider, model=model, usage=None, compacted_from=path[-1].id)
        return CompactionResult(True, node=node, method=clearing.METHOD, cleared_results=planned.count,
                                freed_tokens=planned.freed)

    @staticmethod
    def results_in(path: Sequence[PathNode], new_items: Sequence[dict[str, Any]]) -> int:
        """How many tool results not cleared yet a call sending ``new_items`` after ``path`` holds
        (an edit's ``tool_uses`` trigger: a clearing brings them down, as it does the tokens)."""
        _, items, origins, positions = clearing.path_with_origins(path)
        standing = sum(1 for r in clearing.tool_results(items, origins, positions) if not clearing.is_cleared(items[r.index]))
        return standing + sum(1 for i in new_items if isinstance(i, dict) and i.get("role") == "tool")

    def _not_cleared(self, trigger: str, reason: str, conversation_id: str) -> CompactionResult:
        self.metrics.compactions.labels(f"{trigger}_clear", reason).inc()
        if reason not in ("nothing_to_clear", "too_little_to_clear"):
            log.info("clearing not applied", extra={"conversation_id": conversation_id, "outcome": reason})
        return CompactionResult(False, reason, method=clearing.METHOD)

    async def suffices(self, path: Sequence[PathNode], model: str) -> bool:
        """Whether clearing before the next call will bring ``path`` under the soft threshold (so no
        summary is needed after a turn above it): the path is above ``clear_tool_results`` -- the
        next call will clear -- and its clearable results free enough."""
        limits = self.thresholds.limits(model)
        if not limits.clear:
            return False
        estimate = await off_loop(estimate_request, self.tokens, path, (), chars=path_chars(path))
        if estimate <= limits.clear:
            return False
        planned = await self.plan(path)
        return planned.freed >= limits.clear_at_least and estimate - planned.freed <= limits.soft
