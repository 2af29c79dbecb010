"""The compactor: when a path grows too long, a compaction node replaces it -- ``kind =
compaction``, no parent, ``compacted_from`` = the node it replaces. Assembly stops at it; nothing
before it is deleted. Two methods (the node's ``params.method``):

- ``clear_tool_results`` (context editing: planned by ``clearing.py``, written by ``clearer.py``):
  the path's items with old tool results replaced by placeholders -- no model call, tried first;
- ``summary`` (``summaries.py``): the most recent system prompt, one summary message of the older
  part and the last ``keep_recent`` messages raw.

Each is written by one statement (``bp_apply_compaction``), so a process that stops mid-way leaves
no trace. When, in one place (docs/behaviour.md#compaction, #context-editing):
- ``before_started`` / ``before_call``: before a call whose estimated input is above
  ``clear_tool_results``, old tool results are cleared if that frees at least ``clear_at_least``;
  still above the hard threshold, the path is summarised -- synchronously; the call's node is hung
  under the new compaction node;
- ``after_turn`` (soft): after a successful turn above the soft threshold, summarised in the
  background (``background.BackgroundCompactions``) -- unless clearing before the next call will
  bring the path under it;
- ``compact_now`` (admin): ``POST /admin/conversations/{id}/compact`` (either method); not a head
  on a failed node (``head_failed``).
A failed summarisation changes nothing.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from typing import Any

from storage import ConversationRow, PathNode, StorageError, TreeStore, uuid7

from ..background import Background
from ..call import Started
from ..dialects import message_path
from ..errors import ConversationBusy
from ..metrics import Metrics
from ..tokens import TokenCounter, estimate_request, measured_context, off_loop
from . import clearing
from .background import BackgroundCompactions, Job
from .clearer import Clearer
from .policy import Edits, Thresholds
from .results import CompactionResult
from .summaries import Summaries
from .summariser import Summariser

__all__ = ["Compactor"]

log = logging.getLogger("branchpoint.compaction")


class Compactor:
    def __init__(self, *, tree: TreeStore, summariser: Summariser, thresholds: Thresholds, tokens: TokenCounter,
                 metrics: Metrics, tasks: Background, lease_seconds: float) -> None:
        self.tree = tree
        self.summariser = summariser
        self.thresholds = thresholds
        self.tokens = tokens
        self.metrics = metrics
        self.summaries = Summaries(tree=tree, summariser=summariser, thresholds=thresholds, tokens=tokens,
                                   metrics=metrics)
        self.clearer = Clearer(tree=tree, thresholds=thresholds, tokens=tokens, metrics=metrics,
                               provider=summariser.provider)
        self.jobs = BackgroundCompactions(self, tasks, give_up_after=max(30.0, lease_seconds))

    # -- the three triggers ---------------------------------------------------------------------

    def after_turn(self, *, tenant: str, conversation_id: str, tree_id: uuid.UUID, head: uuid.UUID, model: str,
                   usage: dict[str, Any] | None, client_key: str | None) -> bool:
        """After a successful turn: compact in the background if the context it measured is above
        the soft threshold -- or, when the upstream reported no usage (several OpenAI-compatible
        servers do not), if the path's estimate is, which the job finds first. Returns whether it
        asked for it. Never waits."""
        measured = measured_context(usage)
        if measured is not None and measured <= self.thresholds.limits(model).soft:
            return False
        self.jobs.request(Job(tenant, conversation_id, tree_id, head, model, client_key, measured=measured is not None))
        return True

    async def above_soft(self, path: list[PathNode], model: str) -> bool:
        """Whether the next call on ``path`` would carry more than the soft threshold, by the
        estimate (counting only when a bound found without tokenising is above it)."""
        soft = self.thresholds.limits(model).soft
        bound = estimate_request(self.tokens, path, (), upper_bound=True)
        if bound <= soft:
            return False
        return await off_loop(estimate_request, self.tokens, path, (), chars=bound // 4) > soft

    async def before_started(self, started: Started, path: list[PathNode]) -> list[PathNode]:
        """A started call's path: compacted first when the request would be above the hard
        threshold -- the call then hangs under the compaction node, whose path is just itself."""
        call = started.call
        if call.edits is not None:  # (the client's own edit: its answer says what came of it)
            call.applied_edits = []
        if not path:
            return path
        # how the compaction is applied: a delta turn holds the lease; other calls hold none
        apply_mode = call.kind if call.kind == "transform" or started.mode == "delta" else "full"
        compacted = await self.before_call(
            tenant=call.tenant, conversation_id=started.conversation_id, tree_id=started.tree_id,
            kind=apply_mode, path=path, new_items=started.new_items, model=call.body["model"],
            client_key=call.client_key, call_node=started.node_id,
            extra=[call.body[k] for k in ("tools", "functions") if call.body.get(k)],
            threshold=self._threshold(call), edits=call.edits,
        )
        if compacted is not None and compacted.compacted and compacted.node is not None:
            started.parent_id = compacted.node.id
            if compacted.method != clearing.METHOD:  # (a clearing is no summary a client's answer could show)
                call.compaction = compacted.node
            path = [compacted.node]
        if call.applied_edits is not None:
            # what the request carries cleared, as Anthropic counts what it cleared in each request
            # -- a clearing this call made, or one made before that the path goes on under; else a
            # clearing this call made and then summarised
            results, tokens = clearing.cleared_in(path)
            if not results and compacted is not None and compacted.compacted and compacted.clearing is not None:
                results, tokens = compacted.clearing.cleared_results, compacted.clearing.freed_tokens
            if results:
                call.applied_edits.append({"type": "clear_tool_uses_20250919", "cleared_tool_uses": results,
                                           "cleared_input_tokens": tokens})
        return path

    def _threshold(self, call: Any) -> int | None:
        """A call's own compaction threshold (None: the configured one): its client's
        ``compact_threshold``, held to the input limit when it asked for truncation "auto" --
        such a call is compacted rather than sent above what the model takes."""
        threshold = call.compact_threshold
        if call.truncation_auto and threshold is not None:
            threshold = min(threshold, self.thresholds.limits(call.body["model"]).input)
        return threshold

    async def before_retry(self, started: Started, path: list[PathNode], error: Any) -> list[PathNode] | None:
        """A call the upstream refused as too long for its context (Responses ``truncation:
        "auto"``): its path compacted now, whatever the thresholds say -- the call then hangs
        under the compaction node, and the refused attempt (``error``: its NodeError) is kept as a
        node of its own where it hung. None when nothing could be compacted."""
        if not path:
            return None
        call = started.call
        parent = started.parent_id
        apply_mode = call.kind if call.kind == "transform" or started.mode == "delta" else "full"
        result = await self.summaries.compact(tenant=call.tenant, conversation_id=started.conversation_id,
                                              tree_id=started.tree_id, path=path, model=call.body["model"],
                                              client_key=call.client_key, mode=apply_mode, trigger="hard",
                                              call_node=started.node_id, new_items=started.new_items)
        if not result.compacted or result.node is None:
            return None
        started.parent_id = result.node.id
        call.compaction = result.node
        try:  # (the retry goes ahead whether or not the database takes the record: the compaction is made)
            await self.tree.record_attempt(started.tree_id, started.node_id, parent, uuid7(), error,
                                           started.request_hash)
        except StorageError as exc:
            log.warning("the refused attempt was not recorded", extra={
                "node_id": str(started.node_id), "error": type(exc.__cause__ or exc).__name__})
        return [result.node]

    async def before_call(self, *, tenant: str, conversation_id: str, tree_id: uuid.UUID, kind: str,
                          path: list[PathNode], new_items: Sequence[dict[str, Any]], model: str,
                          client_key: str | None, call_node: uuid.UUID, extra: Sequence[Any] = (),
                          threshold: int | None = None, edits: Edits | None = None) -> CompactionResult | None:
        """Before a call: clear old tool results if the request would be above
        ``clear_tool_results`` (``edits``: the call's own trigger and clearing, instead) and that
        frees enough; then, if it would still be above the hard threshold (``threshold``: the
        call's own, in tokens, instead), summarise synchronously. Returns the compaction the call
        hangs under (None: none)."""
        if not path:
            return None
        limits = self.thresholds.limits(model)
        hard = limits.hard if threshold is None else threshold
        clear = limits.clear if edits is None else edits.trigger_tokens or 0
        by_uses = edits is not None and edits.trigger_uses is not None
        lowest = min(hard, clear) if clear else hard
        bound = estimate_request(self.tokens, path, new_items, extra, upper_bound=True)
        ready: CompactionResult | None = None
        # a summary the background made for this path, which the conversation overtook: the call
        # that continues from the head hangs under it (not a side call, whose head stays; not a
        # call with its own threshold, compacted only above it) -- and is then measured as any
        # call, the turns since and its own items on top of the summary
        if kind != "transform" and threshold is None and self.jobs.ready:
            ready = await self.jobs.use_ready(tenant=tenant, conversation_id=conversation_id, tree_id=tree_id,
                                              kind=kind, path=path, call_node=call_node)
            if ready is not None and ready.node is not None:
                path = [ready.node]
                bound = estimate_request(self.tokens, path, new_items, extra, upper_bound=True)
        if bound <= lowest and not by_uses:
            return ready  # far below: nothing to tokenise (proxy/tokens.py)
        # (the bound is 4 per character: a quarter of it, the characters to count at most)
        estimate = await off_loop(estimate_request, self.tokens, path, new_items, extra, chars=bound // 4)
        cleared: CompactionResult | None = None
        if (clear and estimate > clear) or (by_uses and self.clearer.results_in(path, new_items) > edits.trigger_uses):
            cleared = await self.clearer.clear(tenant=tenant, conversation_id=conversation_id, tree_id=tree_id,
                                               path=path, model=model, mode=kind, trigger="call", call_node=call_node,
                                               new_items=new_items, estimate=estimate, edits=edits)
            if cleared.compacted and cleared.node is not None:
                cleared.extra["estimate_before"] = estimate
                estimate -= cleared.freed_tokens
                path = [cleared.node]
            else:
                cleared = None
        if estimate <= hard:
            return cleared or ready
        alone = await off_loop(estimate_request, self.tokens, [], new_items, extra, chars=bound // 4)
        if alone > limits.input:
            # no summary can make room for this call's own items: summarising would only cost
            # (the upstream decides: a context overflow leaves the head where it was)
            self.metrics.compactions.labels("hard", "new_items_overflow").inc()
            log.info("compaction skipped: the call's new items alone overflow the input limit",
                     extra={"conversation_id": conversation_id, "estimate": alone})
            return cleared or ready
        taken = await self.jobs.take_over(tenant=tenant, conversation_id=conversation_id, tree_id=tree_id, kind=kind,
                                          path=path, call_node=call_node)
        if taken is not None:
            taken.extra["estimate_before"] = estimate
            taken.clearing = cleared
            return taken
        result = await self.summaries.compact(tenant=tenant, conversation_id=conversation_id, tree_id=tree_id,
                                              path=path, model=model, client_key=client_key, mode=kind,
                                              trigger="hard", call_node=call_node, new_items=new_items)
        result.extra["estimate_before"] = estimate
        if not result.compacted and (cleared is not None or ready is not None):
            return cleared or ready  # (the clearing, or the summary it used, stands: the call hangs under it)
        result.clearing = cleared
        return result

    async def compact_now(self, conv: ConversationRow, client_key: str | None, default_model: str,
                          method: str = "summary", keep_recent: int | None = None) -> CompactionResult:
        """``POST /admin/conversations/{id}/compact``: compact the head path now -- summarised
        (``keep_recent``: the messages kept raw, when not the configured number), or (``method =
        "clear_tool_results"``) every tool result but the most recent ``keep_tool_results`` cleared,
        whatever the thresholds say. Not a head on a failed node: its items are its retry's, which
        the retry rule hangs beside it -- compacted, they would reach the upstream twice (kept
        raw, and sent again), and left out, a call continuing after the failure would lose them
        (docs/behaviour.md#compaction)."""
        if conv.busy:
            raise ConversationBusy(f"conversation {conv.id!r} has a turn call in flight")
        if conv.head_node_id is None:
            return CompactionResult(False, "empty", method=method)
        path = message_path(await self.tree.path(conv.tree_id, conv.head_node_id, tenant=conv.tenant))
        if path and path[-1].status == "failed":
            return CompactionResult(False, "head_failed", method=method)
        model = next((n.model for n in reversed(path) if n.kind != "compaction" and n.model), None)
        model = model or self.thresholds.compaction.model or default_model
        if method == clearing.METHOD:
            result = await self.clearer.clear(tenant=conv.tenant, conversation_id=conv.id, tree_id=conv.tree_id,
                                              path=path, model=model, mode="admin", trigger="admin", everything=True)
        else:
            result = await self.summaries.compact(tenant=conv.tenant, conversation_id=conv.id, tree_id=conv.tree_id,
                                                  path=path, model=model, client_key=client_key, mode="admin",
                                                  trigger="admin", keep_recent=keep_recent)
        if not result.compacted and result.reason in ("moved", "busy"):
            raise ConversationBusy(f"conversation {conv.id!r} moved while compacting; retry")
        return result
