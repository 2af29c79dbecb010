"""The ``branchpoint`` command: serve, migrate, inspect conversations, check the database.

Every command reads the same configuration as the server (``--config`` / ``BRANCHPOINT_CONFIG``,
``BRANCHPOINT_DATABASE_URL`` ...). Without a database URL the embedded PostgreSQL of the data
directory is used -- attached to if ``serve`` is running on it, started otherwise.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import click
import msgspec
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from config import Settings, SettingsError, load_settings
from proxy.routes.admin import exported, usage_window

__all__ = ["main"]

_config_option = click.option("--config", "config_file", default=None, type=click.Path(dir_okay=False),
                              help="TOML config file (also BRANCHPOINT_CONFIG).")


def _settings(config_file: str | None) -> Settings:
    try:
        return load_settings(config_file)
    except SettingsError as exc:
        raise click.ClickException(str(exc)) from None


def _console(stderr: bool = False) -> Console:
    return Console(stderr=stderr, highlight=False, soft_wrap=False, width=None if sys.stdout.isatty() else 160)


@asynccontextmanager
async def _database(settings: Settings) -> AsyncIterator[Any]:
    """A small pool on the configured database (or the embedded one), closed afterwards."""
    from storage import StorageError, open_database

    d = settings.database
    try:
        db = await open_database(d.url, d.data_dir, min_size=1, max_size=2, connect_timeout=d.connect_timeout,
                                 command_timeout=d.command_timeout, batch_scheduling=d.embedded_batch_scheduling)
    except StorageError as exc:
        raise click.ClickException(f"cannot reach the database: {exc}") from None
    try:
        yield db
    finally:
        await db.close()


def _run(coro: Any) -> Any:
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


# -- serve ------------------------------------------------------------------------------------


@main.command()
@click.option("--host", default=None, help="Interface to listen on (default from config: 127.0.0.1).")
@click.option("--port", default=None, type=int, help="Port to listen on (default from config: 8080).")
@_config_option
@click.option("--workers", default=1, show_default=True, type=click.IntRange(1, 64),
              help="Worker processes; they share the database safely (leases live in PostgreSQL).")
def serve(host: str | None, port: int | None, config_file: str | None, workers: int) -> None:
    """Serve the proxy. Without a database URL, an embedded PostgreSQL is started."""
    import uvicorn

    from proxy.app import create_app, tune_gc
    from proxy.limits import HeaderTimeoutHttpTools
    from proxy.logs import configure_logging

    settings = _settings(config_file)
    configure_logging(settings.server.log_level, settings.server.log_format)
    server = settings.server
    # several workers: the embedded server (if any) is started once, here, and shared
    embedded = None
    if workers > 1 and not settings.database.url:
        from storage import migrate, start_embedded

        embedded = start_embedded(settings.database.data_dir or None,
                                  batch_scheduling=settings.database.embedded_batch_scheduling)
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
    try:
        if workers == 1:
            tune_gc()
            uvicorn.Server(config).run()
        else:
            from uvicorn.supervisors import Multiprocess

            Multiprocess(config, sockets=[config.bind_socket()]).run()
    finally:
        if embedded:
            embedded.stop()


# -- migrate ----------------------------------------------------------------------------------


@main.command()
@_config_option
def migrate(config_file: str | None) -> None:
    """Apply pending database migrations and exit."""
    from storage import migrate as run_migrations

    settings = _settings(config_file)
    console = _console()

    async def go() -> list[int]:
        async with _database(settings) as db:
            with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                          console=_console(stderr=True), transient=True) as progress:
                task = progress.add_task("migrating", total=None)

                def step(done: int, total: int, name: str) -> None:
                    progress.update(task, total=total, completed=done, description=f"migrating: {name}")

                async with db.connection() as conn:
                    return await run_migrations(conn, progress=step)

    applied = _run(go())
    console.print(f"applied {len(applied)} migration(s)" + (f": {applied}" if applied else "; the schema is current"))


# -- usage ------------------------------------------------------------------------------------


@main.command()
@_config_option
@click.option("--since", type=click.DateTime(), default=None, help="From (inclusive, UTC; default: 30 days before --until).")
@click.option("--until", type=click.DateTime(), default=None, help="To (exclusive, UTC; default: now).")
@click.option("--tenant", default=None, help="Only this tenant (default: every tenant, each apart).")
def usage(config_file: str | None, since: datetime | None, until: datetime | None, tenant: str | None) -> None:
    """Tokens by tenant and model of the calls made in a time range (as GET /admin/usage counts them)."""
    from proxy.errors import BranchpointError
    from storage import AdminStore, UsageRow

    settings = _settings(config_file)
    try:
        start, end = usage_window(since, until)
    except BranchpointError as exc:
        raise click.UsageError(f"--{exc.param}: {exc.message}") from None

    async def go() -> list[Any]:
        async with _database(settings) as db:
            return await AdminStore(db).usage(tenant, start, end)

    rows = _run(go())
    table = Table(title=f"usage {start:%Y-%m-%d %H:%M} .. {end:%Y-%m-%d %H:%M} UTC", title_justify="left")
    for column in ("tenant", "model", "calls", "prompt", "completion", "total"):
        table.add_column(column, justify="left" if column in ("tenant", "model") else "right")
    for r in rows:
        table.add_row(r.tenant[:16], r.model or "-", f"{r.calls:,}", f"{r.prompt_tokens:,}", f"{r.completion_tokens:,}",
                      f"{r.total_tokens:,}")
    total = UsageRow.total_of(rows)
    table.add_row("all", "", f"{total.calls:,}", f"{total.prompt_tokens:,}", f"{total.completion_tokens:,}",
                  f"{total.total_tokens:,}", style="bold")
    _console().print(table)


# -- backup and restore -----------------------------------------------------------------------


@main.command()
@click.argument("file", type=click.Path(dir_okay=False, writable=True, path_type=Path))
@_config_option
def backup(file: Path, config_file: str | None) -> None:
    """Back the whole database up into FILE (pg_dump's custom format; the embedded database too)."""
    from storage.backup import backup as dump

    settings = _settings(config_file)

    async def go() -> None:
        async with _database(settings) as db:
            await dump(db.dsn, file)

    _run(go())
    _console().print(f"backed up to {file} ({file.stat().st_size:,} bytes)")


@main.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--replace", is_flag=True, help="Replace a database that already holds conversations.")
@_config_option
def restore(file: Path, replace: bool, config_file: str | None) -> None:
    """Restore a backup made by `branchpoint backup` into the configured database (stop the proxy
    first), then bring its schema up to date."""
    from storage import migrate as run_migrations
    from storage.backup import restore as load
    from storage.backup import restore_blockers

    settings = _settings(config_file)

    async def go() -> list[int]:
        async with _database(settings) as db:
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

    applied = _run(go())
    _console().print(f"restored {file}" + (f"; then applied migration(s) {applied}" if applied else ""))


# -- conversations ----------------------------------------------------------------------------


@main.group()
def conversations() -> None:
    """Inspect, export, import and prune stored conversations."""


async def _find(db: Any, conversation_id: str, tenant: str | None) -> Any:
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


def _short(value: Any, width: int = 8) -> str:
    return str(value)[-width:] if value else "-"


def _when(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value else "-"


@conversations.command("list")
@_config_option
@click.option("--tenant", default=None, help="Only this tenant's conversations.")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 10_000))
def list_conversations(config_file: str | None, tenant: str | None, limit: int) -> None:
    """List conversations, newest first."""
    from storage import AdminStore

    settings = _settings(config_file)

    async def go() -> list[Any]:
        async with _database(settings) as db:
            return await AdminStore(db).conversations(tenant, after=None, limit=limit)

    rows = _run(go())
    table = Table(title=f"{len(rows)} conversation(s)", title_justify="left")
    for column in ("tenant", "conversation", "nodes", "tokens", "head", "busy", "created", "updated"):
        table.add_column(column, justify="right" if column in ("nodes", "tokens") else "left")
    for r in rows:
        table.add_row(r.tenant[:16], r.id, str(r.node_count), f"{r.total_tokens:,}", _short(r.head_node_id),
                      "yes" if r.busy else "", _when(r.created_at), _when(r.updated_at))
    _console().print(table)


