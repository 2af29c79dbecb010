"""Measure a Codex CLI session through Branchpoint: bytes the client sent in total vs bytes stored.

    uv run python -m tests.clients.measure_codex [--turns 20] [--context-window 0]

A real ``codex exec`` (then ``codex exec resume --last`` for every later turn) with its default
tools, against a fake chat upstream on 127.0.0.1 that asks for a tool call (``exec_command``, run
for real by Codex) every other turn; an embedded PostgreSQL of its own. Between Codex and the
proxy a recording relay counts the request bytes Codex sent. Stored: the conversation's nodes --
their items (``sent`` + ``received``) and their ``params`` (the request's other fields: Codex's
~19 KB of tools) as PostgreSQL stores them (``pg_column_size``, after TOAST compression) and as
JSON text. Upstream tokens: what the fake upstream reported (its estimate: a token per 4 bytes of
messages); ``--context-window N`` gives the model that window, so compaction (soft 0.7, hard 0.9)
shows what it saves. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from config import load_settings
from proxy.app import create_app
from storage import migrate, start_embedded

from ..fakes import FakeUpstream, Reply, ServerThread
from ..helpers import tool_call
from .install import npm_bin
from .test_codex import CODEX_CONFIG

ANSWER = ("Done. I looked at the code and the change is in place; the tests pass. " * 4).strip()


class Recorder:
    """A relay that counts what the client sends (request bodies, as sent) before passing it on."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.bytes = 0
        self.requests = 0
        self.client: httpx.AsyncClient | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        if scope["method"] == "POST":
            self.bytes += len(body)
            self.requests += 1
        if self.client is None:
            self.client = httpx.AsyncClient(timeout=120)
        query = scope.get("query_string", b"").decode()
        url = self.target + scope["path"] + (f"?{query}" if query else "")
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in (b"host", b"content-length")]
        response = await self.client.send(self.client.build_request(scope["method"], url, headers=headers, content=body),
                                          stream=True)
        await send({"type": "http.response.start", "status": response.status_code, "headers": [
            (k, v) for k, v in response.headers.raw if k.lower() not in (b"content-length", b"transfer-encoding",
                                                                         b"content-encoding")]})
        async for chunk in response.aiter_bytes():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await response.aclose()
        await send({"type": "http.response.body", "body": b""})


async def _stored(url: str) -> dict[str, Any]:
    conn = await asyncpg.connect(url)
    try:
        row = await conn.fetchrow("""
            SELECT count(*) AS nodes, count(DISTINCT conversation_id) AS conversations,
                   sum(pg_column_size(sent)) + coalesce(sum(pg_column_size(received)), 0) AS items_bytes,
                   sum(octet_length(sent::text)) + coalesce(sum(octet_length(received::text)), 0) AS items_json_bytes,
                   sum(pg_column_size(params)) AS params_bytes, sum(octet_length(params::text)) AS params_json_bytes,
                   count(*) FILTER (WHERE kind = 'compaction') AS compactions
              FROM nodes""")
        return {k: int(v or 0) for k, v in dict(row).items()}
    finally:
        await conn.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--context-window", type=int, default=0, help="the model's context window (0: the default)")
    args = parser.parse_args()
    codex = npm_bin("codex")
    with tempfile.TemporaryDirectory(prefix="bp-measure-") as tmp:
        root = Path(tmp)
        server = start_embedded(root / "pg", delete_on_stop=True)
        try:
            asyncio.run(migrate(server.uri))
            upstream = FakeUpstream()
            for turn in range(args.turns):
                if turn % 2 == 0:
                    upstream.enqueue(Reply(content=None, tool_calls=[tool_call(
                        f"call_{turn}", "exec_command", json.dumps({"cmd": f"echo output of turn {turn}"}))]))
                upstream.enqueue(Reply(content=f"{ANSWER} (turn {turn})"))
            overrides: dict[str, Any] = {"database": {"url": server.uri, "pool_min": 1, "pool_max": 4},
                                         "server": {"log_level": "warning"}}
            if args.context_window:
                overrides["models"] = {"gpt-5-codex": {"context_window": args.context_window, "max_output_tokens": 1000}}
            with ServerThread(upstream) as fake:
                overrides["upstreams"] = [{"name": "fake", "base_url": fake.url + "/v1", "models": ["*"]}]
                with ServerThread(create_app(load_settings(env={}, overrides=overrides))) as proxy:
                    recorder = Recorder(proxy.url)
                    with ServerThread(recorder) as relay:
                        home = root / "home"
                        (home / ".codex").mkdir(parents=True)
                        (home / ".codex" / "config.toml").write_text(CODEX_CONFIG.format(base_url=f"{relay.url}/auto/v1"))
                        (home / "project").mkdir()
                        env = {"PATH": os.environ["PATH"], "HOME": str(home), "BRANCHPOINT_API_KEY": "sk-measure",
                               "NO_COLOR": "1"}
                        for turn in range(args.turns):
                            resume = ["resume", "--last"] if turn else []
                            done = subprocess.run([str(codex), "exec", "--skip-git-repo-check", *resume,
                                                   f"Turn {turn}: please make change number {turn}."],
                                                  cwd=home / "project", env=env, capture_output=True, text=True,
                                                  timeout=300)
                            if done.returncode != 0:
                                print(done.stdout[-2000:], done.stderr[-2000:], file=sys.stderr)
                                return 1
                        stored = asyncio.run(_stored(server.uri))
            turns = [r for r in upstream.chat_requests if not upstream.is_summariser(r)]
            report = {
                "turns": args.turns, "context_window": args.context_window or None,
                "client_requests": recorder.requests, "client_bytes_sent": recorder.bytes,
                "stored": stored,
                "stored_bytes": stored["items_bytes"] + stored["params_bytes"],
                "upstream_calls": len(turns),
                "upstream_prompt_tokens": sum(max(1, len(json.dumps(r.body.get("messages", []))) // 4) for r in turns),
                "upstream_bytes_received": sum(len(json.dumps(r.body)) for r in turns),
                "summariser_calls": len(upstream.summariser_requests),
            }
            print(json.dumps(report, indent=2))
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
