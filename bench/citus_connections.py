#!/usr/bin/env python3
"""What a new connection's first call start costs on a Citus coordinator (docs/scaling.md, "No type
introspection on a new connection"): ``BEGIN_CALL`` with the path cache's known nodes sent as
``uuid[]`` (as before: asyncpg has no codec for it and runs its type introspection query on each new
connection) against sent as text and cast in SQL (``$2::text::uuid[]``, as now).

    uv run python bench/citus_connections.py [--rounds 10] [--connections 32]

A coordinator and two workers (../shared/citus/cluster.sh; ``branchpoint migrate`` and
``branchpoint distribute``, as bench/citus.py starts them), ``--connections`` conversations of three
turns each. Each round opens ``--connections`` new connections at once (the product's jsonb codecs
set, as its pool sets them) and has each start a call in its own conversation, knowing the head --
in a transaction rolled back, so nothing changes -- then once more on the same connection. The
rounds alternate the two forms. Figures: the first statement's milliseconds (prepare, any
introspection, run) and the second's, p50 and p90 over every connection of every round; how many
introspection queries asyncpg ran. Then the bare cost, without Branchpoint's statement: a new
connection's first ``SELECT cardinality($1::uuid[])`` against ``SELECT cardinality($1::text::uuid[])``
and ``SELECT $1::int``, one connection at a time and ``--connections`` at once (three rounds each).
Nothing else runs on the cluster meanwhile.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import arguments, log, write_result
from citus import Servers

from storage import queries
from storage.database import Database, _init_connection
from storage.ids import uuid7
from storage.model import Outcome
from storage.transcript import digests
from storage.tree import CallFinish, CallStart, TreeStore, _jsonb

TENANT = "t_bench"
NEW = queries.BEGIN_CALL
OLD = queries.BEGIN_CALL.replace("$2::text::uuid[]", "$2")
assert OLD != NEW


def _start(cid: str, text: str) -> CallStart:
    sent = [{"role": "user", "content": text}]
    return CallStart(tenant=TENANT, conversation_id=cid, node_id=uuid7(), new_tree_id=uuid.uuid4(), kind="turn",
                     mode="delta", parent_mode="head", parent_id=None, sent=sent, digests=digests(sent), prefixes=[],
                     system_hash=None, lease_seconds=60, model="bench", provider="default", params={})


async def seed(url: str, n: int) -> list[tuple[str, uuid.UUID]]:
    """``n`` conversations of three turns; (conversation, head) each."""
    db = await Database().open(url, min_size=1, max_size=4)
    try:
        store = TreeStore(db, batch=False)
        out = []
        for i in range(n):
            cid = f"bench-{i}-{uuid.uuid4().hex[:6]}"
            for turn in range(3):
                start = _start(cid, f"turn {turn}")
                begun = await store.begin_call(start)
                assert await store.finish_call(begun.tree_id, start.node_id, CallFinish(
                    outcome=Outcome.SUCCESS, received=[{"role": "assistant", "content": "a"}], usage=None,
                    finish_reason="stop", error=None, request_hash=None, leased=True))
            out.append((cid, start.node_id))
        return out
    finally:
        await db.close()


INTROSPECTIONS = 0
_original = asyncpg.connection.Connection._introspect_types


async def _counted(self, typeoids, timeout):  # type: ignore[no-untyped-def]
    global INTROSPECTIONS
    INTROSPECTIONS += 1
    return await _original(self, typeoids, timeout)


asyncpg.connection.Connection._introspect_types = _counted


async def one(url: str, sql: str, cid: str, head: uuid.UUID, as_text: bool) -> tuple[float, float]:
    conn = await asyncpg.connect(url)
    try:
        await _init_connection(conn)
        times = []
        for _ in range(2):
            known = queries.uuid_array([head]) if as_text else [head]
            tx = conn.transaction()
            await tx.start()
            try:
                t0 = time.perf_counter()
                rows = await conn.fetch(sql, _jsonb(_start(cid, "bench")), known)
                times.append((time.perf_counter() - t0) * 1000)
                assert rows and rows[-1]["parent_id"] == head
            finally:
                await tx.rollback()
        return times[0], times[1]
    finally:
        await conn.close()


def pct(values: list[float], q: float) -> float:
    return round(statistics.quantiles(values, n=100)[int(q) - 1], 1) if len(values) > 1 else round(values[0], 1)


async def measure(url: str, convs: list[tuple[str, uuid.UUID]], rounds: int) -> dict:
    global INTROSPECTIONS
    found: dict[str, dict] = {}
    for name in ("uuid[]", "text cast in SQL"):
        found[name] = {"first": [], "second": [], "introspections": 0}
    for r in range(rounds * 2):
        name = ("uuid[]", "text cast in SQL")[r % 2] if (r // 2) % 2 == 0 else ("text cast in SQL", "uuid[]")[r % 2]
        sql, as_text = (OLD, False) if name == "uuid[]" else (NEW, True)
        before = INTROSPECTIONS
        results = await asyncio.gather(*(one(url, sql, cid, head, as_text) for cid, head in convs))
        found[name]["introspections"] += INTROSPECTIONS - before
        found[name]["first"] += [a for a, _ in results]
        found[name]["second"] += [b for _, b in results]
        log(f"round {r + 1}: {name}: first p50 {statistics.median(a for a, _ in results):.1f} ms")
    out = {}
    for name, f in found.items():
        out[name] = {"connections": len(f["first"]), "introspection_queries": f["introspections"],
                     "first_statement_ms_p50": pct(f["first"], 50), "first_statement_ms_p90": pct(f["first"], 90),
                     "second_statement_ms_p50": pct(f["second"], 50), "second_statement_ms_p90": pct(f["second"], 90)}
    return out


async def _bare_one(url: str, sql: str, arg: object) -> float:
    conn = await asyncpg.connect(url)
    try:
        t0 = time.perf_counter()
        await conn.fetchval(sql, arg)
        return (time.perf_counter() - t0) * 1000
    finally:
        await conn.close()


async def bare(url: str, connections: int) -> dict:
    head = uuid.uuid4()
    forms = (("uuid[]", "SELECT cardinality($1::uuid[])", [head]),
             ("text cast in SQL", "SELECT cardinality($1::text::uuid[])", queries.uuid_array([head])),
             ("int (no array)", "SELECT $1::int", 1))
    out: dict = {}
    for at_once in (1, connections):
        for name, sql, arg in forms:
            values: list[float] = []
            for _ in range(3):
                values += await asyncio.gather(*(_bare_one(url, sql, arg) for _ in range(at_once)))
            out[f"{name}, {at_once} at once"] = {"connections": len(values), "first_statement_ms_p50": pct(values, 50),
                                                 "first_statement_ms_max": round(max(values), 1)}
            log(f"bare {name}, {at_once} at once: p50 {statistics.median(values):.1f} ms")
    return out


def main() -> None:
    ap = arguments(__doc__)
    ap.add_argument("--rounds", type=int, default=10, help="rounds of each form")
    ap.add_argument("--connections", type=int, default=32, help="new connections at once per round")
    ap.add_argument("--port", type=int, default=41432)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bp-citus-conn-") as work:
        servers = Servers("citus", Path(work), args.port)
        try:
            convs = asyncio.run(seed(servers.url, args.connections))
            figures = asyncio.run(measure(servers.url, convs, args.rounds))
            alone = asyncio.run(bare(servers.url, args.connections))
        finally:
            servers.stop()
    for name, f in figures.items():
        log(f"{name}: {f}")
    write_result({"rounds": args.rounds, "connections": args.connections, "forms": figures, "bare": alone,
                  "load_average_after": Path("/proc/loadavg").read_text().split()[:3]}, out=args.out)


if __name__ == "__main__":
    main()
