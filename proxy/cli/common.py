"""What every ``branchpoint`` command shares: the click group (``main``) and the ``conversations``
group, the ``--config`` option, the settings, the console, a small pool on the database, running
a command's coroutine, and finding a conversation by id."""

from __future__ import annotations

import asyncio
import math
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import click
from rich.console import Console

from config import Settings, SettingsError, load_settings

__all__ = ["config_option", "console", "conversations", "database", "find_conversation", "finite", "main", "run",
           "settings_of"]

config_option = click.option("--config", "config_file", default=None, type=click.Path(dir_okay=False),
                              help="TOML config file (also BRANCHPOINT_CONFIG).")


def settings_of(config_file: str | None) -> Settings:
    try:
        return load_settings(config_file)
    except SettingsError as exc:
        raise click.ClickException(str(exc)) from None


def console(stderr: bool = False) -> Console:
    return Console(stderr=stderr, highlight=False, soft_wrap=False, width=None if sys.stdout.isatty() else 160)


@asynccontextmanager
async def database(settings: Settings, *, migrated: bool = True) -> AsyncIterator[Any]:
    """A small pool on the configured database (or the embedded one), closed afterwards.
    ``migrated``: the command needs the schema this version made (every one but those that make
    or copy it) -- a database without it is said so, with what to run, not met with a failing
    query ("relation ... does not exist")."""
    from storage import StorageError, open_database

    d = settings.database
    try:
        db = await open_database(d.url, d.data_dir, min_size=1, max_size=2, connect_timeout=d.connect_timeout,
                                 command_timeout=d.command_timeout, batch_scheduling=d.embedded_batch_scheduling)
    except StorageError as exc:
        raise click.ClickException(f"cannot reach the database: {exc}") from None
    try:
        if migrated:
            await _require_schema(db)
        yield db
    finally:
        await db.close()


async def _require_schema(db: Any) -> None:
    from storage.migrate import applied_versions, latest_version

    async with db.connection() as conn:
        applied = await applied_versions(conn)
    latest = latest_version()
    if not applied:
        raise click.ClickException("the database holds no Branchpoint schema: run `branchpoint migrate` first "
                                   "(`branchpoint serve` migrates too)")
    if max(applied) < latest:
        raise click.ClickException(f"the database schema is at version {max(applied)}, this Branchpoint needs "
                                   f"{latest}: run `branchpoint migrate` first")


def finite(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    """A click callback: a number option's value is a number (nan passes any range: no comparison
    with it holds; a range's bound keeps out inf)."""
    if value is not None and not math.isfinite(value):
        raise click.BadParameter(f"{value} is not a number", ctx=ctx, param=param)
    return value


def run(coro: Any) -> Any:
    from storage import StorageError

    try:
        return asyncio.run(coro)
    except KeyboardInterrupt:  # pragma: no cover
        raise SystemExit(130) from None
    except StorageError as exc:  # a database that went away or took too long: said, not a traceback
        raise click.ClickException(f"the database failed: {exc}") from None


@click.group()
@click.version_option(package_name="branchpoint")
def main() -> None:
    """Branchpoint: an OpenAI-compatible proxy that stores every call as a node of a conversation tree."""


@main.group()
def conversations() -> None:
    """Inspect, export, import and prune stored conversations."""


async def find_conversation(db: Any, conversation_id: str, tenant: str | None) -> Any:
    from storage import AdminStore

    store = AdminStore(db)
    if tenant is None:
        tenants = await store.tenants_of(conversation_id)
        if not tenants:
            raise click.ClickException(f"no conversation {conversation_id!r}")
        if len(tenants) > 1:
            raise click.ClickException(f"{conversation_id!r} exists for several tenants; pick one with --tenant: "
                                       + ", ".join(tenants))
        tenant = tenants[0]
    conv = await store.conversation(tenant, conversation_id)
    if conv is None:
        raise click.ClickException(f"no conversation {conversation_id!r} for tenant {tenant!r}")
    return store, conv
