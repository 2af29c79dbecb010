"""The invariant checker finds what it is meant to find (so a clean result means something)."""

import asyncio
import uuid

from proxy.invariants import check_invariants
from storage import open_database

from .conftest import Db


def test_checker_reports_each_kind_of_violation(fresh_database_url):
    db = Db(fresh_database_url)
    db.fetch("""
        INSERT INTO conversations (tenant, id, tree_id, head_node_id)
        VALUES ('t', 'dangling', gen_random_uuid(), gen_random_uuid())""")
    db.fetch("""
        WITH c AS (INSERT INTO conversations (tenant, id, tree_id) VALUES ('t', 'bad', gen_random_uuid()) RETURNING tree_id)
        INSERT INTO nodes (tree_id, id, tenant, conversation_id, kind, outcome, sent, chain, depth, lease_until)
        SELECT tree_id, gen_random_uuid(), 't', 'bad', 'turn', NULL, '[]'::jsonb, '\\x00'::bytea, 0, now() - interval '1 hour' FROM c
        UNION ALL
        SELECT tree_id, gen_random_uuid(), 't', 'bad', 'turn', 'success', '[]'::jsonb, '\\x00'::bytea, 0, NULL FROM c""")
    db.fetch("""
        UPDATE conversations SET lease_node_id = $1, lease_until = now() - interval '1 hour' WHERE id = 'bad'""",
             uuid.uuid4())  # (a value, not gen_random_uuid(): Citus runs no volatile function in an UPDATE)

    async def check():
        database = await open_database(fresh_database_url, min_size=1, max_size=2)
        try:
            return await check_invariants(database)
        finally:
            await database.close()

    rules = sorted(v.rule for v in asyncio.run(check()))
    assert rules == ["head_in_tree", "no_stale_lease", "no_stale_pending", "success_has_received"]
