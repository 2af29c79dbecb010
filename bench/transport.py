#!/usr/bin/env python3
"""The upstream transports side by side: the built-in HTTP/1.1 pool (proxy/transport.py), httpx's
own (httpcore) and httpx-aiohttp -- the proxy's CPU per stored call and its req/s, same harness,
interleaved runs.

    uv run python bench/transport.py [-d 8] [--repeats 2] [--transports builtin,httpx,aiohttp]

Each run: a fresh stack (fake upstream on CPU 0, Branchpoint on CPU 1 with its embedded
PostgreSQL), 32 conversations of 20 turns, then wrk with 32 connections making turn calls
(non-stream, then stream). Reported per transport: the median over the repeats.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import Procs, arguments, log, shared_bench, start_stack, write_result
from run import run_wrk_turns, seed


def main() -> None:
    ap = arguments(__doc__)
    ap.add_argument("-d", "--duration", type=float, default=8.0)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--transports", default="builtin,httpx,aiohttp")
    args = ap.parse_args()
    transports = args.transports.split(",")
    runs: dict[str, list[dict]] = {t: [] for t in transports}
    for rep in range(args.repeats):
        for transport in transports:
            work = Path(tempfile.mkdtemp(prefix=f"bp-transport-{transport}-"))
            procs = Procs()
            try:
                _, proxy, px = start_stack(procs, work, up_port=18085, port=14005, bench=shared_bench(),
                                           config=f'[upstream_defaults]\ntransport = "{transport}"\n')
                convs = seed(proxy, 32)
                row = {}
                for stream in (False, True):
                    r = run_wrk_turns(f"{proxy}/v1", convs, stream, args.duration, px.pid, work / "data")
                    row["stream" if stream else "nonstream"] = r
                    log(f"rep {rep} {transport:8s} {'stream' if stream else 'nonstream':9s} rps {r['rps']:7.1f} "
                        f"proxy CPU {r['cpu_ms_per_req']:.3f} ms/req  errors {r['errors']}")
                runs[transport].append(row)
            finally:
                procs.stop()
    summary = {}
    for transport, rows in runs.items():
        summary[transport] = {
            mode: {k: statistics.median(r[mode][k] for r in rows) for k in ("rps", "cpu_ms_per_req", "rss_mb", "errors")}
            for mode in ("nonstream", "stream")
        }
    write_result({"runs": runs, "summary": summary}, out=args.out)
    base = summary.get("builtin")
    print("| transport | non-stream req/s | CPU ms/call | stream req/s | CPU ms/call | RSS MB |")
    print("|---|---|---|---|---|---|")
    for transport, s in summary.items():
        rel = ""
        if base and transport != "builtin":
            rel = f" ({100 * (s['nonstream']['cpu_ms_per_req'] / base['nonstream']['cpu_ms_per_req'] - 1):+.0f} %)"
        print(f"| {transport} | {s['nonstream']['rps']:.0f} | {s['nonstream']['cpu_ms_per_req']:.3f}{rel} | "
              f"{s['stream']['rps']:.0f} | {s['stream']['cpu_ms_per_req']:.3f} | {s['stream']['rss_mb']:.0f} |")


if __name__ == "__main__":
    main()
