#!/usr/bin/env python3
"""Soak: two Branchpoint processes on one PostgreSQL, 32 clients, a mixed load of turns (plain,
streamed, full-history), edits, transforms, head moves, switches, forks and deletes, for
``--seconds``, against an upstream that fails on purpose now and then.

    uv run python bench/soak.py [--seconds 60] [--clients 32]

The fake upstream (in this process) answers most calls, and otherwise: 500, 429, a context
overflow (400), a slow answer, garbage on a 200, a stream cut in the middle, a stream whose
events never end (cut by a small max_response_bytes), or an answer holding NUL characters.

Checked at the end, and printed as one JSON object:
- no 5xx made by the proxy itself (500 internal/storage errors, 503): upstream failures relayed
  or translated (502/504 with an upstream_* code, or the upstream's own status) are expected;
- ``branchpoint check`` finds no violated invariant;
- no node lost: every node id an answer ever named still exists, unless its conversation was
  deleted.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _harness import ROOT, Procs, arguments, asgi_body, log, serve_in_thread, start_branchpoint, write_result

MODEL = "gpt-4o-mini"
OWN_5XX = {"internal_error", "storage_error", "database_unavailable", "relay_error"}


class FaultyLLM:
    """ASGI app: chat completions, streamed or not, with scripted faults."""

    def __init__(self, seed: int) -> None:
        self.random = random.Random(seed)
        self.lock = threading.Lock()
        self.calls = collections.Counter()

    def pick(self) -> str:
        with self.lock:
            r = self.random.random()
        for name, p in (("500", 0.04), ("429", 0.03), ("overflow", 0.02), ("slow", 0.03), ("garbage", 0.02),
                        ("cut", 0.02), ("endless", 0.01), ("nul", 0.02)):
            if r < p:
                return name
            r -= p
        return "ok"

    async def __call__(self, scope, receive, send) -> None:
        body = await asgi_body(scope, receive, send)
        if body is None:
            return
        request = json.loads(body) if body else {}
        fault = self.pick()
        self.calls[fault] += 1
        stream = bool(request.get("stream"))

        async def respond(status: int, data: bytes, ctype: bytes = b"application/json") -> None:
            await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", ctype)]})
            await send({"type": "http.response.body", "body": data})

        if fault == "500":
            return await respond(500, b'{"error": {"message": "upstream fell over", "type": "server_error"}}')
        if fault == "429":
            return await respond(429, b'{"error": {"message": "slow down", "type": "rate_limit"}}')
        if fault == "overflow":
            return await respond(400, b'{"error": {"message": "maximum context length exceeded", '
                                      b'"code": "context_length_exceeded", "type": "invalid_request_error"}}')
        if fault == "garbage":
            return await respond(200, b"<html>not json</html>", b"text/html")
        if fault == "slow":
            await asyncio.sleep(0.3)
        content = "before\u0000after" if fault == "nul" else "an answer of ordinary length for the soak test"
        if not stream:
            data = {"id": "c", "object": "chat.completion", "model": MODEL,
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}
            return await respond(200, json.dumps(data).encode())
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        pieces = 2000 if fault == "endless" else 6
        for i in range(pieces):
            chunk = {"id": "c", "object": "chat.completion.chunk", "model": MODEL,
                     "choices": [{"index": 0, "delta": {"content": content[i % len(content):][:8] or "x"}, "finish_reason": None}]}
            await send({"type": "http.response.body", "body": b"data: " + json.dumps(chunk).encode() + b"\n\n", "more_body": True})
            if fault == "cut" and i == 2:
                raise ConnectionResetError("cut")
        final = {"id": "c", "object": "chat.completion.chunk", "model": MODEL,
                 "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                 "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}
        await send({"type": "http.response.body", "body": b"data: " + json.dumps(final).encode() + b"\n\ndata: [DONE]\n\n",
                    "more_body": False})


class Load:
    def __init__(self, proxies: list[str], seed: int) -> None:
        self.proxies = proxies
        self.random = random.Random(seed)
        self.keys = [f"sk-soak-tenant-{i}" for i in range(3)]
        self.conversations: dict[str, list[str]] = {}  # "key|cid" -> node ids seen
        self.deleted: set[str] = set()
        self.node_conv: dict[str, str] = {}
        self.statuses: collections.Counter = collections.Counter()
        self.own_5xx: list[str] = []
        self.ops: collections.Counter = collections.Counter()
        for key in self.keys:
            for i in range(20):
                self.conversations[f"{key}|soak-{i}"] = []

    def note(self, conv: str, response: httpx.Response, content: bytes | None = None) -> None:
        self.statuses[response.status_code] += 1
        body = response.content if content is None else content
        if response.status_code >= 500:
            try:
                code = json.loads(body)["error"]["code"]
            except (ValueError, KeyError, TypeError):
                code = None
            if response.status_code == 503 or code in OWN_5XX:
                self.own_5xx.append(f"{response.status_code} {code} {body[:200]!r}")
        elif b'"relay_error"' in body or b'"internal_error"' in body:  # a stream that failed on our side
            self.own_5xx.append(f"stream {body[-300:]!r}")
        node = response.headers.get("x-node-id")
        if node:
            self.node_conv[node] = conv
            self.conversations.setdefault(conv, []).append(node)

    async def one(self, client: httpx.AsyncClient) -> None:
        conv = self.random.choice(list(self.conversations))
        key, cid = conv.split("|")
        base = self.random.choice(self.proxies)
        auth = {"Authorization": f"Bearer {key}"}
        nodes = self.conversations[conv]
        op = self.random.choices(["turn", "stream", "full", "edit", "transform", "head", "switch", "fork", "delete"],
                                 [30, 15, 10, 10, 10, 6, 6, 4, 2])[0]
        self.ops[op] += 1
        chat = f"{base}/v1/chat/completions"
        message = {"model": MODEL, "messages": [{"role": "user", "content": f"{op} {self.random.random():.6f}"}]}
        if op in ("turn", "stream", "edit", "transform"):
            headers = {**auth, "X-Conversation-Id": cid}
            if op == "edit" and nodes:
                headers["X-Parent-Node-Id"] = self.random.choice(nodes)
            if op == "transform":
                headers["X-Node-Kind"] = "transform"
            if op == "stream":
                async with client.stream("POST", chat, headers=headers, json={**message, "stream": True}) as r:
                    content = b"".join([chunk async for chunk in r.aiter_bytes()])
                self.note(conv, r, content)
            else:
                self.note(conv, await client.post(chat, headers=headers, json=message))
        elif op == "full":
            path = await client.get(f"{base}/admin/conversations/{cid}/path", headers=auth)
            history = []
            if path.status_code == 200:
                for n in path.json()["data"]:
                    history += n["sent"] + (n["received"] or [] if n["status"] == "success" else [])
            headers = {**auth, "X-Conversation-Id": cid, "X-Context-Mode": "full"}
            self.note(conv, await client.post(chat, headers=headers, json={**message, "messages": history + message["messages"]}))
        elif op in ("head", "switch") and nodes:
            node = self.random.choice(nodes)
            if op == "head":
                r = await client.put(f"{base}/admin/conversations/{cid}/head", headers=auth, json={"node_id": node})
            else:
                r = await client.post(f"{base}/admin/conversations/{cid}/switch", headers=auth, json={"node_id": node})
            self.note(conv, r)
        elif op == "fork":
            new = f"{cid}.f{self.random.randrange(10**9)}"
            r = await client.post(f"{base}/admin/conversations/{cid}/fork", headers=auth, json={"conversation_id": new})
            self.note(conv, r)
            if r.status_code == 200 and len(self.conversations) < 400:
                self.conversations[f"{key}|{new}"] = []
        elif op == "delete":
            r = await client.delete(f"{base}/admin/conversations/{cid}", headers=auth)
            self.note(conv, r)
            if r.status_code == 200:
                self.deleted.add(conv)


async def drive(load: Load, clients: int, seconds: float) -> None:
    deadline = time.monotonic() + seconds

    async def client_loop() -> None:
        async with httpx.AsyncClient(timeout=60) as client:
            while time.monotonic() < deadline:
                try:
                    await load.one(client)
                except httpx.HTTPError as exc:  # a client-side failure: recorded, never hidden
                    load.statuses[f"client {type(exc).__name__}"] += 1

    await asyncio.gather(*(client_loop() for _ in range(clients)))


def main() -> None:
    ap = arguments(__doc__, port=14020)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()

    import logging

    from storage import start_embedded

    logging.getLogger("uvicorn.error").setLevel(logging.CRITICAL)  # the fake's own cut streams

    work = Path(tempfile.mkdtemp(prefix="bp-soak-"))
    pg = start_embedded(work / "pg", delete_on_stop=True)
    fake = FaultyLLM(args.seed)
    upstream_url = f"http://127.0.0.1:{args.port + 10}/v1"
    server = serve_in_thread(fake, args.port + 10)
    procs = Procs()
    proxies = []
    result: dict = {}
    try:
        for i in range(2):
            proxies.append(start_branchpoint(
                procs, work, port=args.port + i, upstream_url=upstream_url, cpus=None, database_url=pg.uri,
                name=f"proxy{i}", config="max_response_bytes = 65536\nlease_seconds = 20\n"
                                         "[upstream_defaults]\nread_timeout = 10\n")[0])
        env = {**os.environ, "BRANCHPOINT_DATABASE_URL": pg.uri, "BRANCHPOINT_UPSTREAM_URL": upstream_url,
               "BRANCHPOINT_CONFIG": str(work / "bench.toml")}
        load = Load(proxies, args.seed)
        log(f"soaking {args.seconds:.0f} s with {args.clients} clients on {len(proxies)} processes")
        t0 = time.monotonic()
        asyncio.run(drive(load, args.clients, args.seconds))
        elapsed = time.monotonic() - t0
        time.sleep(1)
        check = subprocess.run([str(ROOT / ".venv" / "bin" / "branchpoint"), "check", "--grace", "30"], env=env,
                               capture_output=True, text=True, timeout=120)
        lost = asyncio.run(_lost(pg.uri, load))
        deadlocks = asyncio.run(_deadlocks(pg.uri))
        batches = [_metric(p, "branchpoint_db_batches_total") for p in proxies]
        batched = [_metric(p, "branchpoint_db_batched_statements_total") for p in proxies]
        result = {
            "seconds": round(elapsed, 1), "clients": args.clients, "processes": len(proxies),
            "requests": sum(v for k, v in load.statuses.items() if isinstance(k, int)),
            "statuses": {str(k): v for k, v in sorted(load.statuses.items(), key=lambda kv: str(kv[0]))},
            "operations": dict(load.ops), "upstream_faults": dict(fake.calls),
            "own_5xx": len(load.own_5xx), "own_5xx_samples": load.own_5xx[:5],
            "check_exit": check.returncode, "check_output": check.stdout.strip()[-500:],
            "nodes_named": len(load.node_conv), "nodes_lost": len(lost), "lost_samples": lost[:5],
            "conversations_deleted": len(load.deleted),
            # batched round trips (docs/architecture.md#batched-round-trips): how many, what they
            # carried, and the deadlocks PostgreSQL broke (each sends its batch's statements again alone)
            "db_batches": sum(batches), "db_batched_statements": sum(batched), "deadlocks": deadlocks,
        }
    finally:
        procs.stop()
        server.should_exit = True
        pg.stop()
    print(json.dumps(result, indent=2))
    if result:
        write_result(result, out=args.out)
    if result.get("own_5xx") or result.get("check_exit") or result.get("nodes_lost"):
        raise SystemExit(1)


def _metric(proxy: str, name: str) -> float:
    text = httpx.get(f"{proxy}/metrics", timeout=10).text
    return next((float(line.split()[1]) for line in text.splitlines() if line.startswith(name + " ")), 0.0)


async def _deadlocks(url: str) -> int:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        return await conn.fetchval("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
    finally:
        await conn.close()


async def _lost(url: str, load: Load) -> list[str]:
    import uuid

    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        existing = {str(r["id"]) for r in await conn.fetch("SELECT id FROM nodes WHERE id = ANY($1::uuid[])",
                                                            [uuid.UUID(n) for n in load.node_conv])}
    finally:
        await conn.close()
    return [n for n, conv in load.node_conv.items() if n not in existing and conv not in load.deleted]


if __name__ == "__main__":
    main()
