#!/usr/bin/env python3
"""Reading big trees: the admin path and tree of a conversation with 1,000 nodes on one branch,
and of one with 1,000 nodes in 50 branches; plus a chat call whose context is that 1,000-node
path, and the proxy's and PostgreSQL's CPU per call on it against a 20-node path; a full-history
call matched on a 100-node path (the client resends its 200 messages) and on the 1,000-node one
(2,000 messages); ``/auto/v1`` discovery of a 20-node conversation by its content; a retention
pass deleting 10 idle conversations of 100 nodes; the proxy's RSS before and after.

    uv run python bench/tree_reads.py [--nodes 1000] [--branches 50] [--reads 50] [--fill 10000000]

``--fill N`` first loads N other nodes (lines of 100 in N/100 conversations of another tenant)
with COPY, so the measured conversations live in a big table: compare a run with ``--fill
10000`` against one with ``--fill 10000000``.

Trees are built through the chat API against the fast fake upstream (about 5 s per 1,000 calls).
Latency is measured sequentially from this process (one request at a time), so it is the time
one reader waits; Branchpoint is pinned to CPU 1, the fake upstream to CPU 0.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import (
    KEY,
    MODEL,
    Procs,
    arguments,
    cpu_ticks,
    log,
    postgres_dsn,
    postgres_pids,
    shared_bench,
    start_stack,
    write_result,
)

FILL_LINE = 100  # nodes per filler conversation


def proc_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def _fill_rows(count: int):
    """Filler nodes and conversations: finished turns, lines of FILL_LINE, in tree order (so the
    load appends to most indexes, as live traffic does); ids time-ordered like uuid7."""
    import hashlib
    import uuid

    sent = json.dumps([{"role": "user", "content": "filler question " * 8}])
    received = json.dumps([{"role": "assistant", "content": "filler answer " * 12}])
    base = (int(time.time() * 1000) - 86_400_000) << 80 | 0x7 << 76 | 0b10 << 62
    node_rows, conv_rows = [], []
    for k in range(count // FILL_LINE):
        cid, parent = f"fill-{k}", None
        tree = uuid.UUID(hashlib.md5(f"4:fill{cid}".encode()).hexdigest())  # (bp_tree_of: where its name leads)
        for depth in range(FILL_LINE):
            n = k * FILL_LINE + depth
            node = uuid.UUID(int=base | (n // 4096) << 80 | (n % 4096) << 64 | n)
            chain = hashlib.sha256(node.bytes).digest()
            node_rows.append((tree, node, "fill", cid, parent, "turn", "success", sent, received, "gpt-4o-mini",
                              "default", depth, chain, True))
            parent = node
        conv_rows.append(("fill", cid, tree, parent))
        if len(node_rows) >= 100_000:
            yield node_rows, conv_rows
            node_rows, conv_rows = [], []
    if node_rows:
        yield node_rows, conv_rows


def fill(data_dir: Path, count: int) -> None:
    """COPY ``count`` filler nodes into the stack's database (triggers -- the foreign-key checks --
    off for the load: the rows are consistent by construction), then VACUUM ANALYZE."""
    import asyncio

    import asyncpg

    async def load() -> None:
        conn = await asyncpg.connect(postgres_dsn(data_dir))
        try:
            await conn.execute("SET session_replication_role = replica")
            done, t0 = 0, time.time()
            for nodes, convs in _fill_rows(count):
                await conn.copy_records_to_table(
                    "nodes", records=nodes,
                    columns=("tree_id", "id", "tenant", "conversation_id", "parent_id", "kind", "outcome", "sent",
                             "received", "model", "provider", "depth", "chain", "answered"))
                await conn.copy_records_to_table("conversations", records=convs,
                                                 columns=("tenant", "id", "tree_id", "head_node_id"))
                done += len(nodes)
                if done % 1_000_000 == 0:
                    log(f"fill: {done:,} nodes in {time.time() - t0:.0f} s")
            await conn.execute("RESET session_replication_role")
            await conn.execute("VACUUM ANALYZE nodes")
            await conn.execute("VACUUM ANALYZE conversations")
            # (the load's dirty pages written now: a checkpoint writing 10 GB under the first
            # measurements slowed them 3x)
            await conn.execute("CHECKPOINT")
            size = await conn.fetchval("SELECT pg_size_pretty(pg_total_relation_size('nodes'))")
            log(f"fill: {done:,} nodes loaded and analysed in {time.time() - t0:.0f} s; table with indexes {size}")
        finally:
            await conn.close()

    asyncio.run(load())


def history(http: httpx.Client, cid: str) -> list[dict]:
    """The messages a client that resends its history holds for ``cid``'s head path."""
    out: list[dict] = []
    for node in http.get(f"/admin/conversations/{cid}/path").json()["data"]:
        out.extend(m for m in node["sent"] if m.get("role") != "system")
        out.extend({"role": m["role"], "content": m.get("content")} for m in node.get("received") or ())
    return out


