#!/usr/bin/env python3
"""Bytes a new coding-agent session stores, with large repeated items stored once per tenant
(docs/architecture.md#shared-items) and without.

    uv run python bench/shared_items.py [--sessions 100] [--turns 10]

Two shapes of session, as the agents send them: Codex (Responses API, full history each call:
~18 KB of instructions as a developer item, ~19 KB of tool definitions) and Claude Code
(Messages API, full history: a ~7 KB system prompt, ~32 KB of tools). Each session makes
``--turns`` calls (a question, then tool rounds) against an in-process fake upstream speaking both
APIs. Branchpoint runs twice on a new embedded PostgreSQL each: ``share_items_above = 2048`` (the
default) and ``0`` (nothing shared). Reported: the bytes on disk of ``nodes`` and
``shared_items`` (tables, TOAST and indexes) after all sessions, per session, and the rows of
``shared_items``.
"""

from __future__ import annotations

import json
import random
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _harness import KEY, Procs, arguments, asgi_body, log, postgres_dsn, serve_in_thread, start_branchpoint, write_result

_WORDS = ["the", "agent", "must", "read", "files", "before", "editing", "them", "and", "run", "tests", "after", "every", "change", "keep", "diffs", "small", "prefer", "existing", "helpers", "never", "commit", "secrets", "explain", "each", "step", "to", "the", "user", "when", "a", "command", "fails", "look", "at", "its", "output", "and", "retry", "with", "a", "fix", "use", "the", "sandbox", "paths", "ask", "before", "deleting", "anything", "write", "clear", "commit", "messages", "follow", "repository", "conventions", "lint", "format", "type", "check", "document", "public", "functions"]


def prose(seed: int, chars: int) -> str:
    """Text that compresses about as well as a real prompt does (not a repeated phrase, which
    PostgreSQL's TOAST compression would shrink to nothing)."""
    rng = random.Random(seed)
    out: list[str] = []
    size = 0
    while size < chars:
        sentence = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(6, 16))).capitalize() + ". "
        out.append(sentence)
        size += len(sentence)
    return "".join(out)


INSTRUCTIONS = prose(1, 18_000)  # Codex's instructions, as a developer item
SYSTEM = prose(2, 7_000)  # Claude Code's system prompt
CODEX_TOOLS = [{"type": "function", "name": f"tool_{i}", "description": prose(10 + i, 2_400),
                "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}, "workdir": {"type": "string"}}}}
               for i in range(7)]  # ~19 KB
CLAUDE_TOOLS = [{"name": f"Tool{i}", "description": prose(30 + i, 2_600),
                 "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}} for i in range(12)]  # ~32 KB


class Fake:
    """Answers chat completions, Responses and Messages calls with a short text."""

    async def __call__(self, scope, receive, send) -> None:
        raw = await asgi_body(scope, receive, send)
        if raw is None:
            return
        path = scope["path"]
        if path.endswith("/responses"):
            body = {"id": "resp_x", "object": "response", "status": "completed", "model": "m", "output": [
                {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                 "content": [{"type": "output_text", "text": "Done.", "annotations": []}]}],
                "usage": {"input_tokens": 10, "output_tokens": 2, "total_tokens": 12}}
        elif path.endswith("/messages"):
            body = {"id": "msg_x", "type": "message", "role": "assistant", "model": "m", "stop_reason": "end_turn",
                    "content": [{"type": "text", "text": "Done."}], "usage": {"input_tokens": 10, "output_tokens": 2}}
        else:
            body = {"id": "c", "object": "chat.completion", "model": "m", "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "Done."}, "finish_reason": "stop"}]}
        data = json.dumps(body).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
        await send({"type": "http.response.body", "body": data})


def sessions(http: httpx.Client, count: int, turns: int) -> None:
    for s in range(count):
        codex = [{"type": "message", "role": "developer", "content": INSTRUCTIONS}]
        claude: list[dict] = []
        for t in range(turns):
            codex.append({"type": "message", "role": "user", "content": f"session {s} step {t}: run the tests"})
            r = http.post("/auto/v1/responses", headers={"session-id": f"codex-{s}"},
                          json={"model": "gpt-codex", "input": codex, "tools": CODEX_TOOLS, "store": False})
            r.raise_for_status()
            codex.append({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Done."}]})
            claude.append({"role": "user", "content": f"session {s} step {t}: fix the lint"})
            r = http.post("/auto/v1/messages", headers={"X-Claude-Code-Session-Id": f"claude-{s}"},
                          json={"model": "claude-x", "max_tokens": 100, "system": SYSTEM, "tools": CLAUDE_TOOLS,
                                "messages": claude})
            r.raise_for_status()
            claude.append({"role": "assistant", "content": [{"type": "text", "text": "Done."}]})


def measure(share: int, args, up_port: int) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"bp-shared-{share}-"))
    procs = Procs()
    upstream = f"http://127.0.0.1:{up_port}/v1"
    try:
        proxy, _ = start_branchpoint(procs, work, port=args.port, upstream_url=upstream,
                                     config=f"[database]\nshare_items_above = {share}\n"
                                            f'[[upstreams]]\nname = "codex"\nbase_url = "{upstream}"\n'
                                            'models = ["gpt-codex"]\napi = "responses"\n'
                                            f'[[upstreams]]\nname = "claude"\nbase_url = "{upstream}"\n'
                                            'models = ["claude-*"]\napi = "anthropic"\n'
                                            f'[[upstreams]]\nname = "rest"\nbase_url = "{upstream}"\nmodels = ["*"]\n')
        t0 = time.perf_counter()
        with httpx.Client(base_url=proxy, headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as http:
            sessions(http, args.sessions, args.turns)
        elapsed = time.perf_counter() - t0
        import asyncio

        import asyncpg

        async def sizes() -> dict:
            conn = await asyncpg.connect(postgres_dsn(work / "data"))
            try:
                await conn.execute("VACUUM ANALYZE nodes")
                await conn.execute("VACUUM ANALYZE shared_items")
                return {"nodes_bytes": await conn.fetchval("SELECT pg_total_relation_size('nodes')"),
                        "shared_items_bytes": await conn.fetchval("SELECT pg_total_relation_size('shared_items')"),
                        "node_rows": await conn.fetchval("SELECT count(*) FROM nodes"),
                        "shared_rows": await conn.fetchval("SELECT count(*) FROM shared_items"),
                        "sent_and_params_bytes": await conn.fetchval(
                            "SELECT sum(pg_column_size(sent) + pg_column_size(params)) FROM nodes")}
            finally:
                await conn.close()

        out = asyncio.run(sizes())
    finally:
        procs.stop()
    total = out["nodes_bytes"] + out["shared_items_bytes"]
    out.update(total_bytes=total, bytes_per_session=round(total / (2 * args.sessions)), seconds=round(elapsed, 1))
    return out


def main() -> None:
    ap = arguments(__doc__, port=14030, up_port=14031)
    ap.add_argument("--sessions", type=int, default=100)
    ap.add_argument("--turns", type=int, default=10)
    args = ap.parse_args()
    server = serve_in_thread(Fake(), args.up_port)
    results = {}
    try:
        for share in (2048, 0):
            results[f"share_items_above={share}"] = measure(share, args, args.up_port)
            log(f"share_items_above={share}: {json.dumps(results[f'share_items_above={share}'])}")
    finally:
        server.should_exit = True
    print(json.dumps(results, indent=2))
    write_result({"sessions": args.sessions, "turns": args.turns, "results": results}, out=args.out)


if __name__ == "__main__":
    main()
