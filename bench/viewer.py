#!/usr/bin/env python3
"""The web viewer on a big tree: time to open a conversation of 1,000 nodes in 50 branches
(fetching tree and path, layout, drawing, the chat pane) and to draw its graph, as the viewer
measures them itself (``data-open-ms`` / ``data-render-ms`` on the graph's svg), in Debian's
chromium driven by Playwright. Goal: opened within one second.

    uv run python bench/viewer.py [--nodes 1000] [--branches 50] [--opens 7]

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
from _harness import KEY, Procs, arguments, log, shared_bench, start_stack, write_result
from tree_reads import build_branches

FLAGS = ["--no-sandbox", "--headless=new", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]


def main() -> None:
    ap = arguments(__doc__, port=14009, up_port=18089)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--branches", type=int, default=50)
    ap.add_argument("--opens", type=int, default=7)
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
        with httpx.Client(base_url=proxy, headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as http:
            t0 = time.time()
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
    result = {"nodes": args.nodes, "branches": args.branches, "opens": args.opens,
              "opened_ms": {"p50": round(statistics.median(opened), 1), "max": round(max(opened), 1)},
              "drawn_ms": {"p50": round(statistics.median(drawn), 1), "max": round(max(drawn), 1)}}
    print(json.dumps(result, indent=2))
    write_result(result, out=args.out)


if __name__ == "__main__":
    main()