@conversations.command("prune")
@_config_option
@click.option("--idle-days", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Delete conversations idle this many days (default: [retention] idle_days).")
@click.option("--dry-run", is_flag=True, help="Only count what would be deleted.")
def prune(config_file: str | None, idle_days: float | None, dry_run: bool) -> None:
    """Delete conversations idle for a while, with their nodes (what a fork still reaches stays)."""
    from storage import OpsStore

    from .retention import idle_since
    from .retention import prune as prune_idle

    settings = _settings(config_file)
    days = idle_days if idle_days is not None else settings.retention.idle_days
    if days <= 0:
        raise click.UsageError("give --idle-days (or set [retention] idle_days in the configuration)")

    async def go() -> str:
        async with _database(settings) as db:
            ops = OpsStore(db)
            if dry_run:
                count, nodes = await ops.idle(idle_since(days))
                return f"{count} conversation(s) idle for {days:g} day(s), {nodes} node(s); nothing deleted (--dry-run)"
            done = await prune_idle(ops, days, settings.retention.batch)
            return (f"deleted {done.conversations} conversation(s) idle for {days:g} day(s): {done.deleted} node(s) "
                    f"deleted, {done.kept} kept for forks")

    _console().print(_run(go()))


def _label(node: Any, head: Any, on_path: set[Any]) -> Text:
    usage = node.usage or {}
    tokens = usage.get("total_tokens") or (usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0))
    status_style = {"success": "green", "failed": "red", "pending": "yellow"}.get(node.status, "")
    text = Text()
    text.append(_short(node.id), style="bold" if node.id in on_path else "dim")
    text.append(f" {node.kind}", style="cyan" if node.kind != "turn" else "")
    text.append(f" {node.status}", style=status_style)
    if node.model:
        text.append(f" {node.model}", style="magenta")
    if tokens:
        text.append(f" {tokens} tok", style="dim")
    preview = " ".join(str(node.preview or "").split())
    if preview:
        text.append(f"  {preview[:60]}{'…' if len(preview) > 60 else ''}")
    if node.kind == "compaction":
        text.append(f"  (replaces …{_short(node.compacted_from)})", style="cyan")
    if node.id == head:
        text.append("  ◀ head", style="bold yellow")
    return text


