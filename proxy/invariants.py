"""Storage invariants: what must hold in the database whatever happened (crashes, restarts,
upstream faults). Used by the fault tests and by ``branchpoint check``.

1. every head points to a node of its conversation's tree;
2. no successful turn/transform node without ``received``;
3. no pending node whose lease ran out longer ago than ``grace`` seconds (the reaper's job);
4. no conversation lease held by a node that is no longer pending (beyond ``grace``);
5. every head's assembled request is well paired (each tool call answered, each result called).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from storage import Database, PathNode

from .assembly import Target, assemble

__all__ = ["Violation", "check_invariants"]

_HEADS_OUTSIDE_TREE = """
SELECT c.tenant, c.id, c.head_node_id FROM conversations c
 WHERE c.head_node_id IS NOT NULL
   AND NOT EXISTS (SELECT 1 FROM nodes n WHERE n.tree_id = c.tree_id AND n.id = c.head_node_id)
"""
_SUCCESS_WITHOUT_RECEIVED = """
SELECT id, conversation_id FROM nodes
 WHERE status = 'success' AND kind <> 'compaction' AND received IS NULL
"""
_STALE_PENDING = """
SELECT id, conversation_id, lease_until FROM nodes
 WHERE status = 'pending' AND lease_until < now() - make_interval(secs => $1)
"""
_STALE_LEASES = """
SELECT c.tenant, c.id, c.lease_node_id FROM conversations c
 WHERE c.lease_node_id IS NOT NULL AND c.lease_until < now() - make_interval(secs => $1)
"""
_HEADS = "SELECT tenant, id, tree_id, head_node_id FROM conversations WHERE head_node_id IS NOT NULL"
_PATH = "SELECT * FROM bp_path($1, $2)"


@dataclass(frozen=True)
class Violation:
    rule: str
    detail: str


def _paired(messages: list[dict[str, Any]]) -> str | None:
    """Independent of ``pair_check``: None if well paired, else what is wrong."""
    called: set[Any] = set()
    answered: set[Any] = set()
    for m in messages:
        if m.get("role") == "assistant":
            for tc in m.get("tool_calls") or ():
                called.add(tc.get("id"))
        elif m.get("role") == "tool":
            if m.get("tool_call_id") not in called:
                return f"tool result {m.get('tool_call_id')} without an earlier call"
            answered.add(m.get("tool_call_id"))
    missing = called - answered
    return f"tool calls without results: {sorted(map(str, missing))}" if missing else None


async def check_invariants(db: Database, *, grace: float = 30.0, assemble_heads: bool = True,
                           limit: int = 10_000) -> list[Violation]:
    out: list[Violation] = []
    for r in await db.fetch(_HEADS_OUTSIDE_TREE):
        out.append(Violation("head_in_tree", f"conversation {r['id']!r} points at {r['head_node_id']}, not in its tree"))
    for r in await db.fetch(_SUCCESS_WITHOUT_RECEIVED):
        out.append(Violation("success_has_received", f"node {r['id']} ({r['conversation_id']}) succeeded without received"))
    for r in await db.fetch(_STALE_PENDING, grace):
        out.append(Violation("no_stale_pending", f"node {r['id']} ({r['conversation_id']}) pending, lease ran out at {r['lease_until']}"))
    for r in await db.fetch(_STALE_LEASES, grace):
        out.append(Violation("no_stale_lease", f"conversation {r['id']!r} leased to {r['lease_node_id']} long after expiry"))
    if assemble_heads:
        for r in (await db.fetch(_HEADS))[:limit]:
            rows = await db.fetch(_PATH, r["tree_id"], r["head_node_id"])
            path = [PathNode(id=x["id"], parent_id=x["parent_id"], kind=x["kind"], status=x["status"], sent=x["sent"],
                             received=x["received"], provider=x["provider"]) for x in rows]
            problem = _paired(assemble(path, [], Target(path[-1].provider or "" if path else "")).messages)
            if problem:
                out.append(Violation("assembly_paired", f"conversation {r['id']!r}: {problem}"))
    return out
