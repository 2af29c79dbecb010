#!/usr/bin/env python3
"""What Branchpoint adds over calling the upstream directly -- with storage on.

    uv run python bench/run.py                 # ours only (about 2 min)
    uv run python bench/run.py --peer          # + LiteLLM measured the same way, in the same run
    uv run python bench/run.py -d 5 --out /tmp/quick.json

Uses the workplace's shared bench (``../shared/bench``, or ``$BENCH_SHARED``): its fast fake
upstream, ``compare.py`` (wrk, direct vs. proxy interleaved, CPU and RSS of the proxy sampled from
/proc) and ``run_peer.sh`` (the same for LiteLLM). Layout on a 2-core machine: wrk and the fake
upstream on CPU 0, Branchpoint on CPU 1, PostgreSQL (embedded, started by Branchpoint) unpinned.

Scenarios, each on conversations whose path is 20 nodes long:
  turn c1         one conversation; every call is a turn hung under node 20 (the regenerate
                  pattern: the lease is taken, the path read, a node stored, the head moved),
                  so the path stays 20 long however many calls are made;
  turn c32        the same on 32 conversations at once, one per wrk thread/connection (a custom
                  wrk script: compare.py sends the same headers on every connection);
  transform c32   32 connections on ONE conversation, transform calls under node 20 (no lease,
                  head unmoved): the same storage work without the per-conversation lease.
Database statements per call are read from the proxy's own counter (/metrics).
Only processes this script started are stopped, by PID. The figures go to
bench/results/<date>-run[-peer].json (``--out`` elsewhere).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import (
    KEY,
    MODEL,
    Procs,
    arguments,
    cpu_ticks,
    log,
    machine,
    postgres_pids,
    preemptions,
    shared_bench,
    start_stack,
    wal_and_commits,
    write_result,
)

PATH_LEN = 20


def seed(proxy: str, conversations: int) -> list[tuple[str, str]]:
    """``conversations`` conversations of PATH_LEN turns each; returns (id, node 20)."""
    out = []
    with httpx.Client(base_url=proxy, headers={"Authorization": f"Bearer {KEY}"}, timeout=30) as http:
        for c in range(conversations):
            cid = f"bench-{c:02d}"
            node = None
            for turn in range(PATH_LEN):
                r = http.post("/v1/chat/completions", headers={"X-Conversation-Id": cid},
                              json={"model": MODEL, "messages": [{"role": "user", "content": f"question {turn} of {cid}"}]})
                r.raise_for_status()
                node = r.headers["x-node-id"]
            out.append((cid, node))
    return out


def statements(proxy: str) -> float:
    text = httpx.get(f"{proxy}/metrics", timeout=5).text
    m = re.search(r"^branchpoint_db_statements_total ([0-9.e+]+)$", text, re.M)
    return float(m.group(1)) if m else float("nan")


def statements_per_call(proxy: str, cid: str, parent: str, calls: int = 200) -> float:
    with httpx.Client(base_url=proxy, headers={"Authorization": f"Bearer {KEY}"}, timeout=30) as http:
        before = statements(proxy)
        for i in range(calls):
            http.post("/v1/chat/completions", headers={"X-Conversation-Id": cid, "X-Parent-Node-Id": parent},
                      json={"model": MODEL, "messages": [{"role": "user", "content": f"probe {i}"}]}).raise_for_status()
        after = statements(proxy)
    # the /metrics scrape itself runs one statement (pending-node gauge): subtract it
    return (after - before - 1) / calls


def run_compare(bench: Path, label: str, proxy_url: str, headers: list[str], pid: int, args: argparse.Namespace,
                concurrency: str, out: Path) -> dict:
    cmd = [sys.executable, str(bench / "compare.py"), "--direct-url", args.upstream_url, "--proxy-url", proxy_url,
           "--label", label, "--proxy-pid", str(pid), "--concurrency", concurrency, "--modes", args.modes,
           "-d", str(args.duration), "--load-cpus", "0", "--out", str(out), "--repeats", str(args.repeats)]
    if getattr(args, "upstream_pid", None):  # so compare.py does not count its CPU as another process's
        cmd += ["--upstream-pid", str(args.upstream_pid)]
    # the embedded PostgreSQL is not in the proxy's process tree: compare.py would count its CPU as
    # a disturbance and redo every cell
    cmd += ["--foreign-max", "100"]
    for h in headers:
        cmd += ["--proxy-header", h]
    if args.ttfb:
        cmd.append("--ttfb")
    log("compare.py " + label)
    subprocess.run(cmd, check=True, stdout=sys.stderr)
    return json.loads(out.read_text())


WRK_LUA = r"""
local conversations = {CONVERSATIONS}
local n = 0
function setup(thread)
  n = n + 1
  local c = conversations[(n - 1) % #conversations + 1]
  thread:set("cid", c[1])
  thread:set("parent", c[2])
end
function init(args)
  wrk.headers["X-Conversation-Id"] = cid
  wrk.headers["X-Parent-Node-Id"] = parent
end
wrk.method = "POST"
wrk.body = [[BODY]]
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer KEY"
done = function(summary, latency, requests)
  io.write(string.format('WRKJSON {"requests":%d,"duration_us":%d,"err_status":%d,"err_other":%d,' ..
    '"p50_us":%d,"p90_us":%d,"p99_us":%d}\n', summary.requests, summary.duration, summary.errors.status,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99)))
