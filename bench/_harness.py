"""Shared pieces of the benchmark scripts: process handling (only what we start is stopped, by
PID), starting the fake upstream + Branchpoint pinned to separate cores, and the dated result
files under bench/results/."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from storage.embedded import child_pids

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # (the tests' fakes serve the benches too)
    sys.path.insert(0, str(ROOT))
from tests.fakes import asgi_body as asgi_body  # (a fake upstream's request body, or None after a lifespan scope)

KEY = "sk-bench-branchpoint"
MODEL = "gpt-4o-mini"
RESULTS = ROOT / "bench" / "results"
STARTED = time.gmtime()  # when the script started (this module is imported first): its result file's date


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def shared_bench() -> Path:
    for candidate in (os.environ.get("BENCH_SHARED"), ROOT.parent / "shared" / "bench", ROOT.parent.parent / "shared" / "bench"):
        if candidate and (Path(candidate) / "compare.py").exists():
            return Path(candidate)
    raise SystemExit("shared bench not found: set BENCH_SHARED to the folder with compare.py")


class Procs:
    def __init__(self) -> None:
        self.pids: list[int] = []
        self.upstream_pid: int | None = None  # the fake upstream's (start_stack)

    def start(self, cmd: list[str], *, cpus: str | None, log_file: Path, env: dict[str, str] | None = None,
              cwd: Path | None = None) -> subprocess.Popen:
        if cpus and shutil.which("taskset") and (os.cpu_count() or 1) >= 2:
            cmd = ["taskset", "-c", cpus, *cmd]
        proc = subprocess.Popen(cmd, stdout=log_file.open("w"), stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                start_new_session=True)
        self.pids.append(proc.pid)
        return proc

    def stop(self) -> None:
        for pid in reversed(self.pids):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.time() + 20
        for pid in reversed(self.pids):
            while time.time() < deadline:
                try:
                    if os.waitpid(pid, os.WNOHANG)[0]:
                        break
                except ChildProcessError:
                    break
                time.sleep(0.1)
            else:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def wait_http(url: str, timeout: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"process for {url} exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} did not come up in {timeout} s")


def start_branchpoint(procs: Procs, work: Path, *, port: int, upstream_url: str, config: str = "",
                      args: tuple[str, ...] = (), cpus: str | None = "1", database_url: str | None = None,
                      name: str = "proxy", tree: Path = ROOT) -> tuple[str, subprocess.Popen]:
    """``branchpoint serve`` as a process of its own on ``cpus``, with an embedded PostgreSQL in
    ``work`` unless ``database_url`` is given; ``config``: more TOML after ``[server]``'s
    ``log_level``; ``args``: more ``serve`` arguments; ``tree``: the checkout whose build runs (its
    ``.venv``: bench/ab.py compares two). Returns (its URL, its process) once ready."""
    config_file = work / "bench.toml"
    config_file.write_text('[server]\nlog_level = "warning"\n' + config)
    env = {**os.environ, "BRANCHPOINT_UPSTREAM_URL": upstream_url, "BRANCHPOINT_CONFIG": str(config_file)}
    if database_url:
        env["BRANCHPOINT_DATABASE_URL"] = database_url
    else:
        env["BRANCHPOINT_DATA_DIR"] = str(work / "data")
        env.pop("BRANCHPOINT_DATABASE_URL", None)
    px = procs.start([str(tree / ".venv" / "bin" / "branchpoint"), "serve", "--port", str(port), *args], cpus=cpus,
                     log_file=work / f"{name}.log", env=env)
    proxy = f"http://127.0.0.1:{port}"
    wait_http(f"{proxy}/readyz", 60, px)
    return proxy, px


def start_stack(procs: Procs, work: Path, *, up_port: int, port: int, bench: Path, config: str = "",
                args: tuple[str, ...] = (), proxy_cpus: str = "1", pg_cpus: str = "0") -> tuple[str, str, subprocess.Popen]:
    """Fake upstream on CPU 0, Branchpoint on ``proxy_cpus``, its embedded PostgreSQL (in ``work``)
    on ``pg_cpus``. ``config``: more TOML for Branchpoint; ``args``: more ``serve`` arguments.
    Returns (upstream base URL, proxy URL, proxy process)."""
    upstream_url = f"http://127.0.0.1:{up_port}/v1"
    up = procs.start([sys.executable, str(bench / "fake_upstream.py"), "--port", str(up_port)], cpus="0",
                     log_file=work / "upstream.log")
    procs.upstream_pid = up.pid
    wait_http(f"{upstream_url}/models", 20, up)
    proxy, px = start_branchpoint(procs, work, port=port, upstream_url=upstream_url, config=config, args=args,
                                  cpus=proxy_cpus)
    if (os.cpu_count() or 1) >= 2:
        pin_postgres(work / "data", pg_cpus)
    return upstream_url, proxy, px


def serve_in_thread(app, port: int):
    """An in-process fake upstream (an ASGI app) served by uvicorn on 127.0.0.1:``port`` from a
    daemon thread; returns the server (set ``should_exit`` to stop it) once it answers."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, lifespan="on"))
    threading.Thread(target=server.run, daemon=True).start()
    wait_http(f"http://127.0.0.1:{port}/v1/x", 20)
    return server


