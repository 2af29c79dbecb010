#!/usr/bin/env python3
"""Branchpoint and LiteLLM side by side, interleaved: both proxies run at once (each alone on
CPU 1 while it is measured; Branchpoint's PostgreSQL there too), and short rounds alternate
between them, so the machine's drifting speed falls on both alike. Reports each round's ratio
and their median -- on this shared machine a ratio from two cells minutes apart carries ±30 %.

    uv run python bench/versus.py [-d 4] [--rounds 6]

Scenarios: c=32 turn calls on 32 conversations with 20-node paths (LiteLLM: the same body,
c=32), non-stream and stream -- req/s and CPU per call (ours: proxy + PostgreSQL); c=1
non-stream -- latency p50. LiteLLM is started from the venv and with the settings of the
workplace's run_peer.sh (installed by `bench/run.py --peer` on first use; 1 worker, no
database, local cost map, LITELLM_LOG=ERROR). Only processes this script started are stopped.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import (
    MODEL,
    Procs,
    arguments,
    busy_before,
    cpu_ticks,
    log,
    postgres_pids,
    shared_bench,
    start_stack,
    wait_http,
    write_result,
)
from run import run_wrk_turns, seed

LITELLM_VENV = Path(os.environ.get("LITELLM_VENV", f"{os.environ.get('TMPDIR', '/tmp')}/branchpoint-bench-litellm-venv"))
LITELLM_KEY = "sk-bench-1234"
LITELLM_CONFIG = """model_list:
  - model_name: {model}
    litellm_params:
      model: openai/{model}
      api_base: {upstream}
      api_key: sk-upstream-dummy
litellm_settings:
  set_verbose: false
  json_logs: false
  request_timeout: 30
  num_retries: 0
general_settings:
  master_key: {key}
  disable_spend_logs: true
  disable_error_logs: true