end
"""


def proc_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def wait_calls_ended(proxy_url: str, timeout: float = 30.0) -> None:
    """Wait until no call is in flight (no pending node in the database, whichever process of the
    proxy holds it). wrk ends a run by closing its connections with
    calls in flight; each such call is finished (``client_disconnected``) only once the proxy saw
    its client go, and until then its conversation's next turn is refused (409 conversation_busy):
    a measurement started at once counted those refusals as errors (seen in bench/versus.py's
    rounds, a handful of its 32 conversations each time it happened)."""
    base = proxy_url.removesuffix("/v1").removesuffix("/auto")
    deadline = time.monotonic() + timeout
    while True:
        text = httpx.get(f"{base}/metrics", timeout=5).text
        m = re.search(r"^branchpoint_pending_nodes ([0-9.e+]+)$", text, re.M)
        if m is None:
            raise SystemExit("wrk: the proxy's /metrics has no branchpoint_pending_nodes")
        if float(m.group(1)) == 0:
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"wrk: calls still in flight {timeout:.0f} s after the warm-up")
        time.sleep(0.05)


def run_wrk_turns(proxy_url: str, convs: list[tuple[str, str]], stream: bool, duration: float, pid: int,
                  data_dir: Path | None = None, extra_pids: list[int] | None = None, key: str = KEY) -> dict:
    """``extra_pids``: more proxy processes (the workers of ``serve --workers N``), counted with ``pid``;
    ``key``: the bearer key sent (another proxy's, for bench/versus.py)."""
    pids = [pid, *(extra_pids or [])]
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Say hello in one short sentence."}],
            "max_tokens": 64, "temperature": 0.2}
    if stream:
        body["stream"] = True
    lua = (WRK_LUA.replace("CONVERSATIONS", ", ".join(f'{{"{c}", "{n}"}}' for c, n in convs))
           .replace("BODY", json.dumps(body)).replace("KEY", key))
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(lua)
    n = len(convs)
    def wrk(seconds: float) -> list[str]:
        return ["taskset", "-c", "0", "wrk", "-t", str(n), "-c", str(n), "-d", f"{int(seconds)}s", "--timeout", "10s",
                "-s", f.name, f"{proxy_url}/chat/completions"]

    # warm-up, then the measurement (the warm-up's wrk must have run: an earlier version passed "2s"
    # as the connection count, wrk refused it, and every run measured a cold start)
    warm = subprocess.run(wrk(2), capture_output=True, text=True, timeout=60)
    if "WRKJSON " not in warm.stdout:
        raise SystemExit(f"wrk (warm-up) failed: {warm.stdout}\n{warm.stderr}")
    if data_dir:  # (Branchpoint: not LiteLLM, which holds no conversation)
        wait_calls_ended(proxy_url)
    cmd = wrk(duration)
    ticks_hz = os.sysconf("SC_CLK_TCK")
    pg_before = postgres_pids(data_dir) if data_dir else []
    pg0 = cpu_ticks(pg_before)
    wal0, commits0 = wal_and_commits(data_dir) if data_dir else (0, 0)
    t0, c0, s0 = time.time(), cpu_ticks(pids), preemptions(pids)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 60)
    time.sleep(0.5)
    t1, c1, s1 = time.time(), cpu_ticks(pids), preemptions(pids)
    pg1 = cpu_ticks(postgres_pids(data_dir)) if data_dir else 0
    wal1, commits1 = wal_and_commits(data_dir) if data_dir else (0, 0)
    os.unlink(f.name)
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("WRKJSON ")), None)
    if line is None:
        raise SystemExit(f"wrk failed: {p.stdout}\n{p.stderr}")
    r = json.loads(line[8:])
    secs = r["duration_us"] / 1e6
    return {
        "concurrency": n, "stream": stream, "requests": r["requests"], "rps": round(r["requests"] / secs, 1),
        "p50_ms": r["p50_us"] / 1000, "p90_ms": r["p90_us"] / 1000, "p99_ms": r["p99_us"] / 1000,
        "errors": r["err_status"] + r["err_other"],
        "errors_status": r["err_status"],  # (answers other than 2xx/3xx; the rest: connect, read, write, timeout)
        "cpu_pct": round((c1 - c0) / ticks_hz / (t1 - t0) * 100, 1),
        "cpu_ms_per_req": round((c1 - c0) / ticks_hz * 1000 / max(1, r["requests"]), 3),
        "preemptions_per_req": round((s1 - s0) / max(1, r["requests"]), 2),
        "rss_mb": round(max(proc_rss_mb(p) for p in pids), 1),
        "postgres_cpu_ms_per_req": round((pg1 - pg0) / ticks_hz * 1000 / max(1, r["requests"]), 3) if data_dir else None,
        # PostgreSQL's WAL and writing transactions (commits) per call: two a call without batched round trips
        "wal_bytes_per_call": round((wal1 - wal0) / max(1, r["requests"])) if data_dir else None,
        "commits_per_call": round((commits1 - commits0) / max(1, r["requests"]), 2) if data_dir else None,
    }


