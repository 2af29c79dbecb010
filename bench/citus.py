#!/usr/bin/env python3
"""Branchpoint on Citus against one PostgreSQL, on this machine (docs/scaling.md): stored calls
per second and CPU per call -- the proxy's and the database servers' (every node's processes
together) -- with 1 and 2 proxy processes; and what a fan-out costs: ``/auto/v1`` discovery
(a conversation found by content across the tenant: every shard) against the same full-history
call in a named conversation (one shard), one call at a time.

    uv run python bench/citus.py [-d 8] [--workers 1,2] [--topologies single,citus] [--auto-calls 300]

Topologies, both PostgreSQL 15 (Debian's binaries; Citus 13.2.2 built by ../shared/citus/build.sh):
- ``single``: one PostgreSQL server (initdb'd here, fsync on, as cluster.sh configures its nodes;
  no Citus), the schema migrated; batched round trips on (the default) -- and ``single-unbatched``
  with them off, the round trips Citus gets;
- ``citus``: a coordinator and two workers (../shared/citus/cluster.sh), ``branchpoint migrate`` and
  ``branchpoint distribute`` (32 shards, the default), the proxy connected to the coordinator.

Load as bench/capacity.py: wrk with 32 connections making turn calls on 32 conversations whose
paths are 20 nodes long, against the fast fake upstream (0 ms); wrk and the upstream on CPU 0.
Each proxy process opens its whole pool at start (``--pool``: pool_min = pool_max = 20) and every
measured window follows ``--warmup`` seconds of the same load: on Citus a burst of fresh
connections at once -- each running asyncpg's type introspection on the coordinator -- collapsed
throughput to a few calls a second for a while (seen with a 2 s warm-up and a cold pool). One
proxy process: it and every database server on CPU 1 (they share one core, as in capacity.py); two
(``serve --workers 2``): all on both cores. Everything runs on this one 2-core machine: a worker
here is another server on the same cores, not more hardware.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import KEY, MODEL, ROOT, Procs, arguments, cpu_ticks, log, shared_bench, start_branchpoint, wait_http, write_result
from run import WRK_LUA, seed

from storage.embedded import child_pids

PGBIN = "/usr/lib/postgresql/15/bin"


def _shared() -> Path:
    for candidate in (os.environ.get("BRANCHPOINT_SHARED"), ROOT.parent / "shared", ROOT.parent.parent / "shared"):
        if candidate and (Path(candidate) / "citus" / "cluster.sh").exists():
            return Path(candidate)
    raise SystemExit("../shared/citus not found: set BRANCHPOINT_SHARED")


def _as_postgres(cmd: str) -> None:
    full = ["su", "postgres", "-s", "/bin/bash", "-c", cmd] if os.getuid() == 0 else ["bash", "-c", cmd]
    subprocess.run(full, check=True, capture_output=True)


def _psql(port: int, sql: str, db: str = "postgres") -> str:
    return subprocess.run(["psql", "-qAt", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "-d", db, "-c", sql],
                          check=True, capture_output=True, text=True).stdout.strip()


class Servers:
    """The database servers of a topology, started in ``work``, stopped by ``stop``."""

    def __init__(self, kind: str, work: Path, port: int) -> None:
        self.kind, self.work, self.port = kind, work, port
        self.dirs: list[Path] = []
        work.mkdir(parents=True, exist_ok=True)
        if os.getuid() == 0:
            subprocess.run(["chown", "postgres", str(work)], check=True)
        if kind == "citus":
            subprocess.run(["bash", str(_shared() / "citus" / "build.sh")], check=True, capture_output=True)
            subprocess.run(["bash", str(_shared() / "citus" / "cluster.sh"), "start", str(work / "c"), str(port), "2"],
                           check=True, capture_output=True)
            self.dirs = [work / "c" / str(port + i) for i in range(3)]
            for p in range(port, port + 3):
                _psql(p, "CREATE DATABASE branchpoint")
                _psql(p, "CREATE EXTENSION citus", "branchpoint")
            _psql(port, f"SELECT citus_set_coordinator_host('127.0.0.1', {port})", "branchpoint")
            for p in (port + 1, port + 2):
                _psql(port, f"SELECT citus_add_node('127.0.0.1', {p})", "branchpoint")
        else:
            d = work / str(port)
            _as_postgres(f"{PGBIN}/initdb -D '{d}' -A trust -U postgres >/dev/null")
            (d / "postgresql.conf").open("a").write("max_connections = 200\nfsync = on\n")
            _as_postgres(f"{PGBIN}/pg_ctl -D '{d}' -w -o '-p {port} -k {work} -c listen_addresses=127.0.0.1' "
                         f"-l '{work}/{port}.log' start >/dev/null")
            self.dirs = [d]
            _psql(port, "CREATE DATABASE branchpoint")
        self.url = f"postgresql://postgres@127.0.0.1:{port}/branchpoint"
        env = {**os.environ, "BRANCHPOINT_DATABASE_URL": self.url}
        bp = str(ROOT / ".venv" / "bin" / "branchpoint")
        subprocess.run([bp, "migrate"], env=env, check=True, capture_output=True)
        if kind == "citus":
            out = subprocess.run([bp, "distribute"], env=env, check=True, capture_output=True, text=True).stdout
            log(out.strip())

    def pids(self, only: Path | None = None) -> list[int]:
        out = []
        for d in self.dirs:
            pid_file = d / "postmaster.pid"
            if (only is None or d == only) and pid_file.exists():
                master = int(pid_file.read_text().split()[0])
                out += [master, *child_pids(master)]
        return out

    def pin(self, cpus: str) -> None:
        for pid in self.pids():
            subprocess.run(["taskset", "-a", "-c", "-p", cpus, str(pid)], capture_output=True)

    def stop(self) -> None:
        for d in self.dirs:
            if (d / "postmaster.pid").exists():
                try:
                    _as_postgres(f"{PGBIN}/pg_ctl -D '{d}' -m fast stop >/dev/null")
                except subprocess.CalledProcessError:
                    pass


def wrk_window(proxy_url: str, convs: list[tuple[str, str]], stream: bool, duration: float, proxy_pid: int,
               servers: Servers, warmup: float) -> dict:
    """wrk at c=len(convs) (``warmup`` seconds of it first), the CPU of the proxy processes and of every database
    server's processes over the measured window alone (processes listed at both ends: backends
    opened meanwhile count from zero)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Say hello in one short sentence."}],
            "max_tokens": 64, "temperature": 0.2, **({"stream": True} if stream else {})}
    lua = (WRK_LUA.replace("CONVERSATIONS", ", ".join(f'{{"{c}", "{n}"}}' for c, n in convs))
           .replace("BODY", json.dumps(body)).replace("KEY", KEY))
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(lua)
    n = len(convs)

    def wrk(seconds: float) -> dict:
        p = subprocess.run(["taskset", "-c", "0", "wrk", "-t", str(n), "-c", str(n), "-d", f"{int(seconds)}s",
                            "--timeout", "10s", "-s", f.name, f"{proxy_url}/chat/completions"],
                           capture_output=True, text=True, timeout=seconds + 60)
        line = next((ln for ln in p.stdout.splitlines() if ln.startswith("WRKJSON ")), None)
        if line is None:
            raise SystemExit(f"wrk failed: {p.stdout}\n{p.stderr}")
        return json.loads(line[8:])

    def proxies() -> list[int]:
        return [proxy_pid, *child_pids(proxy_pid)]

    try:
        wrk(warmup)
        hz = os.sysconf("SC_CLK_TCK")
        nodes0 = [cpu_ticks(servers.pids(d)) for d in servers.dirs]
        px0, t0 = cpu_ticks(proxies()), time.time()
        r = wrk(duration)
        time.sleep(0.5)
        px1, t1 = cpu_ticks(proxies()), time.time()
        nodes1 = [cpu_ticks(servers.pids(d)) for d in servers.dirs]
        db0, db1 = sum(nodes0), sum(nodes1)
    finally:
        os.unlink(f.name)
    calls = max(1, r["requests"])
    return {"stream": stream, "concurrency": n, "requests": r["requests"],
            "rps": round(r["requests"] / (r["duration_us"] / 1e6), 1),
            "p50_ms": r["p50_us"] / 1000, "p99_ms": r["p99_us"] / 1000, "errors": r["err_status"] + r["err_other"],
            "cpu_ms_per_req": round((px1 - px0) / hz * 1000 / calls, 3),
            "db_cpu_ms_per_req": round((db1 - db0) / hz * 1000 / calls, 3),
            # each server's share (the coordinator first, then the workers; one entry for one PostgreSQL)
            "db_cpu_ms_per_req_by_node": [round((b - a) / hz * 1000 / calls, 3) for a, b in zip(nodes0, nodes1, strict=True)],
            "cores_busy": round(((px1 - px0) + (db1 - db0)) / hz / (t1 - t0), 2)}


