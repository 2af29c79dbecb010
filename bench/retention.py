#!/usr/bin/env python3
"""Retention at scale, without HTTP: an embedded PostgreSQL holding ``--conversations``
conversations of ``--nodes`` finished nodes each, half of them idle for 60 days; then one pass of
``proxy.retention.prune`` (30 idle days, the default batch of 50) -- how long it takes, how long
each batch's transaction holds its rows -- the dry run's count, and a second pass with nothing
left to do.

    uv run python bench/retention.py [--conversations 100000] [--nodes 10]
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _harness import arguments, write_result

from proxy.retention import prune
from storage import OpsStore, open_database

LOAD_CONVERSATIONS = """
INSERT INTO conversations (tenant, id, tree_id, created_at, updated_at)
SELECT 'bench', 'c' || g, bp_tree_of('bench', 'c' || g), now() - interval '90 days',
       now() - CASE WHEN g % 2 = 0 THEN interval '60 days' ELSE interval '1 day' END
  FROM generate_series(1, $1) g
"""

LOAD_NODES = """
INSERT INTO nodes (tree_id, id, tenant, conversation_id, parent_id, kind, outcome, sent, received, model, provider,
                   depth, chain, answered, created_at, finished_at)
SELECT cv.tree_id, gen_random_uuid(), cv.tenant, cv.id, NULL, 'turn', 'success',
       '[{"role": "user", "content": "a question of ordinary length about the quarterly sales"}]'::jsonb,
       '[{"role": "assistant", "content": "an answer of ordinary length about the quarterly sales"}]'::jsonb,
       'gpt-4o-mini', 'default', 0, sha256(convert_to(cv.id || '/' || k, 'UTF8')), true, cv.updated_at, cv.updated_at
  FROM conversations cv, generate_series(1, $1) k
"""


async def measure(conversations: int, nodes: int) -> dict:
    db = await open_database("", tempfile.mkdtemp(prefix="bp-retention-"), migrate_first=True, min_size=1,
                             max_size=2, command_timeout=3600)
    try:
        t0 = time.perf_counter()
        async with db.connection() as conn:
            await conn.execute(LOAD_CONVERSATIONS, conversations)
            await conn.execute(LOAD_NODES, nodes)
            await conn.execute("VACUUM ANALYZE conversations")
            await conn.execute("VACUUM ANALYZE nodes")
        out: dict = {"conversations": conversations, "nodes_each": nodes, "load_s": round(time.perf_counter() - t0, 1)}
        ops = OpsStore(db)
        cutoff = datetime.now(UTC) - timedelta(days=30)
        t0 = time.perf_counter()
        await ops.idle_candidates(cutoff, None, 5000)
        out["candidate_slice_ms"] = round((time.perf_counter() - t0) * 1000, 1)
        t0 = time.perf_counter()
        out["dry_run"] = dict(zip(("conversations", "nodes"), await ops.idle(cutoff), strict=True))
        out["dry_run_s"] = round(time.perf_counter() - t0, 2)
        marks: list[float] = []
        t0 = time.perf_counter()
        done = await prune(ops, 30, 50, on_batch=lambda _: marks.append(time.perf_counter()))
        seconds = time.perf_counter() - t0
        batches = sorted(b - a for a, b in zip([t0, *marks], marks, strict=False))
        out["pass"] = {"deleted_conversations": done.conversations, "deleted_nodes": done.deleted, "seconds": round(seconds, 2),
                       "conversations_per_s": round(done.conversations / seconds),
                       "nodes_per_s": round(done.deleted / seconds),
                       "batch_ms_p50": round(batches[len(batches) // 2] * 1000, 1),
                       "batch_ms_p99": round(batches[int(len(batches) * 0.99)] * 1000, 1),
                       "batch_ms_max": round(batches[-1] * 1000, 1)}
        t0 = time.perf_counter()
        again = await prune(ops, 30, 50)
        out["idle_pass"] = {"deleted_conversations": again.conversations, "ms": round((time.perf_counter() - t0) * 1000, 1)}
        return out
    finally:
        await db.close()


def main() -> None:
    ap = arguments(__doc__)
    ap.add_argument("--conversations", type=int, default=100_000)
    ap.add_argument("--nodes", type=int, default=10)
    args = ap.parse_args()
    result = asyncio.run(measure(args.conversations, args.nodes))
    print(json.dumps(result, indent=2))
    write_result(result, out=args.out)


if __name__ == "__main__":
    main()
