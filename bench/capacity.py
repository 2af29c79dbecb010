#!/usr/bin/env python3
"""Capacity for sizing a deployment (docs/scaling.md): stored calls per second, the proxy's and
PostgreSQL's CPU per call, and the WAL bytes PostgreSQL writes per call -- with one worker (proxy
and database sharing one core) and with ``serve --workers 2`` (both cores, shared with the load).

    uv run python bench/capacity.py [-d 10] [--workers 1,2] [--scheduling batch,normal] [--batching on,off]

Load: wrk with 32 connections making turn calls on 32 conversations whose paths are 20 nodes
long, against the fast fake upstream (0 ms). RSS is the largest proxy process's. ``--scheduling``:
the embedded PostgreSQL's scheduling policy (``[database] embedded_batch_scheduling``, batch by
default; docs/scaling.md#the-embedded-database) -- with both, each worker count runs both ways,
alternating fresh stacks ``--repeats`` times. ``--batching``: batched round trips (``[database]
batch_calls``, on by default; docs/architecture.md#batched-round-trips) on, off or both, alike.
PostgreSQL's commits per call show how many calls shared a transaction (two each without batching).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import Procs, arguments, log, shared_bench, start_stack, write_result
from run import run_wrk_turns, seed

from storage.embedded import child_pids


def rss_soak(calls: int) -> dict:
    """RSS of one worker under 32 concurrent streams, sampled every 20 s until ``calls`` were made."""
    from run import proc_rss_mb

    work = Path(tempfile.mkdtemp(prefix="bp-rss-"))
    procs = Procs()
    samples: list[tuple[int, float]] = []
    try:
        _, proxy, px = start_stack(procs, work, up_port=18088, port=14008, bench=shared_bench(), pg_cpus="1")
        convs = seed(proxy, 32)
        done = 0
        samples.append((0, proc_rss_mb(px.pid)))
        while done < calls:
            r = run_wrk_turns(f"{proxy}/v1", convs, True, 20, px.pid, work / "data")
            done += r["requests"] + r["rps"] * 2  # the 2 s warm-up before each measurement counts too
            samples.append((int(done), proc_rss_mb(px.pid)))
            log(f"rss: {int(done)} calls, {samples[-1][1]:.0f} MB, errors {r['errors']}")
    finally:
        procs.stop()
    return {"calls": int(samples[-1][0]), "samples": samples, "first_mb": samples[1][1] if len(samples) > 1 else None,
            "last_mb": samples[-1][1], "max_mb": max(s for _, s in samples)}


def main() -> None:
    ap = arguments(__doc__)
    ap.add_argument("-d", "--duration", type=float, default=10.0)
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--scheduling", default="batch", help="batch, normal or both (comma-separated)")
    ap.add_argument("--batching", default="on", help="on, off or both (comma-separated)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--rss-calls", type=int, default=0,
                    help="then (one worker) stream this many calls at c=32 and sample the proxy's RSS as it goes")
    args = ap.parse_args()
    results: dict = {"runs": []}
    policies = args.scheduling.split(",")
    batching = args.batching.split(",")
    runs = [(int(w), p, b) for w in args.workers.split(",") for _ in range(args.repeats) for p in policies
            for b in batching]
    for workers, policy, batched in runs:
        work = Path(tempfile.mkdtemp(prefix=f"bp-capacity-{workers}-"))
        procs = Procs()
        cpus = "1" if workers == 1 else "0,1"
        config = (f"[database]\nembedded_batch_scheduling = {str(policy == 'batch').lower()}\n"
                  f"batch_calls = {str(batched == 'on').lower()}\n")
        try:
            _, proxy, px = start_stack(procs, work, up_port=18087, port=14007, bench=shared_bench(),
                                       args=("--workers", str(workers)) if workers > 1 else (),
                                       proxy_cpus=cpus, pg_cpus=cpus, config=config)
            convs = seed(proxy, 32)
            row: dict = {"workers": workers, "scheduling": policy, "batching": batched, "proxy_cpus": cpus,
                         "postgres_cpus": cpus}
            for stream in (False, True):
                # with several workers the supervisor's children do the work: count all of them
                r = run_wrk_turns(f"{proxy}/v1", convs, stream, args.duration, px.pid, work / "data",
                                  extra_pids=child_pids(px.pid))
                row["stream" if stream else "nonstream"] = r
                log(f"workers {workers} ({policy}, batching {batched}) {'stream' if stream else 'non-stream'}: "
                    f"{r['rps']:.0f} calls/s, proxy {r['cpu_ms_per_req']:.2f} + PostgreSQL "
                    f"{r['postgres_cpu_ms_per_req']:.2f} CPU ms/call, {r['preemptions_per_req']} preemptions/call, "
                    f"WAL {r['wal_bytes_per_call']} B/call, {r['commits_per_call']} commits/call, RSS {r['rss_mb']} MB")
            results["runs"].append(row)
        finally:
            procs.stop()
    if args.rss_calls:
        results["rss"] = rss_soak(args.rss_calls)
    write_result(results, out=args.out)
    print("| workers | PostgreSQL scheduling | batching | cores (proxy + PostgreSQL) | mode | stored calls/s "
          "| proxy CPU ms/call | PostgreSQL CPU ms/call | proxy preemptions/call | WAL bytes/call | commits/call |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for row in results["runs"]:
        for mode in ("nonstream", "stream"):
            r = row[mode]
            print(f"| {row['workers']} | {row['scheduling']} | {row['batching']} | {row['proxy_cpus']} | {mode} | "
                  f"{r['rps']:.0f} | {r['cpu_ms_per_req']:.2f} | {r['postgres_cpu_ms_per_req']:.2f} | "
                  f"{r['preemptions_per_req']} | {r['wal_bytes_per_call']} | {r['commits_per_call']} |")
    if "rss" in results:
        rss = results["rss"]
        print(f"RSS under 32 concurrent streams: {rss['first_mb']:.0f} MB after the first 20 s, {rss['last_mb']:.0f} MB "
              f"after {rss['calls']} calls, at most {rss['max_mb']:.0f} MB")


if __name__ == "__main__":
    main()