@conversations.command("show")
@click.argument("conversation_id")
@_config_option
@click.option("--tenant", default=None, help="The conversation's tenant (needed when the id exists for several).")
def show(conversation_id: str, config_file: str | None, tenant: str | None) -> None:
    """Draw a conversation's tree: branches, the head, each node's kind, status, model, tokens."""
    settings = _settings(config_file)

    async def go() -> tuple[Any, list[Any], list[Any]]:
        async with _database(settings) as db:
            store, conv = await _find(db, conversation_id, tenant)
            return conv, await store.tree(conv), await store.path(conv)

    conv, nodes, path = _run(go())
    head = conv.head_node_id
    on_path = {n.id for n in path}
    children: dict[Any, list[Any]] = {}
    ids = {n.id for n in nodes}
    roots = []
    for n in nodes:
        if n.parent_id is None or n.parent_id not in ids:
            roots.append(n)
        else:
            children.setdefault(n.parent_id, []).append(n)
    title = Text(f"{conv.id}", style="bold")
    title.append(f"  tenant {conv.tenant[:16]}  {len(nodes)} node(s)  head …{_short(head)}", style="dim")
    tree = Tree(title)

    def add(branch: Tree, node: Any) -> None:
        # a straight line of single children is drawn flat, so a long turn stays readable
        current = branch.add(_label(node, head, on_path))
        kids = children.get(node.id, [])
        while len(kids) == 1:
            node = kids[0]
            current = branch.add(_label(node, head, on_path))
            kids = children.get(node.id, [])
        for kid in kids:
            add(current, kid)

    for root in roots:
        add(tree, root)
    _console().print(tree)