def auto_discovery(proxy: str, calls: int) -> dict:
    """One call at a time: a full-history call found by content (/auto/v1: no conversation named,
    every shard probed) against the same call in a named conversation (its tree: one shard)."""
    out = {}
    with httpx.Client(base_url=proxy, headers={"Authorization": f"Bearer {KEY}"}, timeout=30) as http:
        for label, path, headers in (("auto", "/auto/v1/chat/completions", {}),
                                     ("named", "/v1/chat/completions", {"X-Context-Mode": "full"})):
            first = [{"role": "user", "content": f"where is {label} {uuid.uuid4().hex}?"}]
            if label == "named":
                headers = {**headers, "X-Conversation-Id": f"named-{uuid.uuid4().hex[:8]}"}
            r = http.post(path, headers=headers, json={"model": MODEL, "messages": first})
            r.raise_for_status()
            history = [*first, {"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]}]
            samples = []
            for i in range(calls + 20):
                body = {"model": MODEL, "messages": [*history, {"role": "user", "content": f"and then {i}?"}]}
                t0 = time.perf_counter()
                r = http.post(path, headers=headers, json=body)
                elapsed = (time.perf_counter() - t0) * 1000
                r.raise_for_status()
                assert r.headers["x-context-matched"] == "2", r.headers
                if i >= 20:  # warm-up
                    samples.append(elapsed)
            samples.sort()
            out[label] = {"calls": calls, "p50_ms": round(statistics.median(samples), 3),
                          "p90_ms": round(samples[int(len(samples) * 0.9)], 3)}
            log(f"{label}: p50 {out[label]['p50_ms']} ms, p90 {out[label]['p90_ms']} ms")
    return out


def main() -> None:
    ap = arguments(__doc__)
    ap.add_argument("-d", "--duration", type=float, default=8.0)
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--topologies", default="single,single-unbatched,citus")
    ap.add_argument("--auto-calls", type=int, default=300)
    ap.add_argument("--conversations", type=int, default=32, help="wrk connections, one conversation each")
    ap.add_argument("--pool", type=int, default=20, help="[database] pool_min = pool_max of each proxy process")
    ap.add_argument("--warmup", type=float, default=6.0, help="seconds of load before each measured window")
    args = ap.parse_args()
    results: dict = {"runs": [], "auto": {}}
    for topology in args.topologies.split(","):
        work = Path(tempfile.mkdtemp(prefix=f"bp-citus-{topology}-"))
        os.chmod(work, 0o755)
        servers = Servers("citus" if topology == "citus" else "single", work / "db", 25400)
        procs = Procs()
        try:
            up_port = 18091
            upstream_url = f"http://127.0.0.1:{up_port}/v1"
            up = procs.start([sys.executable, str(shared_bench() / "fake_upstream.py"), "--port", str(up_port)],
                             cpus="0", log_file=work / "upstream.log")
            procs.upstream_pid = up.pid
            wait_http(f"{upstream_url}/models", 20, up)
            for workers in (int(w) for w in args.workers.split(",")):
                cpus = "1" if workers == 1 else "0,1"
                servers.pin(cpus)
                config = f"[database]\nbatch_calls = {str(topology != 'single-unbatched').lower()}\npool_min = {args.pool}\npool_max = {args.pool}\n"
                proxy, px = start_branchpoint(procs, work, port=14090 + workers, upstream_url=upstream_url,
                                              config=config, cpus=cpus, database_url=servers.url,
                                              args=("--workers", str(workers)) if workers > 1 else (),
                                              name=f"proxy-{workers}")
                convs = seed(proxy, args.conversations)
                row: dict = {"topology": topology, "workers": workers, "cpus": cpus}
                for stream in (False, True):
                    r = wrk_window(f"{proxy}/v1", convs, stream, args.duration, px.pid, servers, args.warmup)
                    row["stream" if stream else "nonstream"] = r
                    log(f"{topology}, {workers} proxy process(es), {'stream' if stream else 'non-stream'}: "
                        f"{r['rps']:.0f} calls/s, proxy {r['cpu_ms_per_req']:.2f} + database "
                        f"{r['db_cpu_ms_per_req']:.2f} CPU ms/call (by node {r['db_cpu_ms_per_req_by_node']}), "
                        f"p50 {r['p50_ms']:.1f} ms, errors {r['errors']}")
                if workers == 1 and topology != "single-unbatched" and args.auto_calls:
                    results["auto"][topology] = auto_discovery(proxy, args.auto_calls)
                results["runs"].append(row)
                px.terminate()
                try:
                    px.wait(60)
                except subprocess.TimeoutExpired:  # (its calls' outcomes still being stored: ours, by PID)
                    os.killpg(px.pid, 9)
                    px.wait(10)
                procs.pids.remove(px.pid)
        finally:
            procs.stop()
            servers.stop()
            shutil.rmtree(work, ignore_errors=True)  # (ours: made by this run)
    write_result(results, out=args.out)
    print("| topology | proxy processes | cores | mode | stored calls/s | proxy CPU ms/call | database CPU ms/call | p50 ms |")
    print("|---|---|---|---|---|---|---|---|")
    for row in results["runs"]:
        for mode in ("nonstream", "stream"):
            r = row[mode]
            print(f"| {row['topology']} | {row['workers']} | {row['cpus']} | {mode} | {r['rps']:.0f} | "
                  f"{r['cpu_ms_per_req']:.2f} | {r['db_cpu_ms_per_req']:.2f} | {r['p50_ms']:.1f} |")
    for topology, auto in results["auto"].items():
        print(f"{topology}: /auto/v1 p50 {auto['auto']['p50_ms']} ms (p90 {auto['auto']['p90_ms']}), "
              f"named full-history p50 {auto['named']['p50_ms']} ms (p90 {auto['named']['p90_ms']})")


if __name__ == "__main__":
    main()
