#!/usr/bin/env python3
"""A long conversation under a small model limit: does the request stay bounded, how often is
it compacted, and what does compaction cost the user?

    uv run python bench/compaction.py [--turns 300] [--think-ms 300] [--summary-ms 200]

A fake LLM (in this process, on 127.0.0.1) reports usage counted with the same offline tiktoken
encoding the proxy uses, answers each turn with about 120 tokens, and -- when Branchpoint asks it
to summarise -- takes ``--summary-ms`` and returns about 200 tokens. Branchpoint runs as its own
process (embedded PostgreSQL) with ``bench-small`` limited to an 8,192-token window and 1,024
reserved output tokens (input limit 7,168; soft 0.7, hard 0.9). The client waits ``--think-ms``
between turns, as a user (or a tool loop) does.

Reported: tokens sent upstream per turn (counted on what the fake received) against the input
limit, compactions by trigger, and the latency of turns that found a background compaction
ready (their parent is a compaction node) compared with plain turns.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _harness import KEY, Procs, arguments, asgi_body, log, serve_in_thread, start_branchpoint, write_result

from proxy.tokens import TokenCounter

MODEL = "bench-small"
WINDOW, RESERVED = 8192, 1024
SENTENCES = [
    "Revenue in the northern region rose 12 percent quarter over quarter, driven by the Hanbit account.",
    "The migration of the billing service to PostgreSQL 16 is scheduled for the second week of March.",
    "Kim Jiwoo owns the vendor contract renewal and needs the legal review before Friday.",
    "Latency of the search API regressed from 180 to 260 milliseconds after the index rebuild.",
    "We decided to keep the weekly report in Korean and send an English digest to the board.",
]


class FakeLLM:
    """ASGI app: chat completions with realistic usage; summariser requests take a while."""

    def __init__(self, counter: TokenCounter, summary_delay: float) -> None:
        self.counter = counter
        self.summary_delay = summary_delay
        self.turn_tokens: list[int] = []
        self.summaries = 0
        self.lock = threading.Lock()

    async def __call__(self, scope, receive, send) -> None:
        body = await asgi_body(scope, receive, send)
        if body is None:
            return
        if scope["method"] != "POST":
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
            await send({"type": "http.response.body", "body": b"ok"})
            return
        request = json.loads(body)
        messages = request.get("messages", [])
        prompt = self.counter.messages(messages) + 3
        summariser = messages and str(messages[0].get("content", "")).startswith("You compress")
        if summariser:
            with self.lock:
                self.summaries += 1
            await asyncio.sleep(self.summary_delay)
            content = " ".join(SENTENCES * 2)  # about 200 tokens
        else:
            with self.lock:
                self.turn_tokens.append(prompt)
            content = " ".join(SENTENCES[(len(self.turn_tokens) + i) % 5] for i in range(5))  # ~120 tokens
        completion = self.counter.text(content)
        answer = {"id": "chatcmpl-bench", "object": "chat.completion", "model": request.get("model"),
                  "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
                  "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}}
        data = json.dumps(answer).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
        await send({"type": "http.response.body", "body": data})


@contextlib.contextmanager
def small_model_stack(port: int, summary_ms: float, prefix: str) -> Iterator[tuple[str, FakeLLM]]:
    """The fake LLM (in this process) on ``port`` + 1 and Branchpoint on ``port`` (CPU 1, its
    embedded PostgreSQL in a new ``prefix`` folder) with ``bench-small`` limited to WINDOW tokens,
    RESERVED of them for the output. Yields (the proxy's URL, the fake); stops both after."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    procs = Procs()
    counter = TokenCounter()
    counter.load()
    fake = FakeLLM(counter, summary_ms / 1000)
    server = serve_in_thread(fake, port + 1)
    try:
        proxy, _ = start_branchpoint(procs, work, port=port, upstream_url=f"http://127.0.0.1:{port + 1}/v1",
                                     config=f'[models."{MODEL}*"]\ncontext_window = {WINDOW}\n'
                                            f"max_output_tokens = {RESERVED}\n")
        yield proxy, fake
    finally:
        procs.stop()
        server.should_exit = True


def main() -> None:
    ap = arguments(__doc__, port=14004)
    ap.add_argument("--turns", type=int, default=300)
    ap.add_argument("--think-ms", type=float, default=300)
    ap.add_argument("--summary-ms", type=float, default=200)
    args = ap.parse_args()

    turns = []
    with small_model_stack(args.port, args.summary_ms, "bp-compaction-bench-") as (proxy, fake), \
            httpx.Client(base_url=proxy, headers={"Authorization": f"Bearer {KEY}", "X-Conversation-Id": "long"},
                         timeout=60) as http:
        system = {"role": "system", "content": "You are the team's analyst. Be precise with numbers."}
        for i in range(args.turns):
            text = f"Turn {i}. " + " ".join(SENTENCES[(i + k) % 5] for k in range(6))  # ~130 tokens
            messages = ([system] if i == 0 else []) + [{"role": "user", "content": text}]
            t0 = time.perf_counter()
            r = http.post("/v1/chat/completions", json={"model": MODEL, "messages": messages})
            elapsed = (time.perf_counter() - t0) * 1000
            r.raise_for_status()
            parent = r.headers["x-parent-node-id"]
            parent_kind = "root" if parent == "root" else http.get(f"/admin/nodes/{parent}").json()["kind"]
            turns.append({"turn": i, "ms": elapsed, "parent_kind": parent_kind, "tokens": fake.turn_tokens[-1]})
            time.sleep(args.think_ms / 1000)
        metrics = http.get("/metrics").text

    limit = WINDOW - RESERVED
    comp = {}
    for line in metrics.splitlines():
        if line.startswith("branchpoint_compactions_total{"):
            labels, value = line.rsplit(" ", 1)
            comp[labels[len("branchpoint_compactions_total"):]] = float(value)
    # a turn's own summariser wait shows as a "hard" compaction: its parent is the new node too
    after_bg = [t["ms"] for t in turns if t["parent_kind"] == "compaction"]
    plain = [t["ms"] for t in turns if t["parent_kind"] == "turn"]
    tokens = [t["tokens"] for t in turns]
    result = {
        "turns": args.turns, "input_limit": limit, "soft_tokens": int(limit * 0.7), "hard_tokens": int(limit * 0.9),
        "max_tokens_sent": max(tokens), "p50_tokens_sent": statistics.median(tokens),
        "turns_over_limit": sum(t > limit for t in tokens),
        "compactions": comp, "summariser_calls": fake.summaries,
        "turns_after_compaction": len(after_bg),
        "p50_ms_turn_after_compaction": round(statistics.median(after_bg), 2) if after_bg else None,
        "p50_ms_plain_turn": round(statistics.median(plain), 2) if plain else None,
        "p95_ms_plain_turn": round(sorted(plain)[int(len(plain) * 0.95) - 1], 2) if plain else None,
        "max_ms_any_turn": round(max(t["ms"] for t in turns), 2),
        "tokens_per_turn": tokens,
    }
    printable = {k: v for k, v in result.items() if k != "tokens_per_turn"}
    print(json.dumps(printable, indent=2))
    log("tokens sent per turn (every 10th): " + " ".join(str(t) for t in tokens[::10]))
    write_result(result, out=args.out)


if __name__ == "__main__":
    main()
