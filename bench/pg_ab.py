#!/usr/bin/env python3
"""PostgreSQL's CPU per stored call, A against B, interleaved: two databases of one embedded
server, both migrated -- A as it is, B with a change applied (a SQL file: an index made partial, a
function's new body) -- and rounds of begin + finish pairs (as bench/pg_calls.py makes them: the
store, path cache on, 32 conversations with 20-node paths) alternate between them. Each round's
B/A ratio of the backend's CPU per pair, and their median: the machine's drift falls on both alike
(a ratio from two separate runs carries ±30 % here). A file with only `SELECT 1` measures the
noise itself (A/A).

    uv run python bench/pg_ab.py CHANGE.sql [--rounds 16] [--pairs 300]
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import asyncpg
from _harness import arguments, log, write_result
from pg_calls import Warm, backend_cpu_ns

from storage import migrate, start_embedded
from storage.database import Database
from storage.pathcache import PathCache
from storage.tree import TreeStore


async def _warm(uri: str) -> Warm:
    await migrate(uri)
    db = await Database().open(uri, min_size=1, max_size=1)
    return Warm(TreeStore(db, PathCache(64 << 20)), db, await db.fetchval("SELECT pg_backend_pid()"),
                [f"c{i}" for i in range(32)])


async def measure(change: str, rounds: int, pairs: int) -> dict:
    server = start_embedded(tempfile.mkdtemp(prefix="bp-pg-ab-"), delete_on_stop=True)
    try:
        conn = await asyncpg.connect(server.uri)
        try:
            await conn.execute("CREATE DATABASE bench_b")
        finally:
            await conn.close()
        parts = urlsplit(server.uri)
        b_uri = urlunsplit((parts.scheme, parts.netloc, "/bench_b", parts.query, parts.fragment))
        a = await _warm(server.uri)
        b = await _warm(b_uri)
        conn = await asyncpg.connect(b_uri)
        try:
            await conn.execute(change)
        finally:
            await conn.close()
        try:
            for w in (a, b):  # paths, path cache and plans warm
                for _ in range(20 * len(w.cids)):
                    await w.pair()
            cpu: dict[str, list[float]] = {"A": [], "B": []}
            for r in range(rounds):
                for name, w in (("A", a), ("B", b)) if r % 2 == 0 else (("B", b), ("A", a)):
                    t0 = backend_cpu_ns(w.pid)
                    for _ in range(pairs):
                        await w.pair()
                    cpu[name].append((backend_cpu_ns(w.pid) - t0) / pairs / 1e3)
                log(f"round {r + 1}: A {cpu['A'][-1]:.1f} us, B {cpu['B'][-1]:.1f} us per pair")
        finally:
            await a.db.close()
            await b.db.close()
    finally:
        server.stop()
    ratios = [y / x for x, y in zip(cpu["A"], cpu["B"], strict=True)]
    return {"rounds": rounds, "pairs_per_round": pairs,
            "a_us_per_pair_median": round(statistics.median(cpu["A"]), 1),
            "b_us_per_pair_median": round(statistics.median(cpu["B"]), 1),
            "b_over_a_median": round(statistics.median(ratios), 3),
            "b_over_a_range": [round(min(ratios), 3), round(max(ratios), 3)],
            "a_us": [round(x, 1) for x in cpu["A"]], "b_us": [round(x, 1) for x in cpu["B"]]}


def main() -> None:
    ap = arguments(__doc__)
    ap.add_argument("change", help="a SQL file applied to database B")
    ap.add_argument("--rounds", type=int, default=16)
    ap.add_argument("--pairs", type=int, default=300, help="begin + finish pairs per round and side")
    args = ap.parse_args()
    change = Path(args.change).read_text(encoding="utf-8")
    result = asyncio.run(measure(change, args.rounds, args.pairs))
    result["change"] = change
    log(f"B/A median {result['b_over_a_median']} (rounds {result['b_over_a_range'][0]}-{result['b_over_a_range'][1]})")
    write_result(result, out=args.out)


if __name__ == "__main__":
    main()
