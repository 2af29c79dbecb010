#!/usr/bin/env python3
"""Where PostgreSQL's CPU for a stored call goes: ``bench/pg_calls.py``'s begin + finish pairs
(one connection, 32 conversations with 20-node paths, path cache on) for ``--seconds``, while
``perf record`` samples the backend with DWARF call graphs; then the share of samples under a few
telling frames (commit and WAL flush, executor start-up of the functions' statements, index
maintenance, the text-search index's expression, CHECK constraints and generated columns read
again per statement ...).

    uv run python bench/pg_profile.py [--seconds 10]

Needs ``perf`` (Debian's linux-perf) with permission to sample another process. Shares, not
times: a loaded machine changes the time per pair more than where it goes.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _harness import arguments, write_result
from pg_calls import warm_store

FRAMES = {
    "CommitTransaction": "commit",
    "XLogFlush": "of which the WAL flush",
    "standard_ExecutorStart": "executor start-up of a statement",
    "ExecInsertIndexTuples": "index maintenance",
    "jsonb_to_tsvector_byid": "of which the text-search index's expression",
    "stringToNode": "stored expressions read again (CHECK constraints, generated column)",
    "ExecInsert": "INSERT",
    "ExecUpdate": "UPDATE",
    "populate_record": "jsonb_populate_record (the start and finish contracts)",
    "plpgsql_exec_function": "inside the functions",
}


async def record(seconds: float, data: Path) -> int:
    async with warm_store("bp-pg-profile-") as warm:
        perf = subprocess.Popen(["perf", "record", "-F", "500", "--call-graph", "dwarf,16384", "-e", "cpu-clock",
                                 "-p", str(warm.pid), "-o", str(data)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        await asyncio.sleep(1)
        pairs, end = 0, time.monotonic() + seconds
        while time.monotonic() < end:
            await warm.pair()
            pairs += 1
        perf.send_signal(signal.SIGINT)
        perf.wait()
        return pairs


def stacks(data: Path) -> list[list[str]]:
    """Each sample's frames (function names, innermost first)."""
    text = subprocess.run(["perf", "script", "-i", str(data)], capture_output=True, text=True, check=True).stdout
    out: list[list[str]] = []
    current: list[str] | None = None
    for line in text.splitlines():
        if line and not line[0].isspace():
            if current:
                out.append(current)
            current = []
        elif line.strip() and current is not None:
            parts = line.split(None, 1)
            if len(parts) > 1:
                current.append(parts[1].split("+")[0].split(" (")[0])
    if current:
        out.append(current)
    return out


def main() -> None:
    ap = arguments(__doc__)
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bp-perf-") as tmp:
        data = Path(tmp) / "perf.data"
        pairs = asyncio.run(record(args.seconds, data))
        samples = stacks(data)
        os.remove(data)
    shares = {f"{frame} ({what})": round(100 * sum(1 for s in samples if frame in s) / max(len(samples), 1), 1)
              for frame, what in FRAMES.items()}
    result = {"pairs": pairs, "samples": len(samples), "share_of_backend_cpu_percent": shares}
    for name, share in shares.items():
        print(f"{share:5.1f} %  {name}")
    write_result(result, out=args.out)


if __name__ == "__main__":
    main()
