"""Storage: PostgreSQL through asyncpg, plain SQL, numbered migrations.

Public surface: ``Database`` (the pool), the stores (``TreeStore`` for the call path,
``AdminStore`` for the admin API and the CLI, ``OpsStore`` for health and invariants), the typed
rows and ``Outcome`` (``storage.model``), ``migrate``, the embedded server, and the errors
(``StorageError`` and its subclasses, refusals included).
"""

from . import transcript
from .admin import AdminStore
from .database import Database, open_database
from .embedded import EmbeddedServer, start_embedded
from .errors import (
    BeforeCompaction,
    Busy,
    ConversationExists,
    ConversationMissing,
    MigrationError,
    NodeMissing,
    NodePending,
    Refused,
    StorageError,
    StorageUnavailable,
)
from .ids import uuid7
from .migrate import latest_version, migrate
from .model import ConversationRow, NodeRow, Outcome, PathNode, PathRow, Pruned, TreeRow, UsageRow
from .ops import OpsStore
from .pathcache import PathCache
from .shared import SharedItems
from .tree import Begun, CallFinish, CallStart, ContextMode, ParentMode, TreeStore

__all__ = [
    "AdminStore",
    "BeforeCompaction",
    "Begun",
    "Busy",
    "CallFinish",
    "CallStart",
    "ContextMode",
    "ConversationExists",
    "ConversationMissing",
    "ConversationRow",
    "Database",
    "EmbeddedServer",
    "MigrationError",
    "NodeMissing",
    "NodePending",
    "NodeRow",
    "OpsStore",
    "Outcome",
    "ParentMode",
    "PathCache",
    "PathNode",
    "PathRow",
    "Pruned",
    "Refused",
    "SharedItems",
    "StorageError",
    "StorageUnavailable",
    "TreeRow",
    "TreeStore",
    "UsageRow",
    "latest_version",
    "migrate",
    "open_database",
    "start_embedded",
    "transcript",
    "uuid7",
]
