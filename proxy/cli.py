"""The ``branchpoint`` command."""

from __future__ import annotations

import asyncio
import os
import sys

import click

from config import SettingsError, load_settings

__all__ = ["main"]


def _settings(config_file: str | None):
    try:
        return load_settings(config_file)
    except SettingsError as exc:
        raise click.ClickException(str(exc)) from None


@click.group()
@click.version_option(package_name="branchpoint")
def main() -> None:
    """Branchpoint: an OpenAI-compatible proxy that stores every call as a node of a conversation tree."""


@main.command()
@click.option("--host", default=None, help="Interface to listen on (default from config: 127.0.0.1).")
@click.option("--port", default=None, type=int, help="Port to listen on (default from config: 8080).")
@click.option("--config", "config_file", default=None, type=click.Path(dir_okay=False),
              help="TOML config file (also BRANCHPOINT_CONFIG).")
@click.option("--workers", default=1, show_default=True, type=click.IntRange(1, 64),
              help="Worker processes; they share the database safely.")
def serve(host: str | None, port: int | None, config_file: str | None, workers: int) -> None:
    """Serve the proxy. Without a database URL, an embedded PostgreSQL is started."""
    import uvicorn

    from proxy.app import create_app
    from proxy.logs import configure_logging

    settings = _settings(config_file)
    configure_logging(settings.server.log_level, settings.server.log_format)
    host = host or settings.server.host
    port = port or settings.server.port
    embedded = None
    if workers > 1:
        if not settings.database.url:
            from storage import migrate, start_embedded

            embedded = start_embedded(settings.database.data_dir or None)
            os.environ["BRANCHPOINT_DATABASE_URL"] = embedded.uri
            asyncio.run(migrate(embedded.uri))
        if config_file:
            os.environ["BRANCHPOINT_CONFIG"] = os.path.abspath(config_file)
        try:
            uvicorn.run("proxy.app:app_from_environment", factory=True, host=host, port=port, workers=workers,
                        log_config=None, access_log=False, loop="uvloop", http="httptools")
        finally:
            if embedded:
                embedded.stop()
        return
    uvicorn.run(create_app(settings), host=host, port=port, log_config=None, access_log=False,
                loop="uvloop", http="httptools", timeout_graceful_shutdown=30)


@main.command()
@click.option("--config", "config_file", default=None, type=click.Path(dir_okay=False))
def migrate(config_file: str | None) -> None:
    """Apply pending database migrations and exit."""
    from storage import migrate as run_migrations
    from storage import start_embedded

    settings = _settings(config_file)
    embedded = None
    url = settings.database.url
    if not url:
        embedded = start_embedded(settings.database.data_dir or None)
        url = embedded.uri
    try:
        applied = asyncio.run(run_migrations(url))
    finally:
        if embedded:
            embedded.stop()
    click.echo(f"applied {len(applied)} migration(s)" + (f": {applied}" if applied else "; schema is current"))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
