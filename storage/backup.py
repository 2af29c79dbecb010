"""Backups of the whole database (``branchpoint backup`` / ``branchpoint restore``): PostgreSQL's
own ``pg_dump`` and ``pg_restore`` in their custom format, run from the embedded build's
programs, which work with any server this proxy supports -- so the zero-setup embedded database
needs nothing installed to be backed up (docs/scaling.md#the-embedded-database, "Backups").

A restore replaces what the database holds; it refuses while other sessions are connected (a
proxy still serving would find its tables gone mid-call) and, unless asked to replace it, when the
database already holds conversations.
"""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import asyncpg

from .embedded import client_program
from .errors import StorageError

__all__ = ["BackupError", "backup", "restore", "restore_blockers"]


class BackupError(StorageError):
    """pg_dump or pg_restore failed, or a restore would replace what it must not; says why."""


async def _run(program: str, *args: str) -> None:
    def go() -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(client_program(program)), *args], capture_output=True, text=True, check=False)

    done = await asyncio.to_thread(go)
    if done.returncode != 0:
        raise BackupError(f"{program} failed: {(done.stderr or done.stdout).strip()[-2000:]}")


async def backup(dsn: str, file: Path) -> None:
    """The whole database -- schema, functions, data -- into ``file`` (pg_dump's custom format)."""
    await _run("pg_dump", "--format=custom", "--no-owner", "--no-privileges", f"--file={file}", f"--dbname={dsn}")


async def restore_blockers(conn: asyncpg.Connection) -> tuple[int, int]:
    """(other sessions connected to the database, conversations it holds)."""
    others = await conn.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        " AND backend_type = 'client backend'")
    held = await conn.fetchval("SELECT to_regclass('conversations') IS NOT NULL")
    conversations = await conn.fetchval("SELECT count(*) FROM conversations") if held else 0
    return others, conversations


async def restore(dsn: str, file: Path) -> None:
    """Replace what the database holds by a backup, in one transaction: all of it or nothing."""
    await _run("pg_restore", "--clean", "--if-exists", "--no-owner", "--no-privileges", "--single-transaction",
               "--exit-on-error", f"--dbname={dsn}", str(file))
