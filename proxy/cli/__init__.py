"""The ``branchpoint`` command: serve, migrate, inspect conversations, check the database.

Every command reads the same configuration as the server (``--config`` / ``BRANCHPOINT_CONFIG``,
``BRANCHPOINT_DATABASE_URL`` ...). Without a database URL the embedded PostgreSQL of the data
directory is used -- attached to if ``serve`` is running on it, started otherwise.
"""

from __future__ import annotations

from . import conversations, database, distribute, reports, serve  # each adds its commands to the group
from .common import main

__all__ = ["conversations", "database", "distribute", "main", "reports", "serve"]