def main() -> None:
    ap = arguments(__doc__, port=14001, up_port=18080)
    ap.add_argument("-d", "--duration", type=float, default=10.0)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--modes", default="nonstream,stream")
    ap.add_argument("--peer", action="store_true", help="also measure LiteLLM with run_peer.sh, in this run")
    ap.add_argument("--ttfb", action="store_true")
    ap.add_argument("--pg-cpus", default="1", help="where the embedded PostgreSQL runs: 1 = on the proxy's core "
                    "(the proxy and its database together on one core, as LiteLLM gets one), 0 = beside the load")
    args = ap.parse_args()
    args.upstream_url = f"http://127.0.0.1:{args.up_port}/v1"
    bench = shared_bench()
    work = Path(tempfile.mkdtemp(prefix="bp-bench-"))
    if not shutil.which("wrk"):
        raise SystemExit("wrk is needed: apt-get install wrk")

    procs = Procs()
    results: dict = {"meta": {"duration_s": args.duration, "path_len": PATH_LEN}}
    try:
        _, proxy, px = start_stack(procs, work, up_port=args.up_port, port=args.port, bench=bench, pg_cpus=args.pg_cpus)
        results["meta"]["pg_cpus"] = args.pg_cpus
        args.upstream_pid = procs.upstream_pid
        log(f"branchpoint pid {px.pid}; seeding 32 conversations x {PATH_LEN} turns")
        convs = seed(proxy, 32)
        results["meta"]["db_statements_per_turn_call"] = round(statements_per_call(proxy, convs[0][0], convs[0][1]), 2)
        log(f"database statements per turn call: {results['meta']['db_statements_per_turn_call']}")

        cid, parent = convs[0]
        common = [f"Authorization: Bearer {KEY}", f"X-Conversation-Id: {cid}", f"X-Parent-Node-Id: {parent}"]
        results["turn_c1"] = run_compare(bench, "branchpoint turn", f"{proxy}/v1", common, px.pid, args, "1",
                                         work / "turn_c1.json")
        results["transform_c32"] = run_compare(bench, "branchpoint transform", f"{proxy}/v1",
                                               [*common, "X-Node-Kind: transform"], px.pid, args, "32",
                                               work / "transform_c32.json")
        results["turn_c32"] = []
        for mode in args.modes.split(","):
            log(f"wrk: 32 conversations, turn calls, {mode}")
            results["turn_c32"].append(run_wrk_turns(f"{proxy}/v1", convs, mode == "stream", args.duration, px.pid,
                                                     work / "data"))
        results["meta"]["proxy_rss_mb_end"] = round(proc_rss_mb(px.pid), 1)
    finally:
        procs.stop()

    if args.peer:
        log("LiteLLM via run_peer.sh (installs it on first use)")
        peer_out = work / "results-litellm.json"
        env = {**os.environ, "DURATION": str(int(args.duration)), "OUT": str(peer_out), "MODES": args.modes,
               "UP_PORT": str(args.up_port), "REPEATS": str(args.repeats)}
        subprocess.run(["bash", str(bench / "run_peer.sh")], env=env, stdout=sys.stderr)
        if peer_out.exists():
            results["litellm"] = json.loads(peer_out.read_text())

    write_result(results, suffix="peer" if args.peer else "", out=args.out)
    print(table(results))


