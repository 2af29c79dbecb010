"""Schema migrations: numbered files in ``storage/migrations`` -- ``NNNN_name.sql``, or
``NNNN_name.py`` defining ``async def upgrade(conn)`` for a step SQL cannot do (e.g. computing
transcript hashes) -- applied once, in order, each in its own transaction, followed by the
server-side functions: ``storage/functions/*.sql``, one file per concern, in the order
``functions.sql`` lists them (its ``\\ir`` lines: psql can run it too), all in one transaction and
``CREATE OR REPLACE``d on every run so they always match this code.

Safe when several processes start at once: the whole run holds a PostgreSQL advisory lock.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

import asyncpg

from .errors import MigrationError, map_db_errors

__all__ = ["Migration", "applied_versions", "latest_version", "load_migrations", "migrate"]

log = logging.getLogger("branchpoint.storage")

_LOCK_KEY = 0x6272_616E_6368  # "branch": one advisory lock for every migration run
_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.(sql|py)$")

_CREATE_LEDGER = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    source: str
    python: bool = False

    async def apply(self, conn: asyncpg.Connection) -> None:
        if not self.python:
            await conn.execute(self.source)
            return
        namespace: dict[str, Any] = {"__name__": f"storage.migrations.m{self.version:04d}"}
        exec(compile(self.source, f"{self.version:04d}_{self.name}.py", "exec"), namespace)
        await namespace["upgrade"](conn)


def load_migrations() -> list[Migration]:
    """Every numbered migration shipped with this code, in order."""
    folder = resources.files("storage").joinpath("migrations")
    found = []
    for entry in folder.iterdir():
        match = _NAME.match(entry.name)
        if match:
            found.append(Migration(int(match.group(1)), match.group(2), entry.read_text(encoding="utf-8"),
                                   python=match.group(3) == "py"))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise MigrationError(f"migration numbers must be 1..n without gaps, found {versions}")
    return found


def latest_version() -> int:
    return len(load_migrations())


_INCLUDE = re.compile(r"^\\ir\s+(\S+)\s*$", re.M)


def function_files() -> list[str]:
    """The server-side functions' files, in the order they are applied (``functions.sql``)."""
    return _INCLUDE.findall(resources.files("storage").joinpath("functions.sql").read_text(encoding="utf-8"))


# Functions whose plans are pinned generic on one PostgreSQL (their comments say why). On a schema
# distributed by Citus (docs/scaling.md) a generic plan of a query on a distributed table cannot be
# routed -- Citus plans each call for its values -- so there they plan as Citus needs.
_GENERIC_PLANS = ("bp_siblings(uuid,uuid,uuid,text,timestamp with time zone,uuid,text,uuid[])",)


async def suit_citus(conn: asyncpg.Connection) -> None:
    """On a schema distributed by Citus, the functions' settings Citus cannot plan with undone
    (after the functions are applied: by ``migrate``, and by ``distribute``)."""
    if not await conn.fetchval("SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')"):
        return
    if not await conn.fetchval("SELECT count(*) FROM pg_dist_partition WHERE logicalrelid = to_regclass('nodes')"):
        return
    for signature in _GENERIC_PLANS:
        await conn.execute(f"ALTER FUNCTION {signature} RESET plan_cache_mode")


def _functions_sql() -> str:
    root = resources.files("storage")
    return "\n".join(root.joinpath(name).read_text(encoding="utf-8") for name in function_files())


async def applied_versions(conn: asyncpg.Connection) -> set[int]:
    exists = await conn.fetchval("SELECT to_regclass('schema_migrations') IS NOT NULL")
    if not exists:
        return set()
    return {r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")}


async def migrate(dsn_or_conn: str | asyncpg.Connection, *, progress=None) -> list[int]:
    """Bring the schema up to date; returns the versions applied by this run.

    ``progress(done, total, name)`` is called before each migration, if given.
    """
    own = isinstance(dsn_or_conn, str)
    with map_db_errors():
        conn = await asyncpg.connect(dsn_or_conn) if own else dsn_or_conn
        try:
            return await _migrate(conn, progress)
        finally:
            if own:
                await conn.close()


async def _migrate(conn: asyncpg.Connection, progress) -> list[int]:
    await conn.execute("SELECT pg_advisory_lock($1)", _LOCK_KEY)
    try:
        await conn.execute(_CREATE_LEDGER)
        done = await applied_versions(conn)
        migrations = load_migrations()
        newest_known = migrations[-1].version if migrations else 0
        if done and max(done) > newest_known:
            raise MigrationError(
                f"the database is at schema version {max(done)}, newer than this code ({newest_known})"
            )
        todo = [m for m in migrations if m.version not in done]
        applied = []
        for i, m in enumerate(todo):
            if progress:
                progress(i, len(todo), f"{m.version:04d}_{m.name}")
            log.info("applying migration", extra={"version": m.version, "migration": m.name})
            try:
                async with conn.transaction():
                    await m.apply(conn)
                    await conn.execute(
                        "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", m.version, m.name
                    )
            except asyncpg.PostgresError as exc:
                raise MigrationError(f"migration {m.version:04d}_{m.name} failed: {exc}") from exc
            applied.append(m.version)
        if progress:
            progress(len(todo), len(todo), "functions")
        async with conn.transaction():
            await conn.execute(_functions_sql())
            await suit_citus(conn)
        return applied
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", _LOCK_KEY)
