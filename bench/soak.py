#!/usr/bin/env python3
"""Soak: two Branchpoint processes on one PostgreSQL, 32 clients, a mixed load of turns (plain,
streamed, full-history), edits, transforms, head moves, switches, forks and deletes, for
``--seconds``, against an upstream that fails on purpose now and then.

    uv run python bench/soak.py [--seconds 60] [--clients 32]

The fake upstream (in this process) answers most calls, and otherwise: 500, 429, a context
overflow (400), a slow answer, garbage on a 200, a stream cut in the middle, a stream whose
events never end (cut by a small max_response_bytes), or an answer holding NUL characters.

With ``--hostile`` the upstream is hostile too -- compression bombs (gzip and zstd), a header
block of a megabyte and one of thousands of headers, an answer with a NUL 600 levels deep, usage
that is negative, a string or 1e40, an answer echoing the client's key -- and so are some clients:
30 MB request bodies, a NUL nested 700 levels deep in a message, a conversation and its fork
deleted at the same moment. The proxies' memory is sampled throughout (the largest RSS is
reported); after the load every conversation takes one more turn (none may still be 409).

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
BIG_BODY_WEIGHT = int(os.environ.get("SOAK_BIG_BODY_WEIGHT", "1"))  # (0: no 30 MB bodies)
OWN_5XX = {"internal_error", "storage_error", "database_unavailable", "relay_error"}


_FAULTS = (("500", 0.04), ("429", 0.03), ("overflow", 0.02), ("slow", 0.03), ("garbage", 0.02), ("cut", 0.02),
           ("endless", 0.01), ("nul", 0.02))
_HOSTILE = (("gzip_bomb", 0.01), ("zstd_bomb", 0.01), ("huge_header", 0.01), ("many_headers", 0.01),
            ("deep_nul", 0.02), ("odd_usage", 0.03), ("echo_key", 0.02))


def _nested(depth: int, leaf: object) -> object:
    for _ in range(depth):
        leaf = [leaf]
    return leaf


class FaultyLLM:
    """ASGI app: chat completions, streamed or not, with scripted faults."""

    def __init__(self, seed: int, hostile: bool = False) -> None:
        self.random = random.Random(seed)
        self.lock = threading.Lock()
        self.calls = collections.Counter()
        self.faults = _FAULTS + (_HOSTILE if hostile else ())
        if hostile:
            import gzip

            import zstandard

            payload = b'{"choices": [{"message": {"content": "' + b"a" * (256 << 20) + b'"}}]}'
            self.gzip_bomb = gzip.compress(payload, 9)
            self.zstd_bomb = zstandard.ZstdCompressor(level=19).compress(payload)
            del payload

    def pick(self) -> str:
        with self.lock:
            r = self.random.random()
        for name, p in self.faults:
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
        if fault in ("gzip_bomb", "zstd_bomb"):
            encoding = fault.split("_")[0].encode()
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream" if stream else b"application/json"),
                                    (b"content-encoding", encoding)]})
            return await send({"type": "http.response.body", "body": getattr(self, fault)})
        if fault in ("huge_header", "many_headers"):
            headers = [(b"content-type", b"application/json")]
            headers += [(b"x-huge", b"h" * (1 << 20))] if fault == "huge_header" else \
                [(f"x-many-{i}".encode(), b"v") for i in range(5000)]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            return await send({"type": "http.response.body", "body": b'{"choices": []}'})
        if fault == "slow":
            await asyncio.sleep(0.3)
        content = "before\u0000after" if fault == "nul" else "an answer of ordinary length for the soak test"
        if fault == "echo_key":
            auth = dict(scope["headers"]).get(b"authorization", b"").decode()
            content = f"you are {auth.removeprefix('Bearer ')}"
        usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        if fault == "odd_usage":
            usage = self.random.choice([{"prompt_tokens": 10, "completion_tokens": -1},
                                        {"prompt_tokens": "ten", "completion_tokens": 5}, {"prompt_tokens": 1e40}])
        if not stream:
            message = {"role": "assistant", "content": content}
            if fault == "deep_nul":
                message["extra"] = _nested(600, "a\u0000b")
            data = {"id": "c", "object": "chat.completion", "model": MODEL,
                    "choices": [{"index": 0, "message": message, "finish_reason": "stop"}], "usage": usage}
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
                 "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": usage}
        await send({"type": "http.response.body", "body": b"data: " + json.dumps(final).encode() + b"\n\ndata: [DONE]\n\n",
                    "more_body": False})


class Load:
    def __init__(self, proxies: list[str], seed: int, hostile: bool = False) -> None:
        self.proxies = proxies
        self.hostile = hostile
        self.leaks: list[str] = []  # a client's key seen in what it got back
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
        key = response.request.headers.get("authorization", "").removeprefix("Bearer ")
        if key and key.encode() in body:
            self.leaks.append(f"{response.request.url.path} {response.status_code}")
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
        ops, weights = ["turn", "stream", "full", "edit", "transform", "head", "switch", "fork", "delete"], \
            [30, 15, 10, 10, 10, 6, 6, 4, 2]
        if self.hostile:
            ops, weights = [*ops, "big_body", "deep_client", "delete_pair"], [*weights, BIG_BODY_WEIGHT, 2, 2]
        op = self.random.choices(ops, weights)[0]
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
        elif op == "big_body":  # 30 MB in one message: within max_body_bytes, stored like any turn
            big = {**message, "messages": [{"role": "user", "content": "b" * (30 << 20)}]}
            self.note(conv, await client.post(chat, headers={**auth, "X-Conversation-Id": cid}, json=big))
        elif op == "deep_client":  # a NUL 700 levels deep: refused (400), never a 5xx
            deep = {**message, "messages": [{"role": "user", "content": "x", "extra": _nested(700, "a\u0000b")}]}
            r = await client.post(chat, headers={**auth, "X-Conversation-Id": cid}, json=deep)
            self.note(conv, r)
        elif op == "delete_pair":  # a conversation and its fork deleted at the same moment, from both processes
            new = f"{cid}.d{self.random.randrange(10**9)}"
            r = await client.post(f"{base}/admin/conversations/{cid}/fork", headers=auth, json={"conversation_id": new})
            self.note(conv, r)
            if r.status_code == 200:
                deletes = await asyncio.gather(*(client.delete(f"{p}/admin/conversations/{c}", headers=auth)
                                                 for p, c in zip(self.proxies, (cid, new), strict=False)))
                for c, d in zip((cid, new), deletes, strict=True):
                    self.note(f"{key}|{c}", d)
                    if d.status_code == 200:
                        self.deleted.add(f"{key}|{c}")


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
    ap.add_argument("--hostile", action="store_true", help="a hostile upstream and hostile clients beside the load")
    args = ap.parse_args()

    import logging

    from storage import start_embedded

    logging.getLogger("uvicorn.error").setLevel(logging.CRITICAL)  # the fake's own cut streams

    work = Path(tempfile.mkdtemp(prefix="bp-soak-"))
    pg = start_embedded(work / "pg", delete_on_stop=True)
    fake = FaultyLLM(args.seed, hostile=args.hostile)
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
        load = Load(proxies, args.seed, hostile=args.hostile)
        rss = _RssWatch(list(procs.pids))  # the two proxies
        log(f"soaking {args.seconds:.0f} s with {args.clients} clients on {len(proxies)} processes")
        t0 = time.monotonic()
        rss.start()
        asyncio.run(drive(load, args.clients, args.seconds))
        elapsed = time.monotonic() - t0
        time.sleep(1)
        drained = asyncio.run(_drain(pg.uri))  # calls whose clients gave up may still be running
        busy_after = asyncio.run(_busy_after(load))
        time.sleep(2)
        rss.stop()
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
            "hostile": args.hostile, "key_leaks": len(load.leaks), "leak_samples": load.leaks[:5],
            "busy_after_load": busy_after, "seconds_until_no_call_in_flight": drained, "rss_max_mb": rss.max_mb(), "rss_idle_mb": rss.last_mb(),
        }
    finally:
        procs.stop()
        server.should_exit = True
        pg.stop()
    print(json.dumps(result, indent=2))
    if result:
        write_result(result, out=args.out)
    if result.get("own_5xx") or result.get("check_exit") or result.get("nodes_lost") or result.get("key_leaks") \
            or result.get("busy_after_load"):
        raise SystemExit(1)


class _RssWatch:
    """The proxies' resident memory, sampled twice a second (summed over their processes)."""

    def __init__(self, pids: list[int]) -> None:
        self.pids, self.samples, self.done = pids, [], threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.done.set()
        self.thread.join(5)

    def _rss(self, pid: int) -> int:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0

    def _run(self) -> None:
        while not self.done.wait(0.5):
            self.samples.append([self._rss(p) for p in self.pids])

    def max_mb(self) -> list[float]:
        return [round(max((s[i] for s in self.samples), default=0) / 2**20, 1) for i in range(len(self.pids))]

    def last_mb(self) -> list[float]:
        return [round(s / 2**20, 1) for s in self.samples[-1]] if self.samples else []


async def _drain(url: str, limit: float = 300) -> float | None:
    """Seconds until no call is in flight any more (no pending node), at most ``limit`` (None)."""
    import asyncpg

    t0 = time.monotonic()
    conn = await asyncpg.connect(url)
    try:
        while time.monotonic() - t0 < limit:
            if not await conn.fetchval("SELECT count(*) FROM nodes WHERE outcome IS NULL"):
                return round(time.monotonic() - t0, 1)
            await asyncio.sleep(0.5)
        return None
    finally:
        await conn.close()


async def _busy_after(load: Load) -> list[str]:
    """After the load, once no call is in flight: one more turn in every conversation not deleted --
    none may be refused as busy (a call that ended must have released its conversation)."""
    busy = []
    async with httpx.AsyncClient(timeout=60) as client:
        for conv in list(load.conversations):
            if conv in load.deleted:
                continue
            key, cid = conv.split("|")
            r = await client.post(f"{load.proxies[0]}/v1/chat/completions",
                                  headers={"Authorization": f"Bearer {key}", "X-Conversation-Id": cid},
                                  json={"model": MODEL, "messages": [{"role": "user", "content": "after"}]})
            if r.status_code == 409:
                busy.append(cid)
    return busy


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
