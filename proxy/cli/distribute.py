"""``branchpoint distribute``: the schema distributed by tree on a Citus coordinator
(storage/distribute.py, docs/scaling.md)."""

from __future__ import annotations

import click

from .common import config_option, console, database, main, run, settings_of

__all__ = ["distribute"]


@main.command()
@config_option
def distribute(config_file: str | None) -> None:
    """Distribute the tables by tree and place the call functions with their trees (Citus; after
    `branchpoint migrate`, on the coordinator). Idempotent; changes nothing without Citus."""
    from storage.distribute import BY_TENANT, NotDistributable
    from storage.distribute import distribute as run_distribution

    settings = settings_of(config_file)
    out = console()

    async def go():
        async with database(settings) as db, db.connection() as conn:
            return await run_distribution(conn)

    try:
        done = run(go())
    except NotDistributable as exc:
        raise click.ClickException(str(exc)) from None
    if not done.changed:
        out.print(f"already distributed by tree on {done.workers} worker(s); nothing changed")
        return
    by_tree = [t for t in done.tables if t not in BY_TENANT]
    by_tenant = [t for t in done.tables if t in BY_TENANT]
    if by_tree:
        out.print(f"distributed by tree_id, co-located: {', '.join(by_tree)}")
    if by_tenant:
        out.print(f"distributed by tenant: {', '.join(by_tenant)}")
    if done.delegated:
        out.print(f"run where their tree lives: {', '.join(done.delegated)}")
    if done.propagated:
        out.print(f"created on every node: {len(done.propagated)} function(s)")
    out.print(f"{done.workers} worker(s). Restart running proxies: they detect a distributed schema when they connect.")