def arguments(doc: str | None, *, port: int | None = None, up_port: int | None = None) -> argparse.ArgumentParser:
    """A script's argument parser: its docstring as the help, ``--out`` (see ``write_result``) and,
    when given, ``--port`` / ``--up-port`` with these defaults."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None,
                    help="the result file (default: bench/results/<YYYY-MM-DD>-<script>[-suffix].json)")
    if port is not None:
        ap.add_argument("--port", type=int, default=port)
    if up_port is not None:
        ap.add_argument("--up-port", type=int, default=up_port)
    return ap


def timed_post(http: httpx.Client, url: str, body: bytes, headers: dict[str, str], stream: bool = False) -> float:
    """Milliseconds for one POST of ``body`` until its whole answer is read (streamed or not);
    raises on an error status."""
    t0 = time.perf_counter()
    if stream:
        with http.stream("POST", url, content=body, headers=headers) as r:
            for _ in r.iter_bytes():
                pass
            r.raise_for_status()
    else:
        http.post(url, content=body, headers=headers).raise_for_status()
    return (time.perf_counter() - t0) * 1000


def _git(*args: str) -> str | None:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10,
                              check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def command_line() -> str:
    """How this script was started, as one would type it from the repository's root."""
    script = Path(sys.argv[0]).resolve()
    try:
        script_arg = str(script.relative_to(ROOT))
    except ValueError:
        script_arg = sys.argv[0]
    prefix = "uv run python" if os.environ.get("UV_RUN_RECURSION_DEPTH") else "python"
    return f"{prefix} {shlex.join([script_arg, *sys.argv[1:]])}"


def write_result(figures: dict, *, suffix: str = "", out: str | Path | None = None, script: str | None = None) -> Path:
    """Write a run's figures as ``bench/results/<YYYY-MM-DD>-<script>[-suffix].json`` (the date the
    script started, UTC; ``-2``, ``-3`` ... when that name is taken), or to ``out``, with what they
    were measured on, the command line and the git commit. Returns the path."""
    script = script or Path(sys.argv[0]).stem
    if out is None:
        name = f"{time.strftime('%Y-%m-%d', STARTED)}-{script}" + (f"-{suffix}" if suffix else "")
        path, n = RESULTS / f"{name}.json", 1
        while path.exists():
            n += 1
            path = RESULTS / f"{name}-{n}.json"
    else:
        path = Path(out)
    status = _git("status", "--porcelain", "--untracked-files=no")
    doc = {"script": script, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", STARTED),
           "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": command_line(),
           "commit": _git("rev-parse", "HEAD"), "uncommitted_changes": bool(status) if status is not None else None,
           "machine": machine(), "figures": figures}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")
    log(f"results: {path}")
    return path