def table(r: dict) -> str:
    rows = ["| scenario | direct p50 ms | proxy p50 ms | added p50 ms | proxy p99 ms | proxy req/s | CPU ms/req | RSS MB | errors |",
            "|---|---|---|---|---|---|---|---|---|"]
    pg = [t.get("postgres_cpu_ms_per_req") for t in r.get("turn_c32", [])]

    def cells(name: str, sc: dict) -> str:
        d, p, res = sc["direct"], sc["proxy"], sc.get("proxy_resources", {})
        return (f"| {name} {sc['name']} | {d['p50_ms']:.3f} | {p['p50_ms']:.3f} | {sc['added_p50_ms']:.3f} | "
                f"{p['p99_ms']:.3f} | {p['rps']:.0f} | {res.get('cpu_ms_per_req', float('nan')):.3f} | "
                f"{res.get('rss_max_mb', float('nan')):.0f} | {p['errors']} |")

    for key in ("turn_c1", "transform_c32"):
        for sc in r.get(key, {}).get("scenarios", []):
            rows.append(cells(key.split("_")[0], sc))
    for t in r.get("turn_c32", []):
        rows.append(f"| turn c32 x 32 conversations {'stream' if t['stream'] else 'non-stream'} | | {t['p50_ms']:.3f} | | "
                    f"{t['p99_ms']:.3f} | {t['rps']:.0f} | {t['cpu_ms_per_req']:.3f} | {t['rss_mb']:.0f} | {t['errors']} |")
    for sc in r.get("litellm", {}).get("scenarios", []):
        rows.append(cells("LiteLLM", sc))
    rows.append("")
    rows.append(f"database statements per turn call: {r['meta'].get('db_statements_per_turn_call')}")
    rows.append(f"PostgreSQL CPU ms per request (turn c32, CPU {r['meta'].get('pg_cpus')}; not in the proxy's column): {pg}")
    m = machine()
    rows.append(f"machine: {m.get('cpus')} x {m.get('cpu')}, caches {m.get('caches')}")
    peer = {sc["name"]: sc for sc in r.get("litellm", {}).get("scenarios", [])}
    ours = {sc["name"]: sc for sc in r.get("turn_c1", {}).get("scenarios", [])}
    if peer and ours:
        rows.append("")
        rows.append("| ratio (ours / LiteLLM, same run) | ours | LiteLLM | ratio |")
        rows.append("|---|---|---|---|")
        for name in ("c1 non-stream", "c1 stream"):
            if name in peer and name in ours:
                a, b = ours[name]["added_p50_ms"], peer[name]["added_p50_ms"]
                rows.append(f"| {name} added p50 ms (turn) | {a:.2f} | {b:.2f} | {a / b:.3f} |")
        ttfb_a = r.get("turn_c1", {}).get("ttfb_c1_stream", {}).get("added_ttfb_p50_ms")
        ttfb_b = r.get("litellm", {}).get("ttfb_c1_stream", {}).get("added_ttfb_p50_ms")
        if ttfb_a and ttfb_b:
            rows.append(f"| c1 stream added time to first byte ms | {ttfb_a:.2f} | {ttfb_b:.2f} | {ttfb_a / ttfb_b:.3f} |")
        for t in r.get("turn_c32", []):
            name = "c32 stream" if t["stream"] else "c32 non-stream"
            if name in peer:
                p = peer[name]
                rows.append(f"| {name} req/s (32 conversations, turns) | {t['rps']:.0f} | {p['proxy']['rps']:.0f} | "
                            f"{t['rps'] / p['proxy']['rps']:.1f}x |")
                cpu_b = p.get("proxy_resources", {}).get("cpu_ms_per_req")
                if cpu_b:
                    both = t["cpu_ms_per_req"] + (t.get("postgres_cpu_ms_per_req") or 0)
                    rows.append(f"| {name} CPU ms per call (ours: proxy + PostgreSQL) | {both:.2f} | {cpu_b:.2f} | "
                                f"1/{cpu_b / both:.1f} |")
    return "\n".join(rows)


if __name__ == "__main__":
    main()