"""


def start_litellm(procs: Procs, work: Path, upstream: str, port: int) -> tuple[str, int]:
    litellm = LITELLM_VENV / "bin" / "litellm"
    if not litellm.exists():
        raise SystemExit(f"no LiteLLM at {litellm}: run `uv run python bench/run.py --peer` once to install it")
    config = work / "litellm_config.yaml"
    config.write_text(LITELLM_CONFIG.format(model=MODEL, upstream=upstream, key=LITELLM_KEY))
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "DIRECT_URL", "REDIS_HOST", "REDIS_URL", "OPENAI_API_KEY")}
    env.update(LITELLM_LOCAL_MODEL_COST_MAP="True", LITELLM_LOCAL_BLOG_POSTS="True",
               LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS="True", LITELLM_LOCAL_AUTOROUTER_PRESETS="True",
               LITELLM_LOCAL_POLICY_TEMPLATES="True", LITELLM_MODE="PRODUCTION", LITELLM_LOG="ERROR",
               LITELLM_DONT_SHOW_FEEDBACK_BOX="true", NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
    proc = procs.start([str(litellm), "--config", str(config), "--host", "127.0.0.1", "--port", str(port),
                        "--num_workers", "1"], cpus="1", log_file=work / "litellm.log", env=env,
                       cwd=work)  # LiteLLM writes next to where it runs
    wait_http(f"http://127.0.0.1:{port}/health/liveliness", 180, proc)
    return f"http://127.0.0.1:{port}", proc.pid


def main() -> None:
    ap = arguments(__doc__, port=14090, up_port=18090)
    ap.add_argument("-d", "--duration", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--litellm-port", type=int, default=14091)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bp-versus-"))
    busy = busy_before("the figures will be skewed")
    procs = Procs()
    rounds: list[dict] = []
    idle: dict = {}
    try:
        upstream, proxy, px = start_stack(procs, work, up_port=args.up_port, port=args.port, bench=shared_bench(),
                                          pg_cpus="1")
        ll_url, ll_pid = start_litellm(procs, work, upstream, args.litellm_port)
        log(f"branchpoint pid {px.pid}, litellm pid {ll_pid}; seeding 32 conversations")
        convs = seed(proxy, 32)
        peers = [("litellm", f"litellm-{i}") for i in range(32)]  # headers LiteLLM ignores
        # what each side costs the other while it idles (both share CPU 1)
        idle_pids = {"ours": [px.pid, *postgres_pids(work / "data")], "litellm": [ll_pid]}
        before = {side: cpu_ticks(pids) for side, pids in idle_pids.items()}
        time.sleep(5)
        hz = os.sysconf("SC_CLK_TCK")
        idle = {side: round((cpu_ticks(pids) - before[side]) / hz / 5 * 100, 1) for side, pids in idle_pids.items()}
        log(f"idle CPU, % of a core: {idle}")
        scenarios = (("c32 non-stream", 32, False), ("c32 stream", 32, True), ("c1 non-stream", 1, False))
        for r in range(args.rounds):
            row: dict = {"round": r + 1}
            for name, n, stream in scenarios:
                sides = [("ours", lambda n=n, s=stream: run_wrk_turns(f"{proxy}/v1", convs[:n], s, args.duration,
                                                                       px.pid, work / "data")),
                         ("litellm", lambda n=n, s=stream: run_wrk_turns(f"{ll_url}/v1", peers[:n], s, args.duration,
                                                                          ll_pid, key=LITELLM_KEY))]
                if r % 2:
                    sides.reverse()
                for side, measure in sides:
                    m = measure()
                    if m["errors"]:
                        raise SystemExit(f"{side} {name}: {m['errors']} errors ({m['errors_status']} answered "
                                         f"with an error status, the others connection errors or timeouts)")
                    cpu = m["cpu_ms_per_req"] + (m["postgres_cpu_ms_per_req"] or 0)
                    row[f"{side} {name}"] = {"rps": m["rps"], "cpu_ms": round(cpu, 3), "p50_ms": m["p50_ms"]}
            rounds.append(row)
            log(f"round {r + 1}: " + "; ".join(
                f"{name}: {row[f'ours {name}']['rps'] / row[f'litellm {name}']['rps']:.1f}x req/s, "
                f"CPU 1/{row[f'litellm {name}']['cpu_ms'] / row[f'ours {name}']['cpu_ms']:.1f}"
                for name, _, _ in scenarios))
    finally:
        procs.stop()

    summary = {}
    for name, _, _ in scenarios:
        rps = [x[f"ours {name}"]["rps"] / x[f"litellm {name}"]["rps"] for x in rounds]
        cpu = [x[f"litellm {name}"]["cpu_ms"] / x[f"ours {name}"]["cpu_ms"] for x in rounds]
        p50 = [x[f"ours {name}"]["p50_ms"] / x[f"litellm {name}"]["p50_ms"] for x in rounds]
        summary[name] = {"req_s_ratio_median": round(statistics.median(rps), 2),
                         "req_s_ratio_range": [round(min(rps), 2), round(max(rps), 2)],
                         "cpu_per_call_ratio_median": round(statistics.median(cpu), 2),
                         "cpu_per_call_ratio_range": [round(min(cpu), 2), round(max(cpu), 2)],
                         "p50_ratio_median": round(statistics.median(p50), 3)}
    write_result({"meta": {"duration_s": args.duration, "idle_cpu_pct": idle, "cores_busy_before_pct": busy},
                  "rounds": rounds, "summary": summary}, out=args.out)
    print("| scenario | req/s ours : LiteLLM (median, range) | CPU per call LiteLLM : ours (median, range) | p50 ours / LiteLLM |")
    print("|---|---|---|---|")
    for name, s in summary.items():
        print(f"| {name} | {s['req_s_ratio_median']}x ({s['req_s_ratio_range'][0]}-{s['req_s_ratio_range'][1]}) "
              f"| 1/{s['cpu_per_call_ratio_median']} ({s['cpu_per_call_ratio_range'][0]}-{s['cpu_per_call_ratio_range'][1]}) "
              f"| {s['p50_ratio_median']} |")


if __name__ == "__main__":
    main()
