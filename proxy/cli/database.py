"""The database commands: ``migrate`` (the schema brought up to date), ``backup`` and ``restore``
(pg_dump's custom format), ``check`` (the storage invariants)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from config import MOST_SECONDS

from .common import config_option, console, database, finite, main, run, settings_of

__all__ = ["backup", "check", "migrate", "restore"]


@main.command()
@config_option
def migrate(config_file: str | None) -> None:
    """Apply pending database migrations and exit."""
    from storage import migrate as run_migrations

    settings = settings_of(config_file)
    out = console()

    async def go() -> list[int]:
        async with database(settings, migrated=False) as db:
            with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                          console=console(stderr=True), transient=True) as progress:
                task = progress.add_task("migrating", total=None)

                def step(done: int, total: int, name: str) -> None:
                    progress.update(task, total=total, completed=done, description=f"migrating: {name}")

                # (a connection of its own, as a starting server migrates: no statement timeout --
                # a migration may rebuild an index for minutes, or wait for one running elsewhere)
                return await run_migrations(db.dsn, progress=step)

    applied = run(go())
    out.print(f"applied {len(applied)} migration(s)" + (f": {applied}" if applied else "; the schema is current"))


@main.command()
@click.argument("file", type=click.Path(dir_okay=False, writable=True, path_type=Path))
@config_option
def backup(file: Path, config_file: str | None) -> None:
    """Back the whole database up into FILE (pg_dump's custom format; the embedded database too)."""
    from storage.backup import backup as dump

    if not file.resolve().parent.is_dir():  # (said as "the database failed" once pg_dump could not write it)
        raise click.BadParameter(f"no folder {str(file.resolve().parent)!r} to write it in", param_hint="FILE")
    settings = settings_of(config_file)

    async def go() -> None:
        async with database(settings, migrated=False) as db:
            await dump(db.dsn, file)

    run(go())
    console().print(f"backed up to {file} ({file.stat().st_size:,} bytes)")


@main.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--replace", is_flag=True, help="Replace a database that already holds conversations.")
@config_option
def restore(file: Path, replace: bool, config_file: str | None) -> None:
    """Restore a backup made by `branchpoint backup` into the configured database (stop the proxy
    first), then bring its schema up to date."""
    from storage import migrate as run_migrations
    from storage.backup import restore as load
    from storage.backup import restore_blockers

    settings = settings_of(config_file)

    async def go() -> list[int]:
        async with database(settings, migrated=False) as db:
            async with db.connection() as conn:
                others, conversations = await restore_blockers(conn)
            if others:
                raise click.ClickException(f"{others} other session(s) use the database: stop the proxy (and any "
                                           "other client) before a restore")
            if conversations and not replace:
                raise click.ClickException(f"the database holds {conversations} conversation(s): give --replace to "
                                           "replace them by the backup")
            await load(db.dsn, file)
            async with db.connection() as conn:  # a backup of an older version: its schema made current
                return await run_migrations(conn)

    applied = run(go())
    console().print(f"restored {file}" + (f"; then applied migration(s) {applied}" if applied else ""))


@main.command()
@config_option
@click.option("--grace", default=30.0, show_default=True, type=click.FloatRange(0, MOST_SECONDS), callback=finite,
              help="Seconds past a lease's expiry before a pending node counts as stuck.")
def check(config_file: str | None, grace: float) -> None:
    """Check the storage invariants; exits 1 when any is violated."""
    from proxy.invariants import check_invariants

    settings = settings_of(config_file)

    async def go() -> list[Any]:
        async with database(settings) as db:
            return await check_invariants(db, grace=grace)

    violations = run(go())
    out = console()
    if not violations:
        out.print("[green]ok[/green]: every invariant holds")
        return
    table = Table(title=f"{len(violations)} violation(s)", title_justify="left")
    table.add_column("rule")
    table.add_column("detail")
    for v in violations:
        table.add_row(v.rule, v.detail)
    out.print(table)
    raise SystemExit(1)