@conversations.command("export")
@click.argument("conversation_id")
@_config_option
@click.option("--tenant", default=None, help="The conversation's tenant (needed when the id exists for several).")
@click.option("--output", "-o", default="-", type=click.Path(dir_okay=False, allow_dash=True),
              help="File to write (default: standard output).")
def export(conversation_id: str, config_file: str | None, tenant: str | None, output: str) -> None:
    """The whole tree as JSON Lines: one object per node, oldest first, parent ids kept."""
    settings = _settings(config_file)
    encoder = msgspec.json.Encoder()

    async def go(write: Callable[[bytes], Any]) -> int:
        async with _database(settings) as db:
            store, conv = await _find(db, conversation_id, tenant)
            total = conv.node_count
            count = 0
            with Progress(TextColumn("exporting"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                          console=_console(stderr=True), transient=True, disable=output == "-") as progress:
                task = progress.add_task("export", total=total)
                async for row in store.export(conv):
                    write(encoder.encode(exported(row, conv.head_node_id)) + b"\n")
                    count += 1
                    progress.update(task, completed=count)
            return count

    if output == "-":
        count = _run(go(sys.stdout.buffer.write))
        sys.stdout.flush()
    else:
        with Path(output).open("wb") as fh:
            count = _run(go(fh.write))
        _console(stderr=True).print(f"exported {count} node(s) to {output}")


@conversations.command("import")
@click.argument("file", type=click.File("rb"))
@click.option("--as", "conversation_id", required=True, help="The id of the new conversation.")
@click.option("--tenant", default=None, help="The tenant that will own it.")
@click.option("--key", default=None, help="Or: the API key of that tenant (passthrough mode hashes it into the tenant).")
@_config_option
def import_(file: Any, conversation_id: str, tenant: str | None, key: str | None, config_file: str | None) -> None:
    """Re-create an exported tree as a new conversation (new node ids; nothing else changes)."""
    from proxy.auth import key_hash
    from proxy.errors import BranchpointError
    from proxy.routes.common import valid_conversation_id
    from proxy.transfer import NotAnExport, prepare_import
    from storage import AdminStore

    if (tenant is None) == (key is None):
        raise click.ClickException("name the owner with exactly one of --tenant and --key")
    tenant = tenant or f"t_{key_hash(key or '')[:32]}"
    try:
        valid_conversation_id(conversation_id, source="--as")
    except BranchpointError as exc:
        raise click.ClickException(exc.message) from None
    try:
        prepared = prepare_import(file.read())
    except NotAnExport as exc:
        raise click.ClickException(f"not an export this proxy can import: {exc}") from None
    settings = _settings(config_file)

    async def go() -> int | None:
        async with _database(settings) as db:
            return await AdminStore(db).import_tree(tenant, conversation_id, prepared.nodes, prepared.head,
                                                    prepared.compactions)

    written = _run(go())
    if written is None:
        raise click.ClickException(f"conversation {conversation_id!r} already exists for that tenant")
    _console().print(f"imported {written} node(s) as {conversation_id!r} (tenant {tenant[:16]})")


# -- check ------------------------------------------------------------------------------------


@main.command()
@_config_option
@click.option("--grace", default=30.0, show_default=True, type=float,
              help="Seconds past a lease's expiry before a pending node counts as stuck.")
def check(config_file: str | None, grace: float) -> None:
    """Check the storage invariants; exits 1 when any is violated."""
    from proxy.invariants import check_invariants

    settings = _settings(config_file)

    async def go() -> list[Any]:
        async with _database(settings) as db:
            return await check_invariants(db, grace=grace)

    violations = _run(go())
    console = _console()
    if not violations:
        console.print("[green]ok[/green]: every invariant holds")
        return
    table = Table(title=f"{len(violations)} violation(s)", title_justify="left")
    table.add_column("rule")
    table.add_column("detail")
    for v in violations:
        table.add_row(v.rule, v.detail)
    console.print(table)
    raise SystemExit(1)


if __name__ == "__main__":  # pragma: no cover
    main()
