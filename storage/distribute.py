"""Past one PostgreSQL: the schema distributed by tree on Citus (docs/scaling.md).

``distribute(conn)`` -- what ``branchpoint distribute`` runs, after ``branchpoint migrate``, on the
Citus coordinator:

1. the three tables distributed by ``tree_id`` and co-located: ``nodes`` first, then
   ``conversations`` and ``conversation_aliases`` with it -- every row of a tree on one shard;
   and ``shared_items`` (storage/shared.py) by ``tenant``, in a group of its own -- a tenant's
   items on one shard, each statement a call makes on them one of that shard's;
2. the server-side functions applied again (``storage/functions/*.sql``): now that the tables are
   distributed, Citus creates the functions that read their row types on every node too;
3. every function of ours made a distributed object (created on every node, kept in step by
   Citus's DDL propagation when ``migrate`` re-applies them), and those that take a tree
   (``DELEGATED``: a named conversation's start, a call's finish, lease renewal, reaping, path
   reads, compaction) placed with their trees: ``create_distributed_function(..., distribution_arg_name => 'p_tree',
   colocate_with => 'nodes')`` -- a call ``SELECT ... FROM f(p_tree => $1, ...)`` is then run
   whole on the worker holding that tree (one round trip there, its statements local).

Idempotent: what is already distributed is left as it is, and a second run changes nothing. On a
database without Citus it changes nothing and says so (``NotDistributable``).

``is_distributed(conn)``: whether the schema is distributed -- what the product asks by itself
(``storage.batching``: batches of several trees would be distributed transactions), no setting.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import asyncpg

from .migrate import _functions_sql, applied_versions, latest_version, suit_citus

__all__ = ["BY_TENANT", "DELEGATED", "TABLES", "Distribution", "NotDistributable", "distribute", "is_distributed"]

# the tables, in the order they are distributed (the first is the co-location group's anchor)
TABLES = ("nodes", "conversations", "conversation_aliases")

# the tables distributed by tenant: the shared items a call stores and reads (one tenant each)
BY_TENANT = ("shared_items",)

# the functions run where their tree lives: (signature, the argument naming the tree)
DELEGATED = (
    ("bp_begin_call_at(uuid,jsonb,text)", "p_tree"),
    ("bp_finish_call(uuid,uuid,jsonb)", "p_tree"),
    ("bp_renew(uuid,uuid,double precision)", "p_tree"),
    ("bp_reap(uuid,uuid,boolean)", "p_tree"),
    ("bp_path_nodes(uuid,uuid,uuid[])", "p_tree"),
    ("bp_path(uuid,uuid)", "p_tree"),
    ("bp_apply_compaction(text,text,uuid,uuid,uuid,jsonb,bytea,text,text,jsonb,jsonb,text,uuid,bytea)", "p_tree"),
    ("bp_record_attempt(uuid,uuid,uuid,uuid,jsonb,bytea)", "p_tree"),
)

_HAS_CITUS = "SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')"

# (to_regclass: before the first migration there is no table yet)
_DISTRIBUTED = "SELECT count(*) FROM pg_dist_partition WHERE logicalrelid = to_regclass('nodes')"

_TABLE_DISTRIBUTION = """
SELECT column_to_column_name(p.logicalrelid, p.partkey) AS column, p.colocationid
  FROM pg_dist_partition p WHERE p.logicalrelid = $1::regclass
"""

_WORKERS = "SELECT count(*) FROM pg_dist_node WHERE noderole = 'primary' AND isactive AND groupid <> 0"

# our functions (public schema, bp_*) and how Citus knows them: distributed or not, by which argument
_FUNCTIONS = """
SELECT p.oid::regprocedure::text AS signature, o.objid IS NOT NULL AS distributed,
       o.distribution_argument_index AS arg, o.colocationid
  FROM pg_proc p
  JOIN pg_namespace ns ON ns.oid = p.pronamespace AND ns.nspname = 'public'
  LEFT JOIN pg_catalog.pg_dist_object o ON o.classid = 'pg_proc'::regclass AND o.objid = p.oid
 WHERE p.proname LIKE 'bp\\_%' AND p.prokind = 'f'
 ORDER BY 1
