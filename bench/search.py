#!/usr/bin/env python3
"""What the text-search index (migration 0021) costs per stored call, and what a search costs:

- stored calls, c=1, in blocks alternating with and without the index (dropped and made again
  between blocks): the p50 of each, and the index's bytes per node;
- the time of ``GET /admin/conversations?q=`` over what was stored.

    uv run python bench/search.py [--calls 600] [--words 60]

Layout of bench/run.py: the fake upstream on CPU 0, Branchpoint on CPU 1.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import asyncpg
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import KEY, MODEL, Procs, arguments, log, postgres_dsn, shared_bench, start_stack, write_result

INDEX = ("CREATE INDEX IF NOT EXISTS nodes_text_search ON nodes USING gin "
         "(bp_search_vector(sent, received))")  # (migration 0027)
VOCABULARY = [f"word{i}" for i in range(5000)]


async def sql(dsn: str, statement: str) -> object:
    conn = await asyncpg.connect(dsn)
    try:
        return await conn.fetchval(statement)
    finally:
        await conn.close()


def block(http: httpx.Client, n: int, words: int, start: int) -> list[float]:
    times = []
    for i in range(start, start + n):
        text = " ".join(random.choices(VOCABULARY, k=words))
        body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": text}]}).encode()
        t0 = time.perf_counter()
        http.post("/v1/chat/completions", content=body, headers={"content-type": "application/json",
                                                                 "X-Conversation-Id": f"search-{i % 50}"}).raise_for_status()
        times.append((time.perf_counter() - t0) * 1000)
    return times


def main() -> None:
    ap = arguments(__doc__, port=14032, up_port=18087)
    ap.add_argument("--calls", type=int, default=600)
    ap.add_argument("--words", type=int, default=60)
    args = ap.parse_args()
    random.seed(7)
    work = Path(tempfile.mkdtemp(prefix="bp-search-bench-"))
    procs = Procs()
    try:
        _, proxy, _ = start_stack(procs, work, up_port=args.up_port, port=args.port, bench=shared_bench())
        dsn = postgres_dsn(work / "data")
        samples: dict[str, list[float]] = {"with": [], "without": []}
        with httpx.Client(base_url=proxy, headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as http:
            block(http, 50, args.words, 0)  # warm-up
            per = max(20, args.calls // 6)
            done = 50
            for i in range(6):
                indexed = i % 2 == 0
                asyncio.run(sql(dsn, INDEX if indexed else "DROP INDEX IF EXISTS nodes_text_search"))
                samples["with" if indexed else "without"] += block(http, per, args.words, done)
                done += per
            asyncio.run(sql(dsn, INDEX))
            nodes = asyncio.run(sql(dsn, "SELECT count(*) FROM nodes"))
            index_bytes = asyncio.run(sql(dsn, "SELECT pg_relation_size('nodes_text_search')"))
            table_bytes = asyncio.run(sql(dsn, "SELECT pg_total_relation_size('nodes')"))
            searches = []
            for _ in range(50):
                t0 = time.perf_counter()
                http.get("/admin/conversations", params={"q": random.choice(VOCABULARY)}).raise_for_status()
                searches.append((time.perf_counter() - t0) * 1000)
        result = {
            "calls": done, "words_per_message": args.words, "nodes": nodes,
            "p50_ms_with_index": round(statistics.median(samples["with"]), 3),
            "p50_ms_without_index": round(statistics.median(samples["without"]), 3),
            "index_bytes_per_node": round(index_bytes / max(1, nodes), 1),
            "table_bytes_per_node": round(table_bytes / max(1, nodes), 1),
            "search_p50_ms": round(statistics.median(searches), 3),
        }
        result["added_ms_per_call"] = round(result["p50_ms_with_index"] - result["p50_ms_without_index"], 3)
        log(str(result))
    finally:
        procs.stop()
    print(json.dumps(result, indent=2))
    write_result(result, out=args.out)


if __name__ == "__main__":
    main()
