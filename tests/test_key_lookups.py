"""Lookups by key stay lookups by key (storage/migrations/0012): the plans a connection keeps are
made while its tables are young, and must not read a whole tree (or a tenant's nodes, or every
pending node) to find one row once the tables have grown.

Measured with PostgreSQL's index statistics: a fresh database serves a conversation from its
first call (so the server-side functions and the foreign-key checks plan on an empty table) until
it has grown to 70 nodes -- delta turns, regenerations, side calls -- and every index scan must
have read at most a few entries. (Full-history calls are left out: their transcript lookup ties
with the primary key's tree prefix until the table's first ANALYZE, see the migration.)"""

import asyncpg

from .conftest import make_settings, run, serve_proxy
from .helpers import MODEL, user


def _index_reads(url: str) -> dict[str, tuple[int, int]]:
    async def read():
        conn = await asyncpg.connect(url)
        try:
            rows = await conn.fetch("SELECT indexrelname, idx_scan, idx_tup_read FROM pg_stat_user_indexes "
                                    "WHERE relname IN ('nodes', 'conversations', 'conversation_aliases')")
            return {r["indexrelname"]: (r["idx_scan"], r["idx_tup_read"]) for r in rows}
        finally:
            await conn.close()

    return run(read())


def test_lookups_by_key_read_one_entry_however_the_tables_grow(fresh_database_url, upstream_url, upstream, key, cid):
    """(``upstream``: the shared fake, reset to answer every call plainly.)"""
    with serve_proxy(make_settings(fresh_database_url, upstream_url)) as p:
        http = p.http(key)

        def chat(messages, **headers):
            r = http.post("/v1/chat/completions", json={"model": MODEL, "messages": messages}, headers=headers)
            assert r.status_code == 200, r.text
            return r.headers["x-node-id"]

        parent = None
        for i in range(50):
            node = chat([user(f"question {i}")], **{"X-Conversation-Id": cid})
            if i % 10 == 9:  # a regeneration and a side call beside the usual turns
                chat([user(f"question {i} again")], **{"X-Conversation-Id": cid, "X-Parent-Node-Id": parent})
                chat([user("summarise")], **{"X-Conversation-Id": cid, "X-Node-Kind": "transform"})
            parent = node
    # the proxy's connections are closed: their statistics are in
    reads = _index_reads(fresh_database_url)
    scanned = {name: round(tuples / scans, 2) for name, (scans, tuples) in reads.items() if scans}
    assert sum(scans for scans, _ in reads.values()) > 300  # ~6 lookups per call were counted
    assert all(per_scan <= 2.5 for per_scan in scanned.values()), scanned
