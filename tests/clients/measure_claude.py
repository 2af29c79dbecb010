"""Measure a Claude Code session through Branchpoint: bytes the client sent in total vs bytes stored.

    uv run python -m tests.clients.measure_claude [--turns 20] [--screenshot docs/img/viewer-claude-code.png]

A real ``claude -p`` (then ``claude -p --continue`` for every later turn) with its default tools,
``ANTHROPIC_BASE_URL`` at ``/auto`` and its non-essential traffic off, against a fake chat upstream
on 127.0.0.1 that asks for a tool call (Bash ``echo``, run for real by Claude Code) every other
turn; an embedded PostgreSQL of its own. Between Claude Code and the proxy a recording relay
counts the request bytes it sent. Stored: the conversation's nodes -- their items (``sent`` +
``received``) and their ``params`` (the request's other fields: Claude Code's ~32 KB of tools) --
as PostgreSQL stores them (``pg_column_size``, after TOAST compression) and as JSON text; with
``--screenshot``, the viewer's picture of the session (Debian's chromium). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from config import load_settings
from proxy.app import create_app
from storage import migrate, start_embedded

from ..fakes import FakeUpstream, Reply, ServerThread
from ..helpers import tool_call
from .conftest import offline_env
from .measure_codex import Recorder, _stored
from .test_claude_code import OFFLINE, claude_bin

ANSWER = ("Done. I looked at the code and the change is in place; the tests pass. " * 4).strip()
KEY = "sk-ant-measure-0123456789"


def screenshot(proxy_url: str, conversation: str, path: Path) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox", "--headless=new"])
        page = browser.new_page(viewport={"width": 1500, "height": 1000})
        page.goto(f"{proxy_url}/ui/")
        page.fill("#key", KEY)
        page.click("form.signin button[type=submit]")
        page.wait_for_selector("table")
        page.goto(f"{proxy_url}/ui/#/c/{conversation}")
        page.wait_for_selector(".graph svg")
        page.locator(".graph [data-id]").last.click()
        page.wait_for_selector(".detail h3")
        page.screenshot(path=str(path))
        browser.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--screenshot", default=None, help="where to save the viewer's picture of the session")
    args = parser.parse_args()
    claude = claude_bin()
    with tempfile.TemporaryDirectory(prefix="bp-measure-claude-") as tmp:
        root = Path(tmp)
        server = start_embedded(root / "pg", delete_on_stop=True)
        try:
            asyncio.run(migrate(server.uri))
            upstream = FakeUpstream()
            for turn in range(args.turns):
                if turn % 2 == 0:
                    upstream.enqueue(Reply(content="Let me check.", tool_calls=[tool_call(
                        f"call_{turn}", "Bash", json.dumps({"command": f"echo output of turn {turn}",
                                                            "description": "print"}))]))
                upstream.enqueue(Reply(content=f"{ANSWER} (turn {turn})"))
            overrides = {"database": {"url": server.uri, "pool_min": 1, "pool_max": 4}, "server": {"log_level": "warning"}}
            seconds = []
            with ServerThread(upstream) as fake:
                overrides["upstreams"] = [{"name": "fake", "base_url": fake.url + "/v1", "models": ["*"]}]
                with ServerThread(create_app(load_settings(env={}, overrides=overrides))) as proxy:
                    recorder = Recorder(proxy.url)
                    with ServerThread(recorder) as relay:
                        home = root / "home"
                        (home / "project").mkdir(parents=True)
                        env = offline_env(home, ANTHROPIC_BASE_URL=f"{relay.url}/auto", ANTHROPIC_API_KEY=KEY, **OFFLINE)
                        for turn in range(args.turns):
                            resume = ["--continue"] if turn else []
                            t0 = time.perf_counter()
                            done = subprocess.run([str(claude), "-p", *resume, f"Turn {turn}: please make change number {turn}.",
                                                   "--allowedTools", "Bash(echo:*)"],
                                                  cwd=home / "project", env=env, capture_output=True, text=True, timeout=300)
                            seconds.append(time.perf_counter() - t0)
                            if done.returncode != 0:
                                print(done.stdout[-2000:], done.stderr[-2000:], file=sys.stderr)
                                return 1
                        stored = asyncio.run(_stored(server.uri))
                        conversations = asyncio.run(_conversations(server.uri))
                        if args.screenshot and len(conversations) == 1:
                            screenshot(proxy.url, conversations[0], Path(args.screenshot))
            turns = [r for r in upstream.chat_requests if not upstream.is_summariser(r)]
            report = {
                "turns": args.turns, "client": f"claude {subprocess.run([str(claude), '--version'], capture_output=True, text=True).stdout.strip()}",
                "client_requests": recorder.requests, "client_bytes_sent": recorder.bytes,
                "stored": stored, "stored_bytes": stored["items_bytes"] + stored["params_bytes"],
                "stored_json_bytes": stored["items_json_bytes"] + stored["params_json_bytes"],
                "conversations": len(conversations),
                "upstream_calls": len(turns),
                "upstream_bytes_received": sum(len(json.dumps(r.body)) for r in turns),
                "seconds_per_claude_run_p50": round(sorted(seconds)[len(seconds) // 2], 2),
            }
            print(json.dumps(report, indent=2))
        finally:
            server.stop()
    return 0


async def _conversations(url: str) -> list[str]:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        return [r["id"] for r in await conn.fetch("SELECT id FROM conversations ORDER BY created_at")]
    finally:
        await conn.close()


if __name__ == "__main__":
    sys.exit(main())
