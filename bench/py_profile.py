"""Where the proxy's own CPU goes under load: ``py-spy`` samples the proxy process while wrk drives
32 conversations (c=32, non-stream or stream, PostgreSQL pinned with the proxy as in run.py), then
prints the functions with the most samples -- their own (self) and with what they call (total).

    uv run python bench/py_profile.py [-d 20] [--stream] [--rate 500] [--top 40]

py-spy pauses the process for each sample (``--native`` adds C and Cython frames): the figures
are shares, not times, and a system call (a socket write, ``os.urandom``) weighs more in them than
it costs. The wrk figures printed are of the sampled process, slower than unsampled.

Needs ``py-spy`` (``uvx py-spy``, fetched from PyPI on first use) and permission to ptrace the
proxy (root, or kernel.yama.ptrace_scope = 0)."""

from __future__ import annotations

import collections
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _harness import Procs, arguments, log, shared_bench, start_stack, write_result
from run import run_wrk_turns, seed


def _frame(text: str) -> tuple[str, str]:
    """py-spy's ``name (file:line)`` -> (``name file``, the package or own folder it is in)."""
    name, _, where = text.rpartition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0] if name else text
    name = name or text
    if "site-packages/" in path:
        package = path.split("site-packages/", 1)[1].split("/", 1)[0]
    elif "/lib/python3" in path or path.startswith("<"):
        package = "python"
    else:
        package = path.split("/", 1)[0] if "/" in path else "proxy/routes"
    return f"{name.split()[-1]} {path.rsplit('/', 1)[-1]}", package


def summarise(raw: Path, top: int) -> dict:
    """py-spy's collapsed stacks -> the ``top`` functions by own and by total samples, and the own
    samples by package, as shares of the event loop thread's samples (other threads -- an idle
    thread pool -- are left out)."""
    own: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    packages: collections.Counter[str] = collections.Counter()
    samples = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";") if stack else []
        if not frames or any(f.startswith("Thread._bootstrap") for f in frames[:2]):
            continue
        n = int(count)
        samples += n
        named = [_frame(f) for f in frames]
        own[named[-1][0]] += n
        packages[named[-1][1]] += n
        for name in {f for f, _ in named}:
            total[name] += n
    for name in [f for f, n in total.items() if n == samples]:  # (the loop's own frames: in every sample)
        del total[name]

    def pct(c: collections.Counter[str], k: int) -> list[tuple[str, float]]:
        return [(f, round(100 * n / samples, 1)) for f, n in c.most_common(k)]
    return {"samples": samples, "own_pct": pct(own, top), "total_pct": pct(total, top),
            "own_by_package_pct": pct(packages, 20)}


def main() -> None:
    ap = arguments(__doc__, port=14095, up_port=18095)
    ap.add_argument("-d", "--duration", type=float, default=20.0)
    ap.add_argument("--stream", action="store_true")
    ap.add_argument("--rate", type=int, default=500, help="py-spy samples per second")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--native", action="store_true", help="C and Cython frames too (pauses the process per sample)")
    ap.add_argument("--stacks", default=None, help="keep py-spy's collapsed stacks in this file")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bp-pyprof-"))
    procs = Procs()
    try:
        _, proxy, px = start_stack(procs, work, up_port=args.up_port, port=args.port, bench=shared_bench(),
                                   pg_cpus="1")
        convs = seed(proxy, args.concurrency)
        native = ["--native"] if args.native else []
        raw = Path(args.stacks) if args.stacks else work / "stacks.txt"
        spy = subprocess.Popen(["uvx", "py-spy", "record", "--pid", str(px.pid), "--rate", str(args.rate),
                                "--format", "raw", *native, "--duration", str(int(args.duration) + 3),
                                "-o", str(raw)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        result = run_wrk_turns(f"{proxy}/v1", convs, args.stream, args.duration, px.pid, work / "data")
        spy.wait(timeout=120)
        if not raw.exists():
            raise SystemExit(f"py-spy wrote nothing: {spy.stderr.read().decode()[-2000:]}")
        figures = {"wrk": {k: result.get(k) for k in ("rps", "cpu_ms_per_req", "postgres_cpu_ms_per_req")},
                   **summarise(raw, args.top)}
        log(f"req/s {figures['wrk']['rps']}, proxy CPU ms/call {figures['wrk']['cpu_ms_per_req']}, "
            f"PostgreSQL {figures['wrk']['postgres_cpu_ms_per_req']}; {figures['samples']} samples")
        for key in ("own_by_package_pct", "own_pct", "total_pct"):
            print(f"\n{key}:")
            for f, p in figures[key]:
                print(f"  {p:5.1f}  {f}")
        write_result(figures, suffix="stream" if args.stream else "", out=args.out)
    finally:
        procs.stop()


if __name__ == "__main__":
    main()
