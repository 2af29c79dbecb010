"""Storage invariants: what must hold in the database whatever happened (crashes, restarts,
upstream faults). Used by the fault tests and by ``branchpoint check``.

1. every head points to a node of its conversation's tree;
2. no successful turn/transform node without ``received``;
3. no pending node whose lease ran out longer ago than ``grace`` seconds (the reaper's job);
4. no conversation lease held by a node that is no longer pending (beyond ``grace``);
5. every head's assembled request is well paired (each tool call answered, each result called);
6. no node that no conversation of its tree reaches (a deleted conversation's nodes go unless a
   fork still reaches them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from storage import Database, OpsStore

from .assembly import Target, assemble

__all__ = ["Violation", "check_invariants"]

@dataclass(frozen=True)
class Violation:
    rule: str
    detail: str


def _paired(messages: list[dict[str, Any]]) -> str | None:
    """Independent of ``pair_check``: None if every assistant message's tool calls are answered by
    the tool messages right after it (and no tool message stands anywhere else), else what is wrong."""
    open_calls: set[Any] = set()
    in_run = False
    for m in messages:
        if m.get("role") == "tool":
            if not in_run or m.get("tool_call_id") not in open_calls:
                return f"tool result {m.get('tool_call_id')} not right after its call"
            open_calls.discard(m.get("tool_call_id"))
            continue
        if open_calls:
            return f"tool calls without results: {sorted(map(str, open_calls))}"
        calls = m.get("tool_calls") if m.get("role") == "assistant" else None
        open_calls = {tc.get("id") for tc in calls or ()}
        in_run = bool(open_calls)
    return f"tool calls without results: {sorted(map(str, open_calls))}" if open_calls else None


async def check_invariants(db: Database, *, grace: float = 30.0, assemble_heads: bool = True,
                           limit: int = 10_000) -> list[Violation]:
    ops = OpsStore(db)
    out: list[Violation] = []
    for r in await ops.heads_outside_tree():
        out.append(Violation("head_in_tree", f"conversation {r['id']!r} points at {r['head_node_id']}, not in its tree"))
    for r in await ops.successes_without_received():
        out.append(Violation("success_has_received", f"node {r['id']} ({r['conversation_id']}) succeeded without received"))
    for r in await ops.stale_pending(grace):
        out.append(Violation("no_stale_pending", f"node {r['id']} ({r['conversation_id']}) pending, lease ran out at {r['lease_until']}"))
    for r in await ops.stale_leases(grace):
        out.append(Violation("no_stale_lease", f"conversation {r['id']!r} leased to {r['lease_node_id']} long after expiry"))
    for r in await ops.unreached_nodes(limit):
        out.append(Violation("node_reached", f"node {r['id']} ({r['conversation_id']!r}: a deleted conversation's) "
                                             "is reached by no conversation of its tree"))
    if assemble_heads:
        for conversation_id, path in await ops.head_paths(limit):
            problem = _paired(assemble(path, [], Target(path[-1].provider or "" if path else "")).messages)
            if problem:
                out.append(Violation("assembly_paired", f"conversation {conversation_id!r}: {problem}"))
    return out
