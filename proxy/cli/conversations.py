"""The commands that move conversations: ``conversations export`` (a tree as JSON Lines),
``conversations import`` (an export re-created) and ``conversations prune`` (idle ones deleted)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from config import MOST_SECONDS

from .common import config_option, console, conversations, database, find_conversation, finite, run, settings_of

__all__ = ["export", "import_", "prune"]


@conversations.command("prune")
@config_option
@click.option("--idle-days", type=click.FloatRange(min=0, min_open=True, max=MOST_SECONDS // 86400), default=None,
              callback=finite,
              help="Delete conversations idle this many days (default: [retention] idle_days).")
@click.option("--dry-run", is_flag=True, help="Only count what would be deleted.")
def prune(config_file: str | None, idle_days: float | None, dry_run: bool) -> None:
    """Delete conversations idle for a while, with their nodes (what a fork still reaches stays)."""
    from proxy.retention import idle_since
    from proxy.retention import prune as prune_idle
    from storage import OpsStore

    settings = settings_of(config_file)
    days = idle_days if idle_days is not None else settings.retention.idle_days
    if days <= 0:
        raise click.UsageError("give --idle-days (or set [retention] idle_days in the configuration)")

    async def go() -> str:
        async with database(settings) as db:
            ops = OpsStore(db)
            if dry_run:
                count, nodes = await ops.idle(idle_since(days))
                return f"{count} conversation(s) idle for {days:g} day(s), {nodes} node(s); nothing deleted (--dry-run)"
            done = await prune_idle(ops, days, settings.retention.batch)
            return (f"deleted {done.conversations} conversation(s) idle for {days:g} day(s): {done.deleted} node(s) "
                    f"deleted, {done.kept} kept for forks")

    console().print(run(go()))


@conversations.command("export")
@click.argument("conversation_id")
@config_option
@click.option("--tenant", default=None, help="The conversation's tenant (needed when the id exists for several).")
@click.option("--output", "-o", default="-", type=click.Path(dir_okay=False, allow_dash=True),
              help="File to write (default: standard output); opened once the conversation is found, written "
                   "as the export goes (one that fails midway, the database gone, leaves what it wrote).")
def export(conversation_id: str, config_file: str | None, tenant: str | None, output: str) -> None:
    """The whole tree as JSON Lines: one object per node, oldest first, parent ids kept."""
    from proxy.transfer import export_lines

    settings = settings_of(config_file)

    async def go() -> int:
        async with database(settings) as db:
            store, conv = await find_conversation(db, conversation_id, tenant)
            # the output is opened once the conversation is found: a mistyped id leaves no empty
            # file a backup script would take for an empty conversation (nor empties one there)
            with _opened(output) as write, Progress(
                    TextColumn("exporting"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=console(stderr=True), transient=True, disable=output == "-") as progress:
                count = 0
                task = progress.add_task("export", total=conv.node_count)
                async for line in export_lines(store, conv):
                    write(line)
                    count += 1
                    progress.update(task, completed=count)
            return count

    count = run(go())
    if output != "-":
        console(stderr=True).print(f"exported {count} node(s) to {output}")


@contextmanager
def _opened(output: str) -> Iterator[Callable[[bytes], Any]]:
    """Where an export writes: standard output (``-``), else the file (a link followed, a pipe or
    ``/dev/stdout`` written as it is) -- one that cannot be opened is a message, not a traceback."""
    if output == "-":
        yield sys.stdout.buffer.write
        sys.stdout.flush()
        return
    try:
        fh = Path(output).open("wb")  # noqa: SIM115 - closed by the with below, once the open is known to have worked
    except OSError as exc:
        raise click.ClickException(f"cannot write {output}: {exc.strerror}") from None
    with fh:
        yield fh.write


@conversations.command("import")
@click.argument("file", type=click.File("rb"))
@click.option("--as", "conversation_id", required=True, help="The id of the new conversation.")
@click.option("--tenant", default=None, help="The tenant that will own it.")
@click.option("--key", default=None, help="Or: an API key of that tenant, read as the configured auth mode reads it.")
@config_option
def import_(file: Any, conversation_id: str, tenant: str | None, key: str | None, config_file: str | None) -> None:
    """Re-create an exported tree as a new conversation (new node ids; nothing else changes)."""
    from proxy.auth import Authenticator
    from proxy.builder import RequestBuilder
    from proxy.errors import BranchpointError
    from proxy.ids import valid_conversation_id
    from proxy.transfer import NotAnExport, prepare_import, reverify
    from proxy.upstream import UpstreamClient
    from storage import AdminStore, SharedItems, TreeStore

    if (tenant is None) == (key is None):
        raise click.ClickException("name the owner with exactly one of --tenant and --key")
    if tenant is not None and not tenant.strip():  # (no key's tenant is empty: nobody could reach it)
        raise click.ClickException("--tenant is empty: name the tenant that will own the conversation")
    settings = settings_of(config_file)
    if tenant is None:  # the key's tenant as the proxy reads it, in the configured auth mode
        try:
            tenant = Authenticator(settings.auth)(None, key).tenant
        except BranchpointError as exc:
            raise click.ClickException(f"--key: {exc.message}") from None
    try:
        valid_conversation_id(conversation_id, source="--as")
    except BranchpointError as exc:
        raise click.ClickException(exc.message) from None
    try:
        prepared = prepare_import(file.read())
    except NotAnExport as exc:
        raise click.ClickException(f"not an export this proxy can import: {exc}") from None

    async def go() -> int | None:
        async with database(settings) as db:
            upstream = UpstreamClient(settings)  # (what a request is rebuilt for: nothing is sent)
            try:
                reverify(prepared, RequestBuilder(TreeStore(db)), upstream)
            finally:
                await upstream.aclose()
            shared = SharedItems(db, min_bytes=settings.database.share_items_above)
            return await AdminStore(db, shared).import_tree(tenant, conversation_id, prepared.nodes, prepared.head,
                                                            prepared.compactions, metadata=prepared.metadata,
                                                            created_at=prepared.created_at)

    written = run(go())
    if written is None:
        raise click.ClickException(f"conversation {conversation_id!r} already exists for that tenant")
    console().print(f"imported {written} node(s) as {conversation_id!r} (tenant {tenant[:16]})")
