"""Storage: PostgreSQL through asyncpg, plain SQL, numbered migrations.

Public surface: ``Database`` (the pool), ``TreeStore`` (the call path's statements),
``migrate``, the embedded server, and the errors (``StorageError`` and subclasses).
"""

from .database import Database, open_database
from .embedded import EmbeddedServer, start_embedded
from .errors import MigrationError, StorageError, StorageUnavailable
from .ids import uuid7
from .migrate import latest_version, migrate
from .tree import BeginResult, PathNode, TreeStore

__all__ = [
    "BeginResult",
    "Database",
    "EmbeddedServer",
    "MigrationError",
    "PathNode",
    "StorageError",
    "StorageUnavailable",
    "TreeStore",
    "latest_version",
    "migrate",
    "open_database",
    "start_embedded",
    "uuid7",
]
