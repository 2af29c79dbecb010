#!/usr/bin/env python3
"""What the Responses API costs over chat completions: a stored Responses call (translated for a
chat upstream) against a stored chat call on the same 20-turn path, c=1, streamed and not.

    uv run python bench/responses.py [--reps 300] [--turns 20]

Side calls (X-Node-Kind: transform) keep the path the same; the two kinds alternate, one at a
time. Layout of bench/run.py: the workplace's fast fake upstream on CPU 0, Branchpoint on CPU 1.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import KEY, MODEL, Procs, arguments, log, shared_bench, start_stack, timed_post, write_result


def main() -> None:
    ap = arguments(__doc__, port=14030, up_port=18085)
    ap.add_argument("--reps", type=int, default=300)
    ap.add_argument("--turns", type=int, default=20)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bp-responses-bench-"))
    procs = Procs()
    rows = []
    try:
        _, proxy, _ = start_stack(procs, work, up_port=args.up_port, port=args.port, bench=shared_bench())
        with httpx.Client(base_url=proxy, headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as http:
            for i in range(args.turns):
                http.post("/v1/chat/completions", headers={"X-Conversation-Id": "path"},
                          json={"model": MODEL, "messages": [{"role": "user", "content": f"question {i}"}]}).raise_for_status()
            headers = {"content-type": "application/json", "X-Conversation-Id": "path", "X-Node-Kind": "transform"}
            for stream in (False, True):
                chat = json.dumps({"model": MODEL, "stream": stream,
                                   "messages": [{"role": "user", "content": "a side question"}]}).encode()
                resp = json.dumps({"model": MODEL, "stream": stream, "input": "a side question"}).encode()
                samples: dict[str, list[float]] = {"chat": [], "responses": []}
                for rep in range(args.reps + 20):
                    c = timed_post(http, "/v1/chat/completions", chat, headers, stream)
                    r = timed_post(http, "/v1/responses", resp, headers, stream)
                    if rep >= 20:  # warm-up
                        samples["chat"].append(c)
                        samples["responses"].append(r)
                row = {"stream": stream, "chat_p50_ms": round(statistics.median(samples["chat"]), 3),
                       "responses_p50_ms": round(statistics.median(samples["responses"]), 3)}
                row["responses_minus_chat_ms"] = round(row["responses_p50_ms"] - row["chat_p50_ms"], 3)
                log(str(row))
                rows.append(row)
    finally:
        procs.stop()
    result = {"turns": args.turns, "reps": args.reps, "rows": rows}
    print(json.dumps(result, indent=2))
    write_result(result, out=args.out)


if __name__ == "__main__":
    main()
