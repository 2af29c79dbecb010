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
import os
import subprocess
import tempfile
from pathlib import Path
from typing import IO

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


_ENDING = 3.0  # seconds other sessions are given to go: a client just gone, a proxy just stopped


async def restore_blockers(conn: asyncpg.Connection) -> tuple[int, int]:
    """(other sessions connected to the database, conversations it holds). A session whose client
    has just closed it is still listed until its server process has ended -- a proxy stopped a
    moment ago, the previous command's own connections: other sessions are given ``_ENDING``
    seconds to go before they count."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _ENDING
    while True:
        others = await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            " AND backend_type = 'client backend'")
        if not others or loop.time() >= deadline:
            break
        await asyncio.sleep(0.1)
    held = await conn.fetchval("SELECT to_regclass('conversations') IS NOT NULL")
    conversations = await conn.fetchval("SELECT count(*) FROM conversations") if held else 0
    return others, conversations


_RESTORE = ("--clean", "--if-exists", "--no-owner", "--no-privileges", "--single-transaction")

# What the embedded build's pg_restore (18) sets before restoring that servers before 17 do not
# know -- and refuse, failing the restore on its first statement.
_NEWER_SETTINGS = {b"SET transaction_timeout = 0;\n": 170000}


async def restore(dsn: str, file: Path) -> None:
    """Replace what the database holds by a backup, in one transaction: all of it or nothing."""
    conn = await asyncpg.connect(dsn)
    try:
        version = int(await conn.fetchval("SHOW server_version_num"))
    finally:
        await conn.close()
    if version >= max(_NEWER_SETTINGS.values()):
        await _run("pg_restore", *_RESTORE, "--exit-on-error", f"--dbname={dsn}", str(file))
    else:
        await asyncio.to_thread(_restore_by_script, dsn, file, version)


def _restore_by_script(dsn: str, file: Path, version: int) -> None:
    """A restore into a server older than the tools: pg_restore writes the restore as a script,
    the settings the server does not know are left out of its opening lines, psql runs it (one
    transaction, stopping at the first error)."""
    unknown = {line for line, since in _NEWER_SETTINGS.items() if version < since}
    # (their messages go to files: a pipe nobody reads while the script flows could fill and stall)
    with tempfile.TemporaryFile() as script_err, tempfile.TemporaryFile() as runner_err:
        script = subprocess.Popen([str(client_program("pg_restore")), *_RESTORE, "--file=-", str(file)],
                                  stdout=subprocess.PIPE, stderr=script_err)
        runner = subprocess.Popen([str(client_program("psql")), "--no-psqlrc", "--quiet", "--set=ON_ERROR_STOP=1",
                                   f"--dbname={dsn}"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                  stderr=runner_err, env={**os.environ, "PGOPTIONS": "-c client_min_messages=warning"})
        assert script.stdout is not None and runner.stdin is not None
        opening = True  # (only the script's opening settings are looked at: never a row of data)
        try:
            for line in script.stdout:
                if opening:
                    if line.startswith((b"COPY ", b"CREATE ")):
                        opening = False
                    elif line in unknown:
                        continue
                runner.stdin.write(line)
        except BrokenPipeError:
            pass  # (psql stopped at an error: said below)
        finally:
            try:
                runner.stdin.close()
            except BrokenPipeError:
                pass
            script.stdout.close()
        script.wait()
        runner.wait()
        if script.returncode != 0:
            raise BackupError(f"pg_restore failed: {_tail(script_err)}")
        if runner.returncode != 0:
            raise BackupError(f"pg_restore failed (its script run by psql): {_tail(runner_err)}")


def _tail(file: IO[bytes]) -> str:
    file.seek(0)
    return file.read().decode(errors="replace").strip()[-2000:]