def full_history_call(http: httpx.Client, cid: str, reads: int) -> dict:
    """A side call resending ``cid``'s whole history (full-history mode): matched on its head,
    which it does not move."""
    body = {"model": MODEL, "messages": [*history(http, cid), {"role": "user", "content": "and so?"}]}
    headers = {"X-Conversation-Id": cid, "X-Context-Mode": "full", "X-Node-Kind": "transform"}
    r = http.post("/v1/chat/completions", headers=headers, json=body)
    r.raise_for_status()
    assert r.headers.get("x-context-matched") == str(len(body["messages"]) - 1), r.headers
    return {"messages": len(body["messages"]),
            **timed(http, "POST", "/v1/chat/completions", reads, headers=headers, json=body)}


def auto_discovery(http: httpx.Client, cid: str, reads: int) -> dict:
    """``/auto/v1``: the conversation found by what the client resends (a side call: nothing moves)."""
    body = {"model": MODEL, "messages": [*history(http, cid), {"role": "user", "content": "and so?"}]}
    headers = {"X-Node-Kind": "transform"}
    r = http.post("/auto/v1/chat/completions", headers=headers, json=body)
    r.raise_for_status()
    assert r.headers.get("x-conversation-id") == cid, r.headers
    return {"messages": len(body["messages"]),
            **timed(http, "POST", "/auto/v1/chat/completions", reads, headers=headers, json=body)}


def retention_pass(data_dir: Path, conversations: int = 10) -> dict:
    """A retention pass (``proxy.retention.prune``, as the serving process runs it) that finds
    ``conversations`` filler conversations of 100 nodes idle and deletes them; the rest of the
    table is recent."""
    import asyncio

    import asyncpg

    from proxy.retention import prune
    from storage import open_database
    from storage.ops import OpsStore

    async def go() -> dict:
        conn = await asyncpg.connect(postgres_dsn(data_dir))
        try:
            idle = [f"fill-{k}" for k in range(conversations)]
            await conn.execute("UPDATE conversations SET updated_at = now() - interval '400 days' WHERE tenant = 'fill' "
                               "AND id = ANY($1::text[])", idle)
            await conn.execute("UPDATE nodes n SET created_at = now() - interval '400 days', "
                               "finished_at = now() - interval '400 days' FROM conversations c "
                               "WHERE c.tenant = 'fill' AND c.id = ANY($1::text[]) AND n.tree_id = c.tree_id", idle)
        finally:
            await conn.close()
        db = await open_database(postgres_dsn(data_dir))
        try:
            t0 = time.perf_counter()
            done = await prune(OpsStore(db), 365, 100)
            ms = (time.perf_counter() - t0) * 1000
        finally:
            await db.close()
        return {"ms": round(ms, 1), "conversations": done.conversations, "nodes_deleted": done.deleted}

    return asyncio.run(go())


def turn(http: httpx.Client, cid: str, text: str, parent: str | None = None) -> str:
    headers = {"X-Conversation-Id": cid}
    if parent:
        headers["X-Parent-Node-Id"] = parent
    r = http.post("/v1/chat/completions", headers=headers,
                  json={"model": MODEL, "messages": [{"role": "user", "content": text}]})
    r.raise_for_status()
    return r.headers["x-node-id"]


def build_line(http: httpx.Client, cid: str, nodes: int) -> None:
    for i in range(nodes):
        turn(http, cid, f"turn {i}: a question of ordinary length about the quarterly sales figures")


def build_branches(http: httpx.Client, cid: str, nodes: int, branches: int) -> None:
    """``branches`` branches of nodes/branches nodes each: branch k is an edit hanging under a
    node of branch k-1 (at depth 7k mod its length) -- how a user who keeps editing grows a tree."""
    per = nodes // branches
    previous: list[str] = []
    for b in range(branches):
        parent = previous[(7 * b) % per] if previous else None
        current: list[str] = []
        for i in range(per):
            current.append(turn(http, cid, f"branch {b} turn {i}: an edited question about sales",
                                parent if i == 0 else None))
        previous = current


def timed(http: httpx.Client, method: str, url: str, reads: int, **kw) -> dict:
    samples, size = [], 0
    for _ in range(reads):
        t0 = time.perf_counter()
        r = http.request(method, url, **kw)
        samples.append((time.perf_counter() - t0) * 1000)
        r.raise_for_status()
        size = len(r.content)
    samples.sort()
    return {"p50_ms": round(statistics.median(samples), 2), "p95_ms": round(samples[int(len(samples) * 0.95) - 1], 2),
            "max_ms": round(samples[-1], 2), "bytes": size}


