#!/usr/bin/env python3
"""PostgreSQL's share of a stored call, without HTTP: one connection makes begin + finish pairs
through ``TreeStore`` (as the call lifecycle does, path cache on) on 32 conversations with
20-node paths, and reports per pair the backend's CPU (from /proc/<pid>/schedstat), this
process's CPU (asyncpg and the store), and each server-side function's own time
(``track_functions = all``).

    uv run python bench/pg_calls.py [--pairs 2000] [--rounds 5]

Rounds are medianed: on a shared machine the CPU's speed drifts within seconds. To compare two
versions of a function, run this on each and compare ratios, or interleave rounds in one run.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _harness import arguments, write_result

from storage import migrate, start_embedded
from storage.database import Database
from storage.ids import uuid7
from storage.model import Outcome
from storage.pathcache import PathCache
from storage.transcript import digests
from storage.tree import CallFinish, CallStart, TreeStore


def backend_cpu_ns(pid: int) -> int:
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


async def turn(store: TreeStore, cid: str, i: int) -> None:
    sent = [{"role": "user", "content": f"question {i} " + "x" * 200}]
    node = uuid7()
    begun = await store.begin_call(CallStart(
        tenant="bench", conversation_id=cid, node_id=node, new_tree_id=uuid.uuid4(), kind="turn", mode="delta",
        parent_mode="head", parent_id=None, sent=sent, digests=digests(sent), prefixes=[], system_hash=None,
        lease_seconds=60, model="gpt-4o-mini", provider="default", params={"temperature": 0.5}))
    await store.finish_call(begun.tree_id, node, CallFinish(
        outcome=Outcome.SUCCESS, received=[{"role": "assistant", "content": f"answer {i} " + "y" * 300}],
        usage={"prompt_tokens": 10, "completion_tokens": 20, "total_tokens": 30}, finish_reason="stop", error=None,
        request_hash=b"\0" * 32, leased=True))


@dataclass
class Warm:
    """A store on one connection (``pid``: its backend) over 32 conversations with 20-node paths."""

    store: TreeStore
    db: Database
    pid: int
    cids: list[str]
    n: int = 0

    async def pair(self) -> None:
        """One more begin + finish pair, on the next conversation in turn."""
        await turn(self.store, self.cids[self.n % len(self.cids)], self.n)
        self.n += 1


@asynccontextmanager
async def warm_store(prefix: str) -> AsyncIterator[Warm]:
    """An embedded PostgreSQL, migrated, and a store whose paths, path cache and plan cache are warm."""
    server = start_embedded(tempfile.mkdtemp(prefix=prefix), delete_on_stop=True)
    try:
        await migrate(server.uri)
        db = await Database().open(server.uri, min_size=1, max_size=1)
        try:
            warm = Warm(TreeStore(db, PathCache(64 << 20)), db, await db.fetchval("SELECT pg_backend_pid()"),
                        [f"c{i}" for i in range(32)])
            for _ in range(20 * len(warm.cids)):
                await warm.pair()
            yield warm
        finally:
            await db.close()
    finally:
        server.stop()


async def measure(pairs: int, rounds: int) -> dict:
    async with warm_store("bp-pg-calls-") as warm:
        db = warm.db
        await db.execute("SET track_functions = 'all'")  # (one connection: this session is it)
        await db.execute("SELECT pg_stat_reset()")
        backend, client, wall = [], [], []
        for _ in range(rounds):
            b0, c0, w0 = backend_cpu_ns(warm.pid), time.process_time(), time.perf_counter()
            for _ in range(pairs // rounds):
                await warm.pair()
            k = pairs // rounds
            backend.append((backend_cpu_ns(warm.pid) - b0) / k / 1e6)
            client.append((time.process_time() - c0) / k * 1e3)
            wall.append((time.perf_counter() - w0) / k * 1e3)
        # the backend reports its statistics when it goes idle: ask for it, go idle once
        await db.execute("SELECT pg_stat_force_next_flush()")
        await db.execute("SELECT 1")
        functions = [dict(r) for r in await db.fetch(
            "SELECT funcname AS function, calls, round((self_time / calls * 1000)::numeric, 1)::float AS self_us, "
            "round((total_time / calls * 1000)::numeric, 1)::float AS total_us "
            "FROM pg_stat_user_functions WHERE calls > 0 ORDER BY self_time DESC")]
    return {"pairs": pairs, "rounds": rounds,
            "postgres_cpu_ms_per_pair": round(statistics.median(backend), 3),
            "client_cpu_ms_per_pair": round(statistics.median(client), 3),
            "wall_ms_per_pair": round(statistics.median(wall), 3),
            "rounds_postgres_cpu_ms": [round(x, 3) for x in backend],
            "functions": functions}


def main() -> None:
    ap = arguments(__doc__)
    ap.add_argument("--pairs", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    try:
        import uvloop
        result = uvloop.run(measure(args.pairs, args.rounds))
    except ImportError:
        result = asyncio.run(measure(args.pairs, args.rounds))
    print(json.dumps(result, indent=2))
    write_result(result, out=args.out)


if __name__ == "__main__":
    main()
