#!/usr/bin/env python3
"""What Anthropic's Messages API costs on the tree, over a chat upstream (the workplace's fast fake):

1. a Claude Code-shaped session of ``--turns`` calls under ``/auto/v1`` (the whole session resent
   each call: a ~7.4 KB system field, ~32 KB of tools, a tool round every other turn with ~2 KB of
   output): the bytes the client sent against the bytes stored (nodes' sent, received, params);
2. the added latency of a stored Messages call against a stored chat call on the same 20-turn path,
   c=1 (side calls, X-Node-Kind: transform, alternating), streamed and not, and the time to the
   first byte of a stream.

    uv run python bench/messages.py [--reps 300] [--turns 20]

Layout of bench/run.py: the fake upstream on CPU 0, Branchpoint on CPU 1.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import asyncpg
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import KEY, MODEL, Procs, arguments, log, postgres_dsn, shared_bench, start_stack, timed_post, write_result

SYSTEM = [{"type": "text", "text": "You are a coding agent. " + "Follow the repository's conventions. " * 200,
           "cache_control": {"type": "ephemeral"}}]
TOOLS = [{"name": f"Tool{i}", "description": "Does one thing well. " * 40,
          "input_schema": {"type": "object", "properties": {f"arg{j}": {"type": "string", "description": "a value " * 8}
                                                            for j in range(6)}}} for i in range(24)]


def first_byte_ms(http: httpx.Client, url: str, body: bytes, headers: dict[str, str]) -> float:
    t0 = time.perf_counter()
    first = None
    with http.stream("POST", url, content=body, headers=headers) as r:
        for _ in r.iter_raw():
            if first is None:
                first = time.perf_counter()
        r.raise_for_status()
    return ((first or time.perf_counter()) - t0) * 1000


def session(http: httpx.Client, turns: int) -> dict:
    """A Claude Code-shaped session in full-history mode: the bytes sent and what became of them."""
    messages: list[dict] = []
    sent = 0
    conversation = None
    for i in range(turns):
        if i % 2 == 1:  # a tool round: the model's tool use (as if it had asked) and its ~2 KB result
            messages.append({"role": "assistant", "content": [
                {"type": "tool_use", "id": f"toolu_{i}", "name": "Tool1", "input": {"arg0": f"ls src/{i}"}}]})
            messages.append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": f"file_{i}.py\n" * 180},
                {"type": "text", "text": f"and now step {i}", "cache_control": {"type": "ephemeral"}}]})
        else:
            messages.append({"role": "user", "content": [{"type": "text", "text": f"question {i}: what next?",
                                                          "cache_control": {"type": "ephemeral"}}]})
        body = json.dumps({"model": MODEL, "max_tokens": 1024, "system": SYSTEM, "tools": TOOLS,
                           "messages": messages}).encode()
        sent += len(body)
        r = http.post("/auto/v1/messages", content=body, headers={"content-type": "application/json",
                                                                  "x-claude-code-session-id": "bench-session-1"})
        r.raise_for_status()
        conversation = r.headers["x-conversation-id"]
        for m in messages:  # (the markers move on: only the newest message keeps one)
            if isinstance(m["content"], list):
                m["content"] = [{k: v for k, v in b.items() if k != "cache_control"} for b in m["content"]]
        messages.append({"role": "assistant", "content": r.json()["content"]})
    return {"client_bytes": sent, "conversation": conversation}


async def stored_bytes(dsn: str, conversation: str) -> dict:
    conn = await asyncpg.connect(dsn)  # (the embedded server keeps its tables in "postgres")
    try:
        row = await conn.fetchrow(
            "SELECT count(*) AS nodes, sum(octet_length(sent::text)) AS sent, sum(octet_length(coalesce(received, '[]')::text)) AS received,"
            " sum(octet_length(params::text)) AS params FROM nodes WHERE conversation_id = $1", conversation)
        return {k: int(v or 0) for k, v in dict(row).items()}
    finally:
        await conn.close()


def main() -> None:
    ap = arguments(__doc__, port=14031, up_port=18086)
    ap.add_argument("--reps", type=int, default=300)
    ap.add_argument("--turns", type=int, default=20)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bp-messages-bench-"))
    procs = Procs()
    rows = []
    try:
        _, proxy, _ = start_stack(procs, work, up_port=args.up_port, port=args.port, bench=shared_bench())
        with httpx.Client(base_url=proxy, headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as http:
            figures = session(http, args.turns)
            stored = asyncio.run(stored_bytes(postgres_dsn(work / "data"), figures["conversation"]))
            stored_total = stored["sent"] + stored["received"] + stored["params"]
            storage = {"turns": args.turns, "client_bytes": figures["client_bytes"], "stored": stored,
                       "stored_bytes": stored_total, "stored_share": round(stored_total / figures["client_bytes"], 4)}
            log(str(storage))

            for i in range(args.turns):
                http.post("/v1/chat/completions", headers={"X-Conversation-Id": "path"},
                          json={"model": MODEL, "messages": [{"role": "user", "content": f"question {i}"}]}).raise_for_status()
            headers = {"content-type": "application/json", "X-Conversation-Id": "path", "X-Node-Kind": "transform"}
            for stream in (False, True):
                chat = json.dumps({"model": MODEL, "stream": stream,
                                   "messages": [{"role": "user", "content": "a side question"}]}).encode()
                msg = json.dumps({"model": MODEL, "stream": stream, "max_tokens": 100,
                                  "messages": [{"role": "user", "content": "a side question"}]}).encode()
                samples: dict[str, list[float]] = {"chat": [], "messages": [], "chat_ttfb": [], "messages_ttfb": []}
                for rep in range(args.reps + 20):
                    if stream:
                        c = first_byte_ms(http, "/v1/chat/completions", chat, headers)
                        m = first_byte_ms(http, "/v1/messages", msg, headers)
                        if rep >= 20:
                            samples["chat_ttfb"].append(c)
                            samples["messages_ttfb"].append(m)
                    c = timed_post(http, "/v1/chat/completions", chat, headers, stream)
                    m = timed_post(http, "/v1/messages", msg, headers, stream)
                    if rep >= 20:  # warm-up
                        samples["chat"].append(c)
                        samples["messages"].append(m)
                row = {"stream": stream, "chat_p50_ms": round(statistics.median(samples["chat"]), 3),
                       "messages_p50_ms": round(statistics.median(samples["messages"]), 3)}
                row["messages_minus_chat_ms"] = round(row["messages_p50_ms"] - row["chat_p50_ms"], 3)
                if stream:
                    row["chat_ttfb_p50_ms"] = round(statistics.median(samples["chat_ttfb"]), 3)
                    row["messages_ttfb_p50_ms"] = round(statistics.median(samples["messages_ttfb"]), 3)
                log(str(row))
                rows.append(row)
    finally:
        procs.stop()
    result = {"storage": storage, "reps": args.reps, "rows": rows}
    print(json.dumps(result, indent=2))
    write_result(result, out=args.out)


if __name__ == "__main__":
    main()
