"""Shared pieces of the benchmark scripts: process handling (only what we start is stopped, by
PID) and starting the fake upstream + Branchpoint pinned to separate cores."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from storage.embedded import child_pids

ROOT = Path(__file__).resolve().parent.parent
KEY = "sk-bench-branchpoint"
MODEL = "gpt-4o-mini"


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
    config_file = work / "bench.toml"
    config_file.write_text('[server]\nlog_level = "warning"\n' + config)
    env = {**os.environ, "BRANCHPOINT_DATA_DIR": str(work / "data"), "BRANCHPOINT_UPSTREAM_URL": upstream_url,
           "BRANCHPOINT_CONFIG": str(config_file)}
    env.pop("BRANCHPOINT_DATABASE_URL", None)
    px = procs.start([str(ROOT / ".venv" / "bin" / "branchpoint"), "serve", "--port", str(port), *args], cpus=proxy_cpus,
                     log_file=work / "proxy.log", env=env)
    proxy = f"http://127.0.0.1:{port}"
    wait_http(f"{proxy}/readyz", 60, px)
    if (os.cpu_count() or 1) >= 2:
        pin_postgres(work / "data", pg_cpus)
    return upstream_url, proxy, px


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


async def asgi_body(scope, receive, send) -> bytes | None:
    """For the in-process fake upstreams (ASGI apps): the request's whole body, or None after
    answering a lifespan scope."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            await send({"type": message["type"] + ".complete"})
            if message["type"] == "lifespan.shutdown":
                return None
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body
