"""Storage errors: asyncpg's exceptions are translated here, once, at the storage boundary.

    StorageError
     ├── StorageUnavailable     the database cannot be reached or did not answer in time (-> 503)
     └── MigrationError         the schema cannot be brought up to date

Callers above ``storage`` never see an asyncpg exception.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager

import asyncpg

__all__ = ["MigrationError", "StorageError", "StorageUnavailable", "map_db_errors"]


class StorageError(Exception):
    """Base of every storage error."""


class StorageUnavailable(StorageError):
    """The database is unreachable, restarting, overloaded or too slow to answer."""


class MigrationError(StorageError):
    """A migration failed or the database schema is newer than this code."""


_UNAVAILABLE = (
    OSError,
    asyncio.TimeoutError,
    ConnectionError,
    asyncpg.exceptions.PostgresConnectionError,
    asyncpg.exceptions.InterfaceError,
    asyncpg.exceptions.CannotConnectNowError,
    asyncpg.exceptions.TooManyConnectionsError,
    asyncpg.exceptions.AdminShutdownError,
    asyncpg.exceptions.CrashShutdownError,
    asyncpg.exceptions.QueryCanceledError,
    asyncpg.exceptions.DeadlockDetectedError,
    asyncpg.exceptions.SerializationError,
    asyncpg.exceptions.InsufficientResourcesError,
)


@contextmanager
def map_db_errors() -> Iterator[None]:
    """Translate asyncpg/OS errors raised inside the block into ``StorageError``s."""
    try:
        yield
    except StorageError:
        raise
    except _UNAVAILABLE as exc:
        raise StorageUnavailable(f"database unavailable: {type(exc).__name__}") from exc
    except asyncpg.PostgresError as exc:
        raise StorageError(f"database error: {type(exc).__name__}: {exc}") from exc
