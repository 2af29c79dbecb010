#!/usr/bin/env python3
"""Full-history mode: what it saves, and what matching costs.

    uv run python bench/full_history.py [--turns 200] [--reps 200] [--conversations 10000] [--skip-ties]

Part 1 -- growth. A chat of ``--turns`` turns whose client resends its whole history each time
(X-Context-Mode: full), compaction on (the model limited to an 8,192-token window, as in
bench/compaction.py, with the same in-process fake LLM that reports usage counted with the
proxy's tokenizer). Reported per turn: bytes the client sent (cumulative) against bytes stored
(cumulative, the nodes' sent + received JSON), and tokens the client sent against tokens the
upstream received.

Part 2 -- matching cost. Conversations whose head paths hold 10, 100 and 1,000 messages; on each,
side calls (X-Node-Kind: transform, so the path stays the same) in delta mode (one new message),
the same delta call padded with whitespace to the full call's size (what the bytes cost by
themselves: reading them, and scanning them as JSON) and in full mode (the whole history + the new
message), interleaved, ``--reps`` each, one at a time. Reported: p50 latency of each and the
differences.

Part 3 -- flat in the tenant's size. Under /auto/v1 (conversation found by content, tenant-wide),
a full-mode side call matching a 100-message conversation, with 10 and then ``--conversations``
conversations in the tenant.

Part 4 -- ties in the tenant. Under /auto/v1, ``--conversations`` conversations that began
alike (one canned first question, answered alike: an app's fixed opener, an eval run), and a
full-mode side call continuing that opening: every one of them is a candidate, and the tie rule
(a node on its conversation's head path first) settles it. With 10 and then ``--conversations``
such conversations.

Parts 2 to 4 use the workplace's fast fake upstream and the layout of bench/run.py: fake
upstream on CPU 0, Branchpoint pinned to CPU 1, PostgreSQL moved to CPU 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _harness import KEY, MODEL, Procs, arguments, log, shared_bench, start_stack, timed_post, write_result
from compaction import MODEL as SMALL_MODEL
from compaction import SENTENCES, small_model_stack


def node_bytes(http: httpx.Client, cid: str) -> int:
    total = 0
    for node in http.get(f"/admin/conversations/{cid}/tree").json()["data"]:
        full = http.get(f"/admin/nodes/{node['id']}").json()
        total += len(json.dumps(full["sent"])) + len(json.dumps(full["received"] or []))
    return total


def growth(args: argparse.Namespace) -> dict:
    rows = []
    with small_model_stack(args.port, args.summary_ms, "bp-full-bench-") as (proxy, fake):
        counter = fake.counter
        headers = {"Authorization": f"Bearer {KEY}", "X-Conversation-Id": "long", "X-Context-Mode": "full"}
        with httpx.Client(base_url=proxy, headers=headers, timeout=120) as http:
            history = [{"role": "system", "content": "You are the team's analyst. Be precise with numbers."}]
            sent_bytes = 0
            for i in range(args.turns):
                history.append({"role": "user", "content": f"Turn {i}. " + " ".join(SENTENCES[(i + k) % 5] for k in range(6))})
                body = json.dumps({"model": SMALL_MODEL, "messages": history})
                sent_bytes += len(body)
                r = http.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
                r.raise_for_status()
                history.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]})
                point = i + 1
                if point in (1, 10, 25, 50, 100, 150, 200, args.turns) or point % 50 == 0:
                    rows.append({"turn": point, "client_bytes_cumulative": sent_bytes,
                                 "stored_bytes_cumulative": node_bytes(http, "long"),
                                 "client_tokens": counter.messages(history[:-1]) + 3,
                                 "upstream_tokens": fake.turn_tokens[-1],
                                 "matched": int(r.headers["x-context-matched"])})
                    log(f"turn {point}: {rows[-1]}")
                time.sleep(args.think_ms / 1000)
    return {"rows": rows, "summaries": fake.summaries}


def history_of(http: httpx.Client, cid: str) -> list[dict]:
    out = []
    for node in http.get(f"/admin/conversations/{cid}/path").json()["data"]:
        out += node["sent"] + (node["received"] if node["status"] == "success" and node["received"] else [])
    return out


def build(http: httpx.Client, cid: str, turns: int) -> None:
    for i in range(turns):
        r = http.post("/v1/chat/completions", headers={"X-Conversation-Id": cid},
                      json={"model": MODEL, "messages": [{"role": "user", "content": f"question {i} about the quarter"}]})
        r.raise_for_status()


def matching_cost(http: httpx.Client, reps: int) -> list[dict]:
    out = []
    for messages in (10, 100, 1000):
        cid = f"path-{messages}"
        build(http, cid, messages // 2)
        history = history_of(http, cid)
        assert len(history) == messages, len(history)
        side = {"role": "user", "content": "one more side question"}
        delta_body = json.dumps({"model": MODEL, "messages": [side]}).encode()
        full_body = json.dumps({"model": MODEL, "messages": [*history, side]}).encode()
        # the same delta call padded with whitespace to the full body's size: what moving (and
        # scanning) that many bytes costs by itself, whatever the mode
        padded_body = delta_body[:-1] + b" " * (len(full_body) - len(delta_body)) + b"}"
        base = {"content-type": "application/json", "X-Conversation-Id": cid, "X-Node-Kind": "transform"}
        delta, padded, full = [], [], []
        for _ in range(10):  # warm up
            timed_post(http, "/v1/chat/completions", delta_body, base)
            timed_post(http, "/v1/chat/completions", padded_body, base)
            timed_post(http, "/v1/chat/completions", full_body, {**base, "X-Context-Mode": "full"})
        for _ in range(reps):
            delta.append(timed_post(http, "/v1/chat/completions", delta_body, base))
            padded.append(timed_post(http, "/v1/chat/completions", padded_body, base))
            full.append(timed_post(http, "/v1/chat/completions", full_body, {**base, "X-Context-Mode": "full"}))
        row = {"history_messages": messages, "delta_p50_ms": round(statistics.median(delta), 3),
               "full_p50_ms": round(statistics.median(full), 3),
               "full_minus_delta_ms": round(statistics.median(full) - statistics.median(delta), 3),
               "delta_same_bytes_p50_ms": round(statistics.median(padded), 3),
               "full_minus_same_bytes_ms": round(statistics.median(full) - statistics.median(padded), 3),
               "full_request_bytes": len(full_body)}
        log(f"matching: {row}")
        out.append(row)
    return out


async def _many(proxy: str, key: str, count: int, start: int) -> None:
    async with httpx.AsyncClient(base_url=proxy, headers={"Authorization": f"Bearer {key}"}, timeout=60) as client:
        sem = asyncio.Semaphore(32)

        async def one(i: int) -> None:
            async with sem:
                r = await client.post("/auto/v1/chat/completions", json={
                    "model": MODEL, "messages": [{"role": "user", "content": f"unrelated chat number {i}"}]})
                r.raise_for_status()

        await asyncio.gather(*(one(i) for i in range(start, start + count)))


def _auto_p50(http: httpx.Client, body: bytes, headers: dict, reps: int) -> float:
    """The p50 of ``reps`` /auto/v1 calls of ``body``, after 10 not counted."""
    samples = []
    for rep in range(reps + 10):
        t0 = time.perf_counter()
        http.post("/auto/v1/chat/completions", content=body, headers=headers).raise_for_status()
        if rep >= 10:
            samples.append((time.perf_counter() - t0) * 1000)
    return round(statistics.median(samples), 3)


def tenant_scale(proxy: str, reps: int, conversations: int) -> list[dict]:
    key = f"sk-bench-tenant-{int(time.time())}"
    out = []
    with httpx.Client(base_url=proxy, headers={"Authorization": f"Bearer {key}"}, timeout=60) as http:
        build(http, "target", 50)
        history = history_of(http, "target")
        body = json.dumps({"model": MODEL, "messages": [*history, {"role": "user", "content": "side"}]}).encode()
        headers = {"content-type": "application/json", "X-Node-Kind": "transform"}
        made = 1
        for size in (10, conversations):
            asyncio.run(_many(proxy, key, size - made, made))
            made = size
            r = http.post("/auto/v1/chat/completions", content=body, headers=headers)
            assert r.headers["x-conversation-id"] == "target" and r.headers["x-context-matched"] == "100"
            row = {"conversations_in_tenant": size, "auto_p50_ms": _auto_p50(http, body, headers, reps)}
            log(f"tenant: {row}")
            out.append(row)
    return out


async def _alike(proxy: str, key: str, count: int, opening: list[dict]) -> None:
    async with httpx.AsyncClient(base_url=proxy, headers={"Authorization": f"Bearer {key}"}, timeout=60) as client:
        sem = asyncio.Semaphore(8)  # (calls alike in flight at once would join one conversation: the retry rule)

        async def one() -> None:
            async with sem:
                r = await client.post("/auto/v1/chat/completions", json={"model": MODEL, "messages": opening})
                r.raise_for_status()

        await asyncio.gather(*(one() for _ in range(count)))


def ties_scale(proxy: str, reps: int, conversations: int) -> list[dict]:
    key = f"sk-bench-ties-{int(time.time())}"
    opening = [{"role": "user", "content": "the app's canned opening question"}]
    out = []
    with httpx.Client(base_url=proxy, headers={"Authorization": f"Bearer {key}"}, timeout=60) as http:
        first = http.post("/auto/v1/chat/completions", json={"model": MODEL, "messages": opening}).json()
        answer = {"role": "assistant", "content": first["choices"][0]["message"]["content"]}
        body = json.dumps({"model": MODEL, "messages": [*opening, answer, {"role": "user", "content": "side"}]}).encode()
        headers = {"content-type": "application/json", "X-Node-Kind": "transform"}
        made = 1
        for size in (10, conversations):
            asyncio.run(_alike(proxy, key, size - made, opening))
            made = size
            r = http.post("/auto/v1/chat/completions", content=body, headers=headers)
            assert r.headers["x-context-matched"] == "2", r.headers
            row = {"conversations_alike": size, "auto_p50_ms": _auto_p50(http, body, headers, reps)}
            log(f"ties: {row}")
            out.append(row)
    return out


def main() -> None:
    ap = arguments(__doc__, port=14006, up_port=18083)
    ap.add_argument("--turns", type=int, default=200)
    ap.add_argument("--think-ms", type=float, default=300)
    ap.add_argument("--summary-ms", type=float, default=200)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--conversations", type=int, default=10000)
    ap.add_argument("--skip-growth", action="store_true")
    ap.add_argument("--skip-tenant", action="store_true")
    ap.add_argument("--skip-ties", action="store_true")
    args = ap.parse_args()
    results: dict = {}
    if not args.skip_growth:
        results["growth"] = growth(args)
    work = Path(tempfile.mkdtemp(prefix="bp-match-bench-"))
    procs = Procs()
    try:
        _, proxy, _ = start_stack(procs, work, up_port=args.up_port, port=args.port + 2, bench=shared_bench())
        with httpx.Client(base_url=proxy, headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as http:
            results["matching"] = matching_cost(http, args.reps)
        if not args.skip_tenant:
            results["tenant"] = tenant_scale(proxy, args.reps, args.conversations)
        if not args.skip_ties:
            results["ties"] = ties_scale(proxy, args.reps, args.conversations)
    finally:
        procs.stop()
    print(json.dumps(results, indent=2))
    write_result(results, out=args.out)


if __name__ == "__main__":
    main()
