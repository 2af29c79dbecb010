"""``branchpoint serve``: the proxy under uvicorn, one process or several workers (sharing the
embedded PostgreSQL, started here, when no database URL is configured)."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import click

from .common import config_option, main, settings_of

__all__ = ["serve"]


@main.command()
@click.option("--host", default=None, help="Interface to listen on (default from config: 127.0.0.1).")
@click.option("--port", default=None, type=click.IntRange(1, 65535), help="Port to listen on (default from config: 8080).")
@config_option
@click.option("--workers", default=1, show_default=True, type=click.IntRange(1, 64),
              help="Worker processes; they share the database safely (leases live in PostgreSQL).")
def serve(host: str | None, port: int | None, config_file: str | None, workers: int) -> None:
    """Serve the proxy. Without a database URL, an embedded PostgreSQL is started."""
    import uvicorn

    from proxy.app import create_app, tune_gc
    from proxy.limits import HeaderTimeoutHttpTools
    from proxy.logs import configure_logging

    settings = settings_of(config_file)
    configure_logging(settings.server.log_level, settings.server.log_format)
    if settings.database.url:
        _require_reachable(settings)
    server = settings.server
    # the embedded server (if any) is started here, before the app: one that cannot start is said in
    # one line (exit 3); the app attaches to it, and several workers share it. Until uvicorn takes
    # the signals over, a SIGTERM ends the start-up through the `finally` that stops it (the
    # default action would leave it running)
    embedded = None
    default_term = signal.signal(signal.SIGTERM, _end_start_up)
    try:
        if not settings.database.url:
            from storage import StorageError, migrate, start_embedded

            try:
                embedded = start_embedded(settings.database.data_dir or None,
                                          batch_scheduling=settings.database.embedded_batch_scheduling)
            except StorageError as exc:
                click.echo(f"Error: {exc}", err=True)
                raise SystemExit(_STARTUP_FAILURE) from None
            if workers > 1:
                os.environ["BRANCHPOINT_DATABASE_URL"] = embedded.uri
                asyncio.run(migrate(embedded.uri))
        if workers > 1 and config_file:
            os.environ["BRANCHPOINT_CONFIG"] = os.path.abspath(config_file)
        config = uvicorn.Config(
            create_app(settings) if workers == 1 else "proxy.app:app_from_environment", factory=workers > 1,
            workers=workers, host=host or server.host, port=port or server.port, log_config=None, access_log=False,
            loop="uvloop", http=HeaderTimeoutHttpTools, timeout_graceful_shutdown=server.shutdown_grace_seconds,
            # what the ASGI server guards (docs/behaviour.md#limits-and-hostile-peers): idle keep-alive
            # connections close after 5 s, at most max_connections connections and requests (more: 503)
            timeout_keep_alive=5, limit_concurrency=server.max_connections,
        )
        config.client_header_timeout = server.client_header_timeout  # read by HeaderTimeoutHttpTools
        signal.signal(signal.SIGTERM, default_term)  # (uvicorn's from here: it restores and raises this one)
        if workers == 1:
            tune_gc()
            uvicorn.Server(config).run()
        else:
            supervisor = _supervisor(config)
            supervisor.run()
            if any(process.exitcode == _STARTUP_FAILURE for process in supervisor.processes):
                raise SystemExit(_STARTUP_FAILURE)  # (a worker could not start: not a clean stop)
    finally:
        signal.signal(signal.SIGTERM, default_term)  # (a start-up that failed: the handler is not left behind)
        if embedded:
            embedded.stop()


def _end_start_up(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # (what a shell reports for a process a signal ended)


_STARTUP_FAILURE = 3  # uvicorn's exit code for a server that could not start (one process exits so)


def _require_reachable(settings: Any) -> None:
    """A configured database that cannot be reached is said in one line, naming where it was looked
    for (never the password), and the server does not start (exit 3, as uvicorn's own start-up
    failure) -- found later, by the app's start-up, it was a traceback forty lines long."""
    from urllib.parse import urlsplit

    from .common import database

    async def probe() -> None:
        async with database(settings, migrated=False):
            pass

    try:
        asyncio.run(probe())
    except click.ClickException as exc:
        try:
            parts = urlsplit(settings.database.url)
            where = f" at {parts.hostname}:{parts.port or 5432}" if parts.hostname else ""
        except ValueError:
            where = ""
        click.echo(f"Error: {exc.message.replace('cannot reach the database', f'cannot reach the database{where}', 1)}",
                   err=True)
        raise SystemExit(_STARTUP_FAILURE) from None


def _supervisor(config: Any) -> Any:
    """uvicorn's supervisor of several workers, closing its copy of the listening socket as the
    shutdown begins: the workers close theirs as they stop listening, so new connections are
    refused from the signal on, as with one process -- the parent's copy kept the socket open,
    and a new connection hung until the grace ran out (docs/behaviour.md#shutdown)."""
    from uvicorn.supervisors import Multiprocess

    class Supervisor(Multiprocess):
        def terminate_all(self) -> None:
            for sock in self.sockets:
                sock.close()
            super().terminate_all()

    return Supervisor(config, sockets=[config.bind_socket()])
