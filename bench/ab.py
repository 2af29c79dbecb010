#!/usr/bin/env python3
"""Two builds of Branchpoint side by side, interleaved: A (another checkout, each with its own
``.venv`` -- ``git worktree add`` one at the commit to compare against, then ``uv sync``) and B
(this checkout), both up at once on CPU 1 with their own embedded PostgreSQL there too, one fake
upstream on CPU 0. Short rounds alternate between them, so the machine's drift falls on both
alike: on a shared 2-core machine a difference smaller than the rounds' spread is not one.

    uv run python bench/ab.py --a ../base [-d 4] [--rounds 8] [--stream]

Scenarios: c=32 turn calls on 32 conversations with 20-node paths, non-stream (and stream with
``--stream``) -- req/s and CPU per call (proxy + PostgreSQL); c=1 non-stream -- latency p50 and
CPU per call. Reports each scenario's B/A ratios, per round and their median.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import (
    ROOT,
    Procs,
    arguments,
    busy_before,
    log,
    pin_postgres,
    shared_bench,
    start_branchpoint,
    wait_http,
    write_result,
)
from run import run_wrk_turns, seed


def main() -> None:
    ap = arguments(__doc__, port=14190, up_port=18190)
    ap.add_argument("--a", required=True, type=Path, help="the checkout to compare against (with its .venv)")
    ap.add_argument("-d", "--duration", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--stream", action="store_true", help="measure c=32 stream too")
    args = ap.parse_args()
    a_tree = args.a.resolve()
    if not (a_tree / ".venv" / "bin" / "branchpoint").exists():
        raise SystemExit(f"{a_tree} has no .venv/bin/branchpoint: run `uv sync` there first")
    work = Path(tempfile.mkdtemp(prefix="bp-ab-"))
    busy = busy_before("compare the rounds' spread")
    procs = Procs()
    rounds: list[dict] = []
    scenarios = [("c32 non-stream", 32, False), ("c1 non-stream", 1, False)]
    if args.stream:
        scenarios.insert(1, ("c32 stream", 32, True))
    try:
        upstream = f"http://127.0.0.1:{args.up_port}/v1"
        up = procs.start([sys.executable, str(shared_bench() / "fake_upstream.py"), "--port", str(args.up_port)],
                         cpus="0", log_file=work / "upstream.log")
        procs.upstream_pid = up.pid
        wait_http(f"{upstream}/models", 20, up)
        sides = {}
        for i, (side, tree) in enumerate((("A", a_tree), ("B", ROOT))):
            (work / side).mkdir()
            url, px = start_branchpoint(procs, work / side, port=args.port + i, upstream_url=upstream, name=side,
                                        tree=tree)
            pin_postgres(work / side / "data", "1")
            sides[side] = (url, px, seed(url, 32))
            log(f"{side}: {tree} pid {px.pid}")
        for r in range(args.rounds):
            row: dict = {"round": r + 1}
            for name, n, stream in scenarios:
                order = ["A", "B"] if r % 2 == 0 else ["B", "A"]
                for side in order:
                    url, px, convs = sides[side]
                    m = run_wrk_turns(f"{url}/v1", convs[:n], stream, args.duration, px.pid, work / side / "data")
                    if m["errors"]:
                        raise SystemExit(f"{side} {name}: {m['errors']} errors")
                    cpu = m["cpu_ms_per_req"] + (m["postgres_cpu_ms_per_req"] or 0)
                    row[f"{side} {name}"] = {"rps": m["rps"], "cpu_ms": round(cpu, 3),
                                             "proxy_cpu_ms": round(m["cpu_ms_per_req"], 3), "p50_ms": m["p50_ms"]}
            rounds.append(row)
            log(f"round {r + 1}: " + "; ".join(
                f"{name}: B/A req/s {row[f'B {name}']['rps'] / row[f'A {name}']['rps']:.3f}, "
                f"CPU {row[f'B {name}']['cpu_ms'] / row[f'A {name}']['cpu_ms']:.3f}, "
                f"p50 {row[f'B {name}']['p50_ms'] / row[f'A {name}']['p50_ms']:.3f}" for name, _, _ in scenarios))
    finally:
        procs.stop()

    summary = {}
    for name, _, _ in scenarios:
        def ratios(key: str, name: str = name) -> list[float]:
            return [x[f"B {name}"][key] / x[f"A {name}"][key] for x in rounds]

        summary[name] = {
            key: {"median": round(statistics.median(ratios(key)), 3),
                  "range": [round(min(ratios(key)), 3), round(max(ratios(key)), 3)]}
            for key in ("rps", "cpu_ms", "proxy_cpu_ms", "p50_ms")}
        summary[name]["A_cpu_ms_median"] = round(statistics.median(x[f"A {name}"]["cpu_ms"] for x in rounds), 3)
        summary[name]["B_cpu_ms_median"] = round(statistics.median(x[f"B {name}"]["cpu_ms"] for x in rounds), 3)
    write_result({"a": str(a_tree), "duration_s": args.duration, "cores_busy_before_pct": busy, "rounds": rounds,
                  "summary": summary}, out=args.out)
    print("| scenario | B/A req/s | B/A CPU per call | B/A proxy CPU | B/A p50 | CPU ms A / B |")
    print("|---|---|---|---|---|---|")
    for name, s in summary.items():
        cells = [f"{s[k]['median']} ({s[k]['range'][0]}-{s[k]['range'][1]})" for k in ("rps", "cpu_ms", "proxy_cpu_ms", "p50_ms")]
        print(f"| {name} | " + " | ".join(cells) + f" | {s['A_cpu_ms_median']} / {s['B_cpu_ms_median']} |")


if __name__ == "__main__":
    main()
