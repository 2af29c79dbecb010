"""Storage errors: asyncpg's exceptions are translated here, once, at the storage boundary.

    StorageError
     ├── StorageUnavailable         the database cannot be reached, did not answer in time, or
     │                              refuses writes for now (read-only, a lock wait timed out) (-> 503)
     ├── MigrationError             the schema cannot be brought up to date
     └── Refused                    a rule of the tree said no; nothing was written
          ├── Busy                  a turn call of the conversation is in flight
          ├── ConversationMissing   no such conversation (for this tenant)
          ├── NodeMissing           the node is outside the conversation's reach (or another tenant's)
          ├── BeforeCompaction      an edit of what a compaction of the current path replaced
          ├── ConversationExists    the id of a new conversation is taken
          └── NodePending           the head cannot rest on a node still in flight

Callers above ``storage`` never see an asyncpg exception. Refusals are raised by the server-side
functions with SQLSTATEs of our own (``BP...``, listed in ``storage/functions/basics.sql``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager

import asyncpg

from .pool import PoolClosed

__all__ = [
    "BeforeCompaction",
    "Busy",
    "ConversationExists",
    "ConversationMissing",
    "MigrationError",
    "NodeMissing",
    "NodePending",
    "Refused",
    "StorageError",
    "StorageUnavailable",
    "map_db_errors",
]


class StorageError(Exception):
    """Base of every storage error."""


class StorageUnavailable(StorageError):
    """The database is unreachable, restarting, overloaded or too slow to answer. ``sent``: the
    statement had been sent when it happened (it may still have been carried out)."""

    def __init__(self, message: str, *, sent: bool = False) -> None:
        super().__init__(message)
        self.sent = sent


class MigrationError(StorageError):
    """A migration failed or the database schema is newer than this code."""


class Refused(StorageError):
    """A rule of the tree refused the operation; ``str(exc)`` says why in words for a client. A
    subclass names its SQLSTATE (``BP...``) as a keyword of its ``class`` line."""

    sqlstate = ""

    def __init_subclass__(cls, *, sqlstate: str, **kw: object) -> None:
        super().__init_subclass__(**kw)
        cls.sqlstate = sqlstate


class Busy(Refused, sqlstate="BPBSY"): ...
class ConversationMissing(Refused, sqlstate="BPNFC"): ...
class NodeMissing(Refused, sqlstate="BPNFN"): ...
class BeforeCompaction(Refused, sqlstate="BPPBC"): ...
class ConversationExists(Refused, sqlstate="BPEXI"): ...
class NodePending(Refused, sqlstate="BPPND"): ...


_REFUSALS = {cls.sqlstate: cls for cls in Refused.__subclasses__()}

_UNAVAILABLE = (
    PoolClosed,
    OSError,
    asyncio.TimeoutError,
    ConnectionError,
    asyncpg.exceptions.PostgresConnectionError,
    asyncpg.exceptions.InterfaceError,
    # the client's protocol in a state no statement can start from: an error the server sent as it
    # went (an idle connection's "terminating connection", before the socket's end is read) --
    # the connection is dropped (storage.database) and the next one is fine
    asyncpg.exceptions.InternalClientError,
    asyncpg.exceptions.CannotConnectNowError,
    asyncpg.exceptions.TooManyConnectionsError,
    asyncpg.exceptions.AdminShutdownError,
    asyncpg.exceptions.CrashShutdownError,
    asyncpg.exceptions.QueryCanceledError,
    asyncpg.exceptions.DeadlockDetectedError,
    # a lock wait longer than an operator's lock_timeout: contention that passes, as a deadlock
    asyncpg.exceptions.LockNotAvailableError,
    # writes refused for now: a standby (a failover not yet promoted, a database in recovery) or
    # default_transaction_read_only set -- the same statement goes through once writes work again
    asyncpg.exceptions.ReadOnlySQLTransactionError,
    asyncpg.exceptions.SerializationError,
    asyncpg.exceptions.InsufficientResourcesError,
)

# of those, the server's answers to a statement it rolled back: nothing of it was carried out,
# sent or not (no start to look for afterwards). Not a cancelled one (a statement timeout): on a
# Citus coordinator a call delegated to a worker may have committed there before the cancel came
# -- its start is looked for, as for a connection lost.
_ROLLED_BACK = (
    asyncpg.exceptions.DeadlockDetectedError,
    asyncpg.exceptions.SerializationError,
    asyncpg.exceptions.LockNotAvailableError,
    asyncpg.exceptions.ReadOnlySQLTransactionError,
)


@contextmanager
def map_db_errors(*, sent: bool = False) -> Iterator[None]:
    """Translate asyncpg/OS errors raised inside the block into ``StorageError``s (``sent``: the
    block sends a statement)."""
    try:
        yield
    except StorageError:
        raise
    except _UNAVAILABLE as exc:
        # (a setting of the URL the driver refuses says which and why -- never the URL itself)
        why = f": {str(exc)[:200]}" if isinstance(exc, asyncpg.exceptions.ClientConfigurationError) else ""
        raise StorageUnavailable(f"database unavailable: {type(exc).__name__}{why}",
                                 sent=sent and not isinstance(exc, _ROLLED_BACK)) from exc
    except asyncpg.PostgresError as exc:
        refusal = _REFUSALS.get(getattr(exc, "sqlstate", "") or "")
        if refusal is not None:
            raise refusal(getattr(exc, "message", None) or str(exc)) from None
        raise StorageError(f"database error: {type(exc).__name__}: {exc}") from exc