"""


class NotDistributable(Exception):
    """The database cannot be distributed as it is (no Citus, no workers, schema not current):
    nothing was changed."""


@dataclass
class Distribution:
    """What a run did: the tables and functions it distributed (empty: all already were)."""

    tables: list[str] = field(default_factory=list)
    delegated: list[str] = field(default_factory=list)
    propagated: list[str] = field(default_factory=list)
    workers: int = 0

    @property
    def changed(self) -> bool:
        return bool(self.tables or self.delegated or self.propagated)


async def has_citus(conn: asyncpg.Connection, timeout: float | None = None) -> bool:
    return bool(await conn.fetchval(_HAS_CITUS, timeout=timeout))


async def is_distributed(conn: asyncpg.Connection, timeout: float | None = None) -> bool:
    """Is the schema distributed (Citus, ``nodes`` a distributed table)? ``timeout``: instead of
    the connection's statement timeout (``Database.open`` asks it as part of connecting)."""
    if not await has_citus(conn, timeout):
        return False
    return bool(await conn.fetchval(_DISTRIBUTED, timeout=timeout))


def _function_name(signature: str) -> str:
    return signature.split("(", 1)[0]


async def distribute(conn: asyncpg.Connection) -> Distribution:
    """Distribute the schema by tree (module docstring). Raises ``NotDistributable`` -- having
    changed nothing -- on a database without Citus or without workers, or whose schema is not
    current (run ``branchpoint migrate`` first)."""
    if not await has_citus(conn):
        raise NotDistributable(
            "this database has no Citus extension: nothing was changed. Branchpoint runs on one PostgreSQL as it "
            "is; to distribute it, run on a Citus coordinator (CREATE EXTENSION citus, workers added with "
            "citus_add_node), then `branchpoint distribute` again")
    done = await applied_versions(conn)
    if not done or max(done) < latest_version():
        raise NotDistributable("the schema is not current: run `branchpoint migrate` first (nothing was changed)")
    result = Distribution(workers=int(await conn.fetchval(_WORKERS)))
    if result.workers == 0:
        raise NotDistributable("the Citus coordinator has no active worker: add one with citus_add_node "
                               "(nothing was changed)")

    anchor = None
    for table in TABLES:
        row = await conn.fetchrow(_TABLE_DISTRIBUTION, table)
        if row is None:
            # one statement each: create_distributed_table copies the rows and commits on its own
            if anchor is None:
                await conn.execute("SELECT create_distributed_table($1, 'tree_id')", table)
            else:
                await conn.execute("SELECT create_distributed_table($1, 'tree_id', colocate_with => $2)", table, anchor)
            result.tables.append(table)
            row = await conn.fetchrow(_TABLE_DISTRIBUTION, table)
        if row["column"] != "tree_id":
            raise NotDistributable(f"table {table} is distributed by {row['column']}, not tree_id: redistribute it "
                                   "by tree_id (alter_distributed_table) first")
        if anchor is None:
            anchor, group = table, row["colocationid"]
        elif row["colocationid"] != group:
            raise NotDistributable(f"table {table} is not co-located with {anchor}: co-locate it "
                                   f"(update_distributed_table_colocation) first")

    for table in BY_TENANT:
        row = await conn.fetchrow(_TABLE_DISTRIBUTION, table)
        if row is None:
            # a group of its own: a tenant's items, not a tree's (docs/scaling.md)
            await conn.execute("SELECT create_distributed_table($1, 'tenant', colocate_with => 'none')", table)
            result.tables.append(table)
            row = await conn.fetchrow(_TABLE_DISTRIBUTION, table)
        if row["column"] != "tenant":
            raise NotDistributable(f"table {table} is distributed by {row['column']}, not tenant: redistribute it "
                                   "by tenant (alter_distributed_table) first")

    if result.tables:
        # the functions that read the tables' row types are created on the workers now
        async with conn.transaction():
            await conn.execute(_functions_sql())
            await suit_citus(conn)

    functions = {r["signature"]: r for r in await conn.fetch(_FUNCTIONS)}
    for signature, argument in DELEGATED:
        known = functions.get(await conn.fetchval("SELECT $1::regprocedure::text", signature))
        if known is None:
            raise NotDistributable(f"function {signature} is missing: run `branchpoint migrate` first")
        if known["arg"] is not None and known["colocationid"] == group:
            continue
        await conn.execute("SELECT create_distributed_function($1::regprocedure, $2, colocate_with => $3)",
                           signature, argument, anchor)
        result.delegated.append(_function_name(signature))
    delegated = {_function_name(sig) for sig, _ in DELEGATED}
    for signature, known in functions.items():
        if _function_name(signature) in delegated or known["distributed"]:
            continue
        await conn.execute("SELECT create_distributed_function($1::regprocedure)", signature)
        result.propagated.append(_function_name(signature))
    return result
