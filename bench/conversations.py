#!/usr/bin/env python3
"""What OpenAI's Conversations API costs on the tree (docs/behaviour.md#the-conversations-api):

1. listing the items of a conversation holding 1,000 items (p50): one page (``limit=100``) and
   every page (``limit=100`` ten times, ``after`` the last id), for 1,000 items added as 50 items
   nodes of 20 and as 1,000 nodes of one (a path 1,000 nodes deep);
2. the extra cost of a Responses call naming its conversation with ``conversation=`` over the
   same call under ``/c/<id>/v1`` (c=1, p50, alternating, side calls -- X-Node-Kind: transform --
   on a 20-turn path, so the path stays the same length);
3. deleting the first item of a conversation 100, 1,000 and 3,000 nodes deep (one item each):
   every node from the item's on is made anew, beside the old ones -- one delete each, its time
   (the proxy's work is linear in the nodes since 2026-12-05: it was quadratic).

    uv run python bench/conversations.py [--reps 300] [--skip-deletes]

Layout of bench/run.py: the fake upstream on CPU 0, Branchpoint on CPU 1.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import KEY, MODEL, Procs, arguments, log, shared_bench, start_stack, timed_post, write_result


def item(text: str) -> dict:
    return {"type": "message", "role": "user", "content": text}


def timed_get(http: httpx.Client, url: str, params: dict) -> tuple[float, dict]:
    t0 = time.perf_counter()
    r = http.get(url, params=params)
    r.raise_for_status()
    return (time.perf_counter() - t0) * 1000, r.json()


def listing(http: httpx.Client, cid: str, reps: int) -> dict:
    all_pages = []
    for rep in range(reps + 10):
        ms, page = timed_get(http, f"/v1/conversations/{cid}/items", {"limit": 100, "order": "asc"})
        assert len(page["data"]) == 100
        total, seen, after = ms, len(page["data"]), page["last_id"]
        while page["has_more"]:
            ms, page = timed_get(http, f"/v1/conversations/{cid}/items", {"limit": 100, "order": "asc", "after": after})
            total, seen, after = total + ms, seen + len(page["data"]), page["last_id"]
        assert seen == 1000, seen
        if rep >= 10:  # warm-up
            all_pages.append(total)
    return {"all_1000_p50_ms": round(statistics.median(all_pages), 3)}


def first_page(http: httpx.Client, cid: str, reps: int) -> float:
    samples = []
    for rep in range(reps + 10):
        ms, page = timed_get(http, f"/v1/conversations/{cid}/items", {"limit": 100, "order": "asc"})
        assert len(page["data"]) == 100
        if rep >= 10:
            samples.append(ms)
    return round(statistics.median(samples), 3)


def deletes(http: httpx.Client) -> list[dict]:
    out = []
    for nodes in (100, 1000, 3000):
        cid = http.post("/v1/conversations", json={"items": [item("item 0")]}).json()["id"]
        for i in range(1, nodes):
            http.post(f"/v1/conversations/{cid}/items", json={"items": [item(f"item {i}")]}).raise_for_status()
        first = http.get(f"/v1/conversations/{cid}/items", params={"limit": 1, "order": "asc"}).json()["data"][0]["id"]
        t0 = time.perf_counter()
        http.delete(f"/v1/conversations/{cid}/items/{first}").raise_for_status()
        row = {"nodes": nodes, "delete_ms": round((time.perf_counter() - t0) * 1000, 3)}
        log(f"delete the first item: {row}")
        out.append(row)
    return out


def main() -> None:
    ap = arguments(__doc__, port=14041, up_port=18096)
    ap.add_argument("--reps", type=int, default=300)
    ap.add_argument("--skip-deletes", action="store_true")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bp-conversations-bench-"))
    procs = Procs()
    figures: dict = {"reps": args.reps}
    try:
        _, proxy, _ = start_stack(procs, work, up_port=args.up_port, port=args.port, bench=shared_bench())
        with httpx.Client(base_url=proxy, headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as http:
            # 1. listing 1,000 items
            wide = http.post("/v1/conversations", json={"items": [item(f"item {i}") for i in range(20)]}).json()["id"]
            for n in range(1, 50):
                http.post(f"/v1/conversations/{wide}/items",
                          json={"items": [item(f"item {n * 20 + i}") for i in range(20)]}).raise_for_status()
            deep = http.post("/v1/conversations", json={}).json()["id"]
            for i in range(1000):
                http.post(f"/v1/conversations/{deep}/items", json={"items": [item(f"item {i}")]}).raise_for_status()
            for name, cid, nodes in (("50_nodes_of_20", wide, 50), ("1000_nodes_of_1", deep, 1000)):
                row = {"nodes": nodes, "page_of_100_p50_ms": first_page(http, cid, args.reps)}
                row.update(listing(http, cid, max(30, args.reps // 10)))
                figures[f"list_{name}"] = row
                log(f"{name}: {row}")

            # 2. conversation= against /c/<id>/v1
            named = http.post("/v1/conversations", json={}).json()["id"]
            prefixed = http.post("/v1/conversations", json={}).json()["id"]
            for i in range(20):
                for cid in (named, prefixed):
                    http.post(f"/c/{cid}/v1/responses", json={"model": MODEL, "input": f"turn {i}"}).raise_for_status()
            side = {"content-type": "application/json", "X-Node-Kind": "transform"}
            by_body = json.dumps({"model": MODEL, "input": "a side question", "conversation": named}).encode()
            by_path = json.dumps({"model": MODEL, "input": "a side question"}).encode()
            samples: dict[str, list[float]] = {"conversation": [], "prefix": []}
            for rep in range(args.reps + 20):
                a = timed_post(http, "/v1/responses", by_body, side)
                b = timed_post(http, f"/c/{prefixed}/v1/responses", by_path, side)
                if rep >= 20:
                    samples["conversation"].append(a)
                    samples["prefix"].append(b)
            row = {"conversation_p50_ms": round(statistics.median(samples["conversation"]), 3),
                   "prefix_p50_ms": round(statistics.median(samples["prefix"]), 3)}
            row["extra_ms"] = round(row["conversation_p50_ms"] - row["prefix_p50_ms"], 3)
            figures["conversation_vs_prefix"] = row
            log(str(row))

            # 3. deleting the first item of a deep conversation
            if not args.skip_deletes:
                figures["delete_first_item"] = deletes(http)
    finally:
        procs.stop()
    print(json.dumps(figures, indent=2))
    write_result(figures, out=args.out)


if __name__ == "__main__":
    main()