def machine() -> dict:
    """What the figures were measured on: ratios to another proxy move with the machine (8.6x
    LiteLLM's req/s on one 2-core machine, 5.4x on another of the same kind), so every result file
    records it."""
    info: dict = {"cpus": os.cpu_count()}
    try:
        info["cpu"] = next(ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                           if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    caches = {}
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            level, kind, size = ((index / name).read_text().strip() for name in ("level", "type", "size"))
        except OSError:
            continue
        caches[f"L{level}" + ("" if kind == "Unified" else kind[0].lower())] = size
    info["caches"] = caches
    return info


def cores_busy(seconds: float = 1.0) -> list[float]:
    """Each core's busy share (%) over ``seconds``, from /proc/stat: taken before anything of the
    bench starts, it is whatever else the machine runs -- a stray load skews every figure."""
    def sample() -> list[tuple[int, int]]:
        out = []
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith("cpu") and line[3:4].isdigit():
                ticks = [int(x) for x in line.split()[1:]]
                idle = ticks[3] + ticks[4]  # idle + iowait
                out.append((sum(ticks) - idle, sum(ticks)))
        return out
    before = sample()
    time.sleep(seconds)
    after = sample()
    return [round(100 * (b1 - b0) / max(1, t1 - t0), 1) for (b0, t0), (b1, t1) in zip(before, after, strict=True)]


def busy_before(warning: str) -> list[float]:
    """How busy each core is before a bench starts, logged -- with ``warning`` when one is more
    than a tenth busy (something else runs)."""
    busy = cores_busy()
    log(f"cores busy before the bench starts, %: {busy}")
    if max(busy) > 10:
        log(f"WARNING: the machine is not idle -- something else runs; {warning}")
    return busy


def postgres_pids(data_dir: Path) -> list[int]:
    """The embedded PostgreSQL's postmaster and its children (backends, writer, WAL ...)."""
    pid_file = data_dir / "pgdata" / "postmaster.pid"
    if not pid_file.exists():
        return []
    master = int(pid_file.read_text().split()[0])
    return [master, *child_pids(master)]


def postgres_dsn(data_dir: Path) -> str:
    """A superuser connection string for the embedded PostgreSQL of a stack (from its pid file)."""
    lines = (data_dir / "pgdata" / "postmaster.pid").read_text().split("\n")
    return f"postgresql://postgres@/postgres?host={lines[4]}&port={int(lines[3])}"  # host: the socket directory


def wal_and_commits(data_dir: Path) -> tuple[int, int]:
    """The embedded PostgreSQL's WAL position (bytes) and the next transaction id: the difference
    of two readings counts the transactions that wrote in between (each ends in a commit -- or an
    abort), exactly and at once, where the statistics views lag by up to a second."""
    import asyncio

    import asyncpg

    async def read() -> tuple[int, int]:
        conn = await asyncpg.connect(postgres_dsn(data_dir))
        try:
            wal = await conn.fetchval("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')")
            commits = await conn.fetchval("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint")
            return int(wal), int(commits)
        finally:
            await conn.close()

    return asyncio.run(read())


def pin_postgres(data_dir: Path, cpus: str) -> list[int]:
    """Move PostgreSQL off the proxy's core (new backends inherit the postmaster's affinity):
    the database is a service of its own, as in production; its CPU is reported apart."""
    pids = postgres_pids(data_dir)
    for pid in pids:
        subprocess.run(["taskset", "-a", "-c", "-p", cpus, str(pid)], capture_output=True)
    return pids


def cpu_ticks(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total


def preemptions(pids: list[int]) -> int:
    """How often the kernel took the CPU from these processes while they could still run
    (involuntary context switches): a proxy and a database sharing a core alternate per statement
    under Linux's default policy (docs/scaling.md#the-embedded-database)."""
    total = 0
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        total += sum(int(line.split()[1]) for line in status.splitlines() if line.startswith("nonvoluntary_ctxt_switches"))
    return total
