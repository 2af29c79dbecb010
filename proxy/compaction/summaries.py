"""Summary compaction (docs/behaviour.md#compaction): ``Summaries`` summarises the older part of a
path -- the most recent system prompt, one summary message of the older part and the last
``keep_recent`` messages raw, fewer when they would not leave the summary room under the hard
threshold -- and writes that as a compaction node (``params.method = summary``, one statement:
``bp_apply_compaction``). ``prepare`` and ``write`` are apart so that a background job can summarise
while the conversation moves on, and a call can take its summary over (``background.py``). When to
summarise is the compactor's (``Compactor.before_call``, ``after_turn``, ``compact_now``). A failed
summarisation changes nothing.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from typing import Any

from storage import PathNode, TreeStore, uuid7

from ..assembly import Target, carried_items, uncarry
from ..dialects import summary_keys
from ..errors import UpstreamFailure
from ..metrics import Metrics
from ..tokens import TokenCounter, off_loop
from .policy import Thresholds, split_recent, unanswered_tail_calls
from .results import CompactionResult, Prepared
from .summariser import SUMMARY_PREFIX, Summariser, is_summary

__all__ = ["Summaries"]

log = logging.getLogger("branchpoint.compaction")

# a compaction node's params key naming the node a summary written again was first written as
# (``{"node_id": ...}``: an import renames it); such a node is no call of its own (the usage report)
REUSED = "reused_summary"

# what the summariser reads of any provider's answers (no reasoning, no opaque items); the items a
# compaction node keeps raw are carried whole instead (``assembly.carried``) and shaped for each
# later call's provider
_PORTABLE = Target("", accepts_reasoning=False)


def _role(item: Any) -> Any:
    return item.get("role") if isinstance(item, dict) else None


def _chars(tokens: TokenCounter, items: Sequence[Any]) -> int:
    """About how many characters counting ``items`` reads at most (for ``off_loop``): a quarter of
    the 4-per-character bound."""
    return tokens.messages(items, lambda text: len(text))


class Summaries:
    def __init__(self, *, tree: TreeStore, summariser: Summariser, thresholds: Thresholds, tokens: TokenCounter,
                 metrics: Metrics) -> None:
        self.tree = tree
        self.summariser = summariser
        self.thresholds = thresholds
        self.tokens = tokens
        self.metrics = metrics

    async def prepare(self, path: Sequence[PathNode], model: str, client_key: str | None, trigger: str,
                      new_items: Sequence[dict[str, Any]] = (), keep_recent: int | None = None) -> Prepared | str:
        """Summarise the older part of ``path``; returns what to write, or why not. ``keep_recent``:
        the messages kept raw, when not the configured number."""
        c = self.thresholds.compaction
        keep = c.keep_recent if keep_recent is None else keep_recent
        summariser = c.model or model
        limits = self.thresholds.limits(model)
        system, body = carried_items(path)
        pinned = frozenset(i.get("tool_call_id") for i in new_items if _role(i) == "tool") | unanswered_tail_calls(body)
        # what stays raw must leave room, under the hard threshold, for the summary, the system
        # prompt and this call's new items -- else the next call would compact again, and again
        fixed = await off_loop(self.tokens.messages, [*system, *new_items], chars=_chars(self.tokens, [*system, *new_items]))
        older, recent = await self._fit_recent(body, keep, pinned, limits.hard - limits.summary_budget - fixed)
        if all(is_summary(item) for item in older):  # nothing, or only the previous summary
            return "nothing_to_compact"
        # the summariser's own limits bound its requests and what it can write (a smaller model than
        # the conversation's is sent no more than it takes: chunked, and cut to that)
        own = self.thresholds.settings.limits_for(summariser)
        budget = max(64, min(limits.summary_budget, own.max_output_tokens))
        try:
            summary = await self.summariser.summarise([uncarry(m, _PORTABLE) for m in older], model=summariser, client_key=client_key,
                                                      budget=budget, input_limit=own.input_limit)
        except Exception as exc:
            if not isinstance(exc, UpstreamFailure):
                log.exception("summarisation failed")
            self.metrics.compactions.labels(trigger, "failed").inc()
            log.warning("summarisation failed; nothing compacted", extra={"error": getattr(exc, "message", str(exc))})
            return "summarisation_failed"
        self.metrics.observe_tokens(summary.usage)  # (spent, whether or not the summary is written)
        params = {
            "method": "summary",
            "format": "text",
            "trigger": trigger,
            "summariser_model": summariser,
            "keep_recent": keep,
            "summary_budget_tokens": budget,
            "summary_tokens": summary.tokens,
            "compacted_messages": len(older),
            "summariser_calls": summary.calls,
        }
        summary_message = {"role": "user", "content": SUMMARY_PREFIX + summary.text, **summary_keys(older)}
        return Prepared(system, summary_message, recent, summariser,
                        self.summariser.provider(summariser), params, summary.usage, summary.tokens, len(older),
                        summary.calls, summary.requests[0])

    async def _fit_recent(self, body: Sequence[dict[str, Any]], keep: int, pinned: frozenset[Any],
                          room: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """``split_recent``, with fewer items kept raw while they take more than ``room`` tokens: a
        giant message (a 30 MB paste, a huge tool result) among the last ``keep_recent`` is
        summarised -- cut to what the summariser takes -- instead of staying raw and holding the
        path above the threshold for good."""
        older, recent = split_recent(body, keep, pinned)
        while recent:
            if await off_loop(self.tokens.messages, recent, chars=_chars(self.tokens, recent)) <= room:
                break
            keep = min(keep, len(recent)) - 1
            if keep < 0:
                break
            shorter = split_recent(body, keep, pinned)
            if keep == 0 and len(shorter[1]) == len(recent):
                break  # (what is left is pinned: answered by this call's tool results)
            older, recent = shorter
        return older, recent

    async def write(self, prepared: Prepared, *, tenant: str, conversation_id: str, tree_id: uuid.UUID,
                    mode: str, trigger: str, compacted_from: uuid.UUID, later: Sequence[PathNode] = (),
                    call_node: uuid.UUID | None = None) -> CompactionResult:
        """Write the compaction node replacing the path up to ``compacted_from``: the summary,
        then raw the recent items and those of ``later`` nodes (added after the summarised path)."""
        system, extra = carried_items(later)
        system = system or prepared.system
        recent = [*prepared.recent, *extra]
        sent = [*system, prepared.summary, *recent]
        node_id = uuid7()
        params = {**prepared.params, "kept_messages": len(recent)}
        usage = prepared.usage or None
        if prepared.written is not None:
            # written again (a background summary the next call on the branch it left uses): paid
            # for once, so its usage stays with the first node; this one names it and is no call
            params[REUSED] = {"node_id": str(prepared.written)}
            usage = None
        outcome = await self.tree.apply_compaction(
            tenant=tenant, conversation_id=conversation_id, tree_id=tree_id, node_id=node_id,
            compacted_from=compacted_from, sent=sent, model=prepared.model, provider=prepared.provider,
            params=params, usage=usage,
            mode=mode, call_node=call_node, request=prepared.first_request,
        )
        if outcome != "ok":
            return CompactionResult(False, outcome)
        if prepared.written is None:
            prepared.written = node_id
        self.metrics.compactions.labels(trigger, "ok").inc()
        log.info("compacted", extra={"conversation_id": conversation_id, "node_id": str(node_id), "trigger": trigger,
                                     "compacted_messages": prepared.compacted, "summary_tokens": prepared.tokens})
        node = PathNode(id=node_id, parent_id=None, kind="compaction", status="success", sent=sent, received=None,
                        provider=prepared.provider, model=prepared.model, usage=usage,
                        compacted_from=compacted_from)
        return CompactionResult(True, node=node, summary_tokens=prepared.tokens, kept_messages=len(recent),
                                compacted_messages=prepared.compacted, calls=prepared.calls)

    async def compact(self, *, tenant: str, conversation_id: str, tree_id: uuid.UUID, path: Sequence[PathNode],
                      model: str, client_key: str | None, mode: str, trigger: str,
                      call_node: uuid.UUID | None = None, new_items: Sequence[dict[str, Any]] = (),
                      keep_recent: int | None = None) -> CompactionResult:
        """Summarise the older part of ``path`` and write the compaction node in one go (``mode``:
        turn, transform or admin -- see ``bp_apply_compaction``). Never raises for an upstream
        failure: the result says why nothing was compacted."""
        if not path:
            return CompactionResult(False, "empty")
        prepared = await self.prepare(path, model, client_key, trigger, new_items, keep_recent)
        if isinstance(prepared, str):
            return CompactionResult(False, prepared)
        result = await self.write(prepared, tenant=tenant, conversation_id=conversation_id, tree_id=tree_id,
                                  mode=mode, trigger=trigger, compacted_from=path[-1].id, call_node=call_node)
        if not result.compacted:
            self.metrics.compactions.labels(trigger, result.reason).inc()
            log.info("compaction not applied", extra={"conversation_id": conversation_id, "outcome": result.reason})
        return result
