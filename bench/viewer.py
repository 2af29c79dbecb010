#!/usr/bin/env python3
"""The web viewer on a big tree: time to open a conversation of 1,000 nodes in 50 branches
(fetching tree and path, layout, drawing, the chat pane) and to draw its graph, as the viewer
measures them itself (``data-open-ms`` / ``data-render-ms`` on the graph's svg), in Debian's
chromium driven by Playwright. Goal: opened within one second.

    uv run python bench/viewer.py [--nodes 1000] [--branches 50] [--opens 7]
    uv run python bench/viewer.py --session [--nodes 1000] [--big 10]

``--session``: an agent's session instead -- one line of ``--nodes`` calls, every other one a tool
round, the tool results 2 KB each but ``--big`` of them 200 KB (imported straight into the
database): what opening a long coding-agent session costs with its results folded.

The tree is built through the chat API against the fast fake upstream; Branchpoint is pinned to
CPU 1, the fake upstream to CPU 0, chromium runs where the system puts it.
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
from _harness import KEY, Procs, arguments, log, postgres_dsn, shared_bench, start_stack, write_result
from tree_reads import build_branches

FLAGS = ["--no-sandbox", "--headless=new", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]


async def import_session(dsn: str, size: int, big: int) -> None:
    """An agent session of ``size`` nodes in one line, imported as conversation ``big``."""
    import uuid
    from datetime import UTC, datetime, timedelta

    from proxy.auth import key_hash
    from storage import AdminStore, open_database, transcript

    nodes, parent = [], None
    every = max(1, (size // 2) // max(1, big))
    for i in range(size):
        if i % 2 == 0:
            sent = [{"role": "user", "content": f"step {i}: read the next file"}]
            received = [{"role": "assistant", "content": None, "tool_calls": [
                {"id": f"call_{i}", "type": "function", "function": {"name": "read_file", "arguments": f'{{"path": "f{i}.py"}}'}}]}]
        else:
            size_kb = 200 if (i // 2) % every == 0 and (i // 2) // every < big else 2
            output = "".join(f"line {j:06d} of file {i}\n" for j in range(size_kb * 1024 // 24))
            sent = [{"role": "tool", "tool_call_id": f"call_{i - 1}", "content": output}]
            received = [{"role": "assistant", "content": f"read file {i}"}]
        start = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=i)
        node = {"id": str(uuid.UUID(int=i + 1)), "parent_id": parent, "kind": "turn", "outcome": "success",
                "sent": sent, "received": received, "created_at": start.isoformat(), "depth": i,
                "finished_at": (start + timedelta(milliseconds=500)).isoformat(), "model": "gpt-4o-mini",
                "provider": "fake", "params": {}, "usage": {"prompt_tokens": 100 + i, "completion_tokens": 5},
                "finish_reason": "stop", "error": None, "system_hash": None, "api": "chat",
                "compacted_from": None}
        nodes.append(node)
        parent = node["id"]
    keys = transcript.node_keys(nodes)
    for node in nodes:
        node.update(chain=keys[node["id"]].chain.hex(), answered=keys[node["id"]].answered)
    db = await open_database(dsn, min_size=1, max_size=1)
    try:
        await AdminStore(db).import_tree(f"t_{key_hash(KEY)[:32]}", "big", nodes, uuid.UUID(parent), 1)
    finally:
        await db.close()


def main() -> None:
    ap = arguments(__doc__, port=14009, up_port=18089)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--branches", type=int, default=50)
    ap.add_argument("--opens", type=int, default=7)
    ap.add_argument("--session", action="store_true", help="an agent session (see above)")
    ap.add_argument("--big", type=int, default=10, help="--session: tool results of 200 KB")
    args = ap.parse_args()
    from playwright.sync_api import expect, sync_playwright

    executable = os.environ.get("BRANCHPOINT_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not executable:
        sys.exit("no chromium: apt-get install chromium (or set BRANCHPOINT_CHROMIUM)")
    work = Path(tempfile.mkdtemp(prefix="bp-viewer-bench-"))
    procs = Procs()
    opened: list[float] = []
    drawn: list[float] = []
    try:
        _, proxy, _ = start_stack(procs, work, up_port=args.up_port, port=args.port, bench=shared_bench())
        t0 = time.time()
        if args.session:
            import asyncio

            asyncio.run(import_session(postgres_dsn(work / "data"), args.nodes, args.big))
            log(f"imported a session of {args.nodes} nodes ({args.big} results of 200 KB) in {time.time() - t0:.1f} s")
        else:
            with httpx.Client(base_url=proxy, headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as http:
                build_branches(http, "big", args.nodes, args.branches)
            log(f"built {args.nodes} nodes in {args.branches} branches in {time.time() - t0:.1f} s")
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=executable, args=FLAGS)
            page = browser.new_context(viewport={"width": 1500, "height": 900}).new_page()
            page.goto(f"{proxy}/ui/")
            page.fill("#key", KEY)
            page.click("form.signin button[type=submit]")
            expect(page.locator("table")).to_be_visible()
            page.goto(f"{proxy}/ui/#/c/big")
            for i in range(args.opens + 1):  # the first open warms the browser's caches: not counted
                page.reload()  # a fresh page each time (the key stays in the tab's sessionStorage)
                page.wait_for_function("() => document.querySelector('.graph svg')?.hasAttribute('data-open-ms')",
                                       timeout=30_000)
                svg = page.locator(".graph svg")
                assert svg.get_attribute("data-nodes") == str(args.nodes)
                if i:
                    opened.append(float(svg.get_attribute("data-open-ms")))
                    drawn.append(float(svg.get_attribute("data-render-ms")))
            browser.close()
    finally:
        procs.stop()
    result = {"nodes": args.nodes, "branches": None if args.session else args.branches, "opens": args.opens,
              "session": {"big_results": args.big} if args.session else None,
              "opened_ms": {"p50": round(statistics.median(opened), 1), "max": round(max(opened), 1)},
              "drawn_ms": {"p50": round(statistics.median(drawn), 1), "max": round(max(drawn), 1)}}
    print(json.dumps(result, indent=2))
    write_result(result, out=args.out)


if __name__ == "__main__":
    main()