def cpu_per_call(http: httpx.Client, pid: int, data_dir: Path, cids: tuple[str, ...], calls: int) -> dict:
    """Proxy and PostgreSQL CPU per side call on the head of each conversation (a 20-node and the
    1,000-node path), interleaved in 4 rounds; medians."""
    hz = os.sysconf("SC_CLK_TCK")
    pg = postgres_pids(data_dir)
    samples: dict[str, list[tuple[float, float, float]]] = {c: [] for c in cids}
    body = {"model": MODEL, "messages": [{"role": "user", "content": "summarise"}]}
    for _ in range(4):
        for cid in cids:
            headers = {"X-Conversation-Id": cid, "X-Node-Kind": "transform"}
            for _ in range(10):  # warm: the path cache holds the path now
                http.post("/v1/chat/completions", headers=headers, json=body).raise_for_status()
            t0, c0, g0 = time.perf_counter(), cpu_ticks([pid]), cpu_ticks(pg)
            for _ in range(calls):
                http.post("/v1/chat/completions", headers=headers, json=body).raise_for_status()
            t1, c1, g1 = time.perf_counter(), cpu_ticks([pid]), cpu_ticks(pg)
            samples[cid].append(((t1 - t0) * 1000 / calls, (c1 - c0) * 1000 / hz / calls, (g1 - g0) * 1000 / hz / calls))
    return {cid: {k: round(statistics.median(s[i] for s in rows), 2)
                  for i, k in enumerate(("latency_ms", "proxy_cpu_ms", "postgres_cpu_ms"))}
            for cid, rows in samples.items()}


def main() -> None:
    ap = arguments(__doc__, port=14002, up_port=18081)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--branches", type=int, default=50)
    ap.add_argument("--reads", type=int, default=50)
    ap.add_argument("--fill", type=int, default=0, help="first COPY this many other nodes into the table")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bp-tree-bench-"))
    procs = Procs()
    results: dict = {"nodes": args.nodes, "branches": args.branches, "reads": args.reads, "fill": args.fill}
    try:
        _, proxy, px = start_stack(procs, work, up_port=args.up_port, port=args.port, bench=shared_bench())
        if args.fill:
            fill(work / "data", args.fill)
        rss_before = proc_rss_mb(px.pid)
        with httpx.Client(base_url=proxy, headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as http:
            t0 = time.time()
            build_line(http, "line", args.nodes)
            log(f"built a {args.nodes}-node line in {time.time() - t0:.1f} s")
            t0 = time.time()
            build_branches(http, "branches", args.nodes, args.branches)
            log(f"built {args.nodes} nodes in {args.branches} branches in {time.time() - t0:.1f} s")
            for cid in ("line", "branches"):
                info = http.get(f"/admin/conversations/{cid}").json()
                path = http.get(f"/admin/conversations/{cid}/path").json()["data"]
                results[cid] = {
                    "node_count": info["node_count"],
                    "path_length": len(path),
                    "path": timed(http, "GET", f"/admin/conversations/{cid}/path", args.reads),
                    "tree": timed(http, "GET", f"/admin/conversations/{cid}/tree", args.reads),
                    # a side call on the head: assembles the whole path, stores a node, head unmoved
                    "chat_call_on_head": timed(http, "POST", "/v1/chat/completions", args.reads,
                                               headers={"X-Conversation-Id": cid, "X-Node-Kind": "transform"},
                                               json={"model": MODEL, "messages": [{"role": "user", "content": "summarise"}]}),
                }
            build_line(http, "short", 20)
            build_line(http, "hundred", 100)
            results["cpu_per_call"] = cpu_per_call(http, px.pid, work / "data", ("short", "line"), args.reads)
            log(f"CPU per call: {results['cpu_per_call']}")
            results["full_history_call"] = {cid: full_history_call(http, cid, args.reads) for cid in ("hundred", "line")}
            log(f"full-history calls: {results['full_history_call']}")
            for i in range(20):  # (words of its own: the other conversations begin alike)
                turn(http, "found", f"found {i}: where did the quarterly figures come from")
            results["auto_discovery"] = auto_discovery(http, "found", args.reads)
            log(f"/auto/v1 discovery: {results['auto_discovery']}")
            if args.fill >= 10 * FILL_LINE:
                results["retention_pass"] = retention_pass(work / "data")
                log(f"retention pass: {results['retention_pass']}")
            results["proxy_rss_mb"] = {"before": rss_before, "after": proc_rss_mb(px.pid)}
    finally:
        procs.stop()
        shutil.rmtree(work, ignore_errors=True)  # (a 10-million-node database is ~20 GB)
    print(json.dumps(results, indent=2))
    write_result(results, suffix="fill" if args.fill else "", out=args.out)


if __name__ == "__main__":
    main()
