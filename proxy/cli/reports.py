"""What the command line shows of the stored data: ``usage`` (tokens by tenant and model),
``conversations list`` (a table) and ``conversations show`` (a conversation's tree drawn)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import click
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from ..admin_objects import usage_window
from .common import config_option, console, conversations, database, find_conversation, main, run, settings_of

__all__ = ["list_conversations", "show", "usage"]


@main.command()
@config_option
@click.option("--since", type=click.DateTime(), default=None, help="From (inclusive, UTC; default: 30 days before --until).")
@click.option("--until", type=click.DateTime(), default=None, help="To (exclusive, UTC; default: now).")
@click.option("--tenant", default=None, help="Only this tenant (default: every tenant, each apart).")
def usage(config_file: str | None, since: datetime | None, until: datetime | None, tenant: str | None) -> None:
    """Tokens by tenant and model of the calls made in a time range (as GET /admin/usage counts them)."""
    from proxy.errors import BranchpointError
    from storage import AdminStore, UsageRow

    settings = settings_of(config_file)
    try:
        start, end = usage_window(since, until)
    except BranchpointError as exc:
        raise click.UsageError(f"--{exc.param}: {exc.message}") from None

    async def go() -> list[Any]:
        async with database(settings) as db:
            return await AdminStore(db).usage(tenant, start, end)

    rows = run(go())
    table = Table(title=f"usage {start:%Y-%m-%d %H:%M} .. {end:%Y-%m-%d %H:%M} UTC", title_justify="left")
    for column in ("tenant", "model", "calls", "prompt", "cached", "completion", "total"):
        table.add_column(column, justify="left" if column in ("tenant", "model") else "right")
    for r in rows:
        table.add_row(r.tenant[:16], r.model or "-", f"{r.calls:,}", f"{r.prompt_tokens:,}", f"{r.cached_tokens:,}",
                      f"{r.completion_tokens:,}", f"{r.total_tokens:,}")
    total = UsageRow.total_of(rows)
    table.add_row("all", "", f"{total.calls:,}", f"{total.prompt_tokens:,}", f"{total.cached_tokens:,}",
                  f"{total.completion_tokens:,}", f"{total.total_tokens:,}", style="bold")
    console().print(table)


def _short(value: Any, width: int = 8) -> str:
    return str(value)[-width:] if value else "-"


def _when(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value else "-"


@conversations.command("list")
@config_option
@click.option("--tenant", default=None, help="Only this tenant's conversations.")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 10_000))
def list_conversations(config_file: str | None, tenant: str | None, limit: int) -> None:
    """List conversations, newest first."""
    from storage import AdminStore

    settings = settings_of(config_file)

    async def go() -> list[Any]:
        async with database(settings) as db:
            return await AdminStore(db).conversations(tenant, after=None, limit=limit)

    rows = run(go())
    table = Table(title=f"{len(rows)} conversation(s)", title_justify="left")
    for column in ("tenant", "conversation", "nodes", "tokens", "head", "busy", "created", "updated"):
        table.add_column(column, justify="right" if column in ("nodes", "tokens") else "left")
    for r in rows:
        table.add_row(r.tenant[:16], r.id, str(r.node_count), f"{r.total_tokens:,}", _short(r.head_node_id),
                      "yes" if r.busy else "", _when(r.created_at), _when(r.updated_at))
    console().print(table)


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
@config_option
@click.option("--tenant", default=None, help="The conversation's tenant (needed when the id exists for several).")
def show(conversation_id: str, config_file: str | None, tenant: str | None) -> None:
    """Draw a conversation's tree: branches, the head, each node's kind, status, model, tokens."""
    settings = settings_of(config_file)

    async def go() -> tuple[Any, list[Any], list[Any]]:
        async with database(settings) as db:
            store, conv = await find_conversation(db, conversation_id, tenant)
            return conv, await store.tree(conv), await store.path(conv)

    conv, nodes, path = run(go())
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
    console().print(tree)
