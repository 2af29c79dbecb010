"""Migrations: an empty database is brought to the current schema; re-running and concurrent
runs are safe."""

import asyncio
import re

import asyncpg
import httpx

from storage import latest_version, migrate

from .conftest import new_database, run


def test_migrate_empty_database_and_check_schema(pg_server_url):
    url = new_database(pg_server_url)

    async def check():
        applied = await migrate(url)
        assert applied == list(range(1, latest_version() + 1))
        assert await migrate(url) == []  # idempotent
        conn = await asyncpg.connect(url)
        try:
            cols = {
                (r["table_name"], r["column_name"]): r["data_type"]
                for r in await conn.fetch(
                    "SELECT table_name, column_name, data_type FROM information_schema.columns "
                    "WHERE table_schema = 'public'")
            }
            for column in ("id", "tree_id", "tenant", "conversation_id", "parent_id", "kind", "status", "sent",
                           "received", "model", "provider", "params", "usage", "finish_reason", "error",
                           "compacted_from", "depth", "created_at", "finished_at", "chain", "answered", "system_hash", "outcome", "request_hash"):
                assert ("nodes", column) in cols, column
            assert cols[("nodes", "sent")] == "jsonb"
            assert cols[("nodes", "id")] == "uuid"
            for column in ("tenant", "id", "tree_id", "head_node_id", "lease_node_id", "lease_until",
                           "created_at", "updated_at"):
                assert ("conversations", column) in cols, column
            pk = await conn.fetch(
                "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
                "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = 'nodes'::regclass AND i.indisprimary")
            assert {r["attname"] for r in pk} == {"tree_id", "id"}  # keyed by tree: shardable
            indexes = {r["indexname"] for r in await conn.fetch("SELECT indexname FROM pg_indexes WHERE tablename = 'nodes'")}
            assert {"nodes_by_parent", "nodes_by_id", "nodes_pending_lease", "nodes_by_conversation"} <= indexes
            functions = {r["proname"] for r in await conn.fetch("SELECT proname FROM pg_proc WHERE proname LIKE 'bp_%'")}
            assert {"bp_begin_call", "bp_finish_call", "bp_path", "bp_reap", "bp_renew"} <= functions
            versions = [r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations ORDER BY version")]
            assert versions == list(range(1, latest_version() + 1))
        finally:
            await conn.close()

    run(check())


def test_concurrent_migrations_are_serialised(pg_server_url):
    url = new_database(pg_server_url)

    async def race():
        results = await asyncio.gather(*(migrate(url) for _ in range(4)))
        applied = sorted(v for r in results for v in r)
        assert applied == list(range(1, latest_version() + 1))  # each migration applied exactly once

    run(race())


def test_the_outcome_enum_is_the_columns_check_and_status_follows_it(template_url):
    from storage import Outcome

    async def check():
        conn = await asyncpg.connect(template_url)
        try:
            definition = await conn.fetchval(
                "SELECT pg_get_constraintdef(c.oid) FROM pg_constraint c WHERE c.conrelid = 'nodes'::regclass "
                "AND pg_get_constraintdef(c.oid) LIKE '%outcome = ANY%'")
            listed = set(re.findall(r"'(\w+)'::text", definition))
            assert listed == {o.value for o in Outcome}
            derived = {r["o"]: r["s"] for r in await conn.fetch(
                "SELECT o, CASE WHEN o IS NULL THEN 'pending' WHEN o = 'success' THEN 'success' ELSE 'failed' END AS s "
                "FROM unnest($1::text[]) o", [None, *[o.value for o in Outcome]])}
            generated = await conn.fetchval(
                "SELECT pg_get_expr(d.adbin, d.adrelid) FROM pg_attrdef d JOIN pg_attribute a "
                "ON a.attrelid = d.adrelid AND a.attnum = d.adnum WHERE d.adrelid = 'nodes'::regclass AND a.attname = 'status'")
            assert "outcome" in generated and derived[None] == "pending" and derived["overflow"] == "failed"
        finally:
            await conn.close()

    run(check())


def test_the_head_rule_table(template_url):
    """bp_can_be_head -- the one place that says whether the head may rest on a node."""
    expected = {
        ("turn", "success"): True, ("turn", "transient"): True,
        ("turn", "overflow"): False, ("turn", "invalid"): False, ("turn", None): False,
        ("compaction", "success"): True, ("items", "success"): True,
        ("transform", "success"): False, ("transform", "transient"): False,
        ("transform", "overflow"): False, ("transform", "invalid"): False,
    }

    async def check():
        conn = await asyncpg.connect(template_url)
        try:
            for (kind, outcome), moves in expected.items():
                assert await conn.fetchval("SELECT coalesce(bp_can_be_head($1, $2), false)", kind, outcome) is moves, (kind, outcome)
        finally:
            await conn.close()

    run(check())


async def _migrate_to(conn: asyncpg.Connection, version: int) -> None:
    """Bring an empty database to an old schema version (migrations 1..version, no functions)."""
    from storage.migrate import load_migrations

    await conn.execute("CREATE TABLE schema_migrations (version integer PRIMARY KEY, name text NOT NULL, "
                       "applied_at timestamptz NOT NULL DEFAULT now())")
    for m in load_migrations()[:version]:
        await m.apply(conn)
        await conn.execute("INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", m.version, m.name)


def test_the_transcript_backfill_gives_existing_nodes_their_keys(pg_server_url):
    """A database from before transcript hashes (version 5, nodes with sent_hash) is migrated: every
    node gets the chain that node_keys computes from its items, and sent_hash is gone."""
    import json

    from storage.transcript import node_keys

    url = new_database(pg_server_url)

    async def check():
        conn = await asyncpg.connect(url)
        try:
            await _migrate_to(conn, 5)
            await conn.execute("""
                INSERT INTO conversations (tenant, id, tree_id) VALUES ('t', 'c', '00000000-0000-7000-8000-000000000001');
                INSERT INTO nodes (tree_id, id, tenant, conversation_id, parent_id, kind, outcome, sent, sent_hash,
                                   received, depth, created_at, compacted_from) VALUES
                ('00000000-0000-7000-8000-000000000001', '00000000-0000-7000-8000-0000000000a1', 't', 'c', NULL,
                 'turn', 'success', '[{"role": "system", "content": "s"}, {"role": "user", "content": "q1"}]', '\\x00',
                 '[{"role": "assistant", "content": "a1"}]', 0, now(), NULL),
                ('00000000-0000-7000-8000-000000000001', '00000000-0000-7000-8000-0000000000a2', 't', 'c',
                 '00000000-0000-7000-8000-0000000000a1', 'turn', 'transient', '[{"role": "user", "content": "q2"}]',
                 '\\x00', NULL, 1, now(), NULL),
                ('00000000-0000-7000-8000-000000000001', '00000000-0000-7000-8000-0000000000a3', 't', 'c', NULL,
                 'compaction', 'success', '[{"role": "user", "content": "summary"}]', '\\x00', NULL, 0, now(),
                 '00000000-0000-7000-8000-0000000000a1');
            """)
        finally:
            await conn.close()
        assert await migrate(url) == list(range(6, latest_version() + 1))
        conn = await asyncpg.connect(url)
        try:
            rows = [dict(r) for r in await conn.fetch(
                "SELECT id, parent_id, kind, outcome, sent::text, received::text, compacted_from, chain, answered, "
                "system_hash FROM nodes")]
            columns = {r["column_name"] for r in await conn.fetch(
                "SELECT column_name FROM information_schema.columns WHERE table_name = 'nodes'")}
        finally:
            await conn.close()
        assert "sent_hash" not in columns
        for r in rows:
            r["sent"] = json.loads(r["sent"])
            r["received"] = json.loads(r["received"]) if r["received"] else None
        keys = node_keys(rows)
        by_id = {str(r["id"]): r for r in rows}
        for r in rows:
            k = keys[r["id"]]
            assert (r["chain"], r["answered"], r["system_hash"]) == (k.chain, k.answered, k.system_hash)
        compaction = by_id["00000000-0000-7000-8000-0000000000a3"]
        assert compaction["chain"] == by_id["00000000-0000-7000-8000-0000000000a1"]["chain"]  # stands for what it replaced
        assert by_id["00000000-0000-7000-8000-0000000000a2"]["answered"] is True

    run(check())


def test_tree_keys_migration_moves_trees_to_their_owners_names(pg_server_url, upstream_url, upstream):
    """A database from before derived tree ids (version 10): each tree is renamed after its owner
    (the conversation that is not a fork; else the oldest), forks get alias rows, and every
    conversation goes on with its context intact."""

    from .conftest import make_settings, serve_proxy
    from .helpers import say, user

    url = new_database(pg_server_url)
    t1, t2 = "00000000-0000-7000-8000-0000000000f1", "00000000-0000-7000-8000-0000000000f2"
    node = "00000000-0000-7000-8000-0000000000{}".format
    tenant = "t_" + "ab" * 16

    async def setup():
        conn = await asyncpg.connect(url)
        try:
            await _migrate_to(conn, 10)
            rows = [  # tree, id, conversation, parent, question, depth
                (t1, node("a1"), "src", None, "q1", 0), (t1, node("a2"), "src", node("a1"), "q2", 1),
                (t1, node("a3"), "fork", node("a1"), "fq", 1), (t2, node("b1"), "orphan", None, "oq", 0)]
            for tree, nid, conv, parent, q, depth in rows:
                await conn.execute(
                    "INSERT INTO nodes (tree_id, id, tenant, conversation_id, parent_id, kind, outcome, sent, received, "
                    "depth, chain, answered) VALUES ($1, $2, $3, $4, $5, 'turn', 'success', $6::jsonb, $7::jsonb, $8, "
                    "'\\x00', true)", tree, nid, tenant, conv, parent, f'[{{"role": "user", "content": "{q}"}}]',
                    f'[{{"role": "assistant", "content": "echo: {q}"}}]', depth)
            await conn.execute(f"""
                INSERT INTO conversations (tenant, id, tree_id, head_node_id, forked_from, fork_node_id, created_at) VALUES
                ('{tenant}', 'src', '{t1}', '{node("a2")}', NULL, NULL, now() - interval '3 min'),
                ('{tenant}', 'fork', '{t1}', '{node("a3")}', 'src', '{node("a1")}', now() - interval '2 min'),
                ('{tenant}', 'orphan', '{t2}', '{node("b1")}', 'gone', '{node("b1")}', now() - interval '1 min')""")
            assert await migrate(url) == list(range(11, latest_version() + 1))
            trees = {r["id"]: r["tree_id"] for r in await conn.fetch("SELECT id, tree_id FROM conversations")}
            aliases = {r["id"]: r["target"] for r in await conn.fetch("SELECT id, target FROM conversation_aliases")}
            derived = {c: await conn.fetchval("SELECT bp_tree_of($1, $2)", tenant, c) for c in trees}
            node_trees = {r["id"]: r["tree_id"] for r in await conn.fetch("SELECT id, tree_id FROM nodes")}
        finally:
            await conn.close()
        assert trees == {"src": derived["src"], "fork": derived["src"], "orphan": derived["orphan"]}
        assert aliases == {"fork": derived["src"]}
        assert set(node_trees.values()) == {derived["src"], derived["orphan"]}

    run(setup())
    # the three conversations go on where they were, through the API
    with serve_proxy(make_settings(url, upstream_url, auth={"mode": "keys", "keys": [{"key": "sk-k", "tenant": tenant}]})) as p:
        client = p.openai("sk-k")
        for conv, expected in (("src", ["q1", "echo: q1", "q2", "echo: q2", "next"]),
                               ("fork", ["q1", "echo: q1", "fq", "echo: fq", "next"]),
                               ("orphan", ["oq", "echo: oq", "next"])):
            say(client, conv, user("next"))
            assert [m["content"] for m in upstream.last.body["messages"]] == expected, conv


def test_the_functions_files_are_all_applied_in_the_listed_order_each_with_its_header():
    """storage/functions.sql lists every file of storage/functions/ once, basics first; each
    file says what it holds and which refusals and locks apply; no function is made twice."""
    from pathlib import Path

    from storage.migrate import function_files

    root = Path(__file__).resolve().parents[1] / "storage"
    listed = function_files()
    assert listed[0] == "functions/basics.sql" and len(set(listed)) == len(listed)
    assert sorted(listed) == sorted(f"functions/{p.name}" for p in (root / "functions").glob("*.sql"))
    made = []
    for name in listed:
        text = (root / name).read_text()
        assert text.startswith("-- Server-side functions, part "), name
        header = text[:text.index("\nCREATE")]
        assert "Refusals" in header and "Lock" in header, name
        made += re.findall(r"^CREATE (?:OR REPLACE )?FUNCTION (\w+)\(", text, re.M)
    assert len(made) == len(set(made)), sorted(f for f in made if made.count(f) > 1)


def test_the_call_contracts_are_read_field_by_field_in_one_place(template_url):
    """Each contract has its composite type (storage/functions/calls.sql), field for field; every
    field of CallStart and CallFinish comes out of jsonb_populate_record as the struct held it
    (bytes through hex strings, uuids, arrays, jsonb, nulls), defaults included: every field
    travels."""
    import uuid

    import msgspec

    from storage import CallFinish, CallStart
    from storage.database import Database
    from storage.tree import _jsonb

    start = CallStart(
        tenant="t", conversation_id="c", node_id=uuid.uuid4(), new_tree_id=uuid.uuid4(), kind="turn", mode="full",
        parent_mode="node", parent_id=uuid.uuid4(), sent=[{"role": "user", "content": "a\u0000b"}],
        digests=[b"\x00" * 32, b"\xff" * 32], prefixes=[b"\x01" * 32], system_hash=b"\x02\x03", lease_seconds=1.5,
        model="m", provider="p", params={"temperature": 0.5}, new_conversation_id="n", prefix_offset=3,
        ordinals=[0, 1, 1, 2], api="responses")
    finish = CallFinish(outcome="success", received=[{"role": "assistant", "content": "x"}],
                        received_digests=[b"\x05" * 32], usage={"total_tokens": 3}, finish_reason="stop",
                        error={"type": "e"}, request_hash=b"\x06" * 32, leased=True)
    cases = [("bp_call_start_t", start),
             ("bp_call_start_t", msgspec.structs.replace(start, conversation_id=None, parent_id=None, digests=[],
                                                         prefixes=[], system_hash=None, params={}, model=None)),
             ("bp_call_start_t", CallStart(**{**msgspec.structs.asdict(start), "new_conversation_id": None,
                                              "prefix_offset": 0, "ordinals": None, "api": "chat"})),
             ("bp_call_finish_t", finish), ("bp_call_finish_t", CallFinish(outcome="transient"))]

    async def check():
        db = await Database().open(template_url, min_size=1, max_size=1)
        try:
            for kind, contract in cases:
                attributes = [r["attname"] for r in await db.fetch(
                    "SELECT attname FROM pg_attribute WHERE attrelid = $1::regclass AND attnum > 0 "
                    "AND NOT attisdropped ORDER BY attnum", kind)]
                assert sorted(attributes) == sorted(type(contract).__struct_fields__), kind
                assert set(msgspec.json.decode(bytes(_jsonb(contract)))) == set(attributes), kind  # all travel
                row = await db.fetchrow(f"SELECT (jsonb_populate_record(NULL::{kind}, $1)).*", _jsonb(contract))
                assert dict(row.items()) == msgspec.structs.asdict(contract), contract
        finally:
            await db.close()

    run(check())


def test_a_contract_type_is_made_again_only_when_its_attributes_change(pg_server_url):
    """Migrating twice keeps the contract types (same oid: a role owning only the functions can
    migrate); a changed attribute list makes the type again."""
    from storage import CallStart

    url = new_database(pg_server_url)

    async def check():
        await migrate(url)
        conn = await asyncpg.connect(url)
        try:
            oid = await conn.fetchval("SELECT 'bp_call_start_t'::regtype::oid")
            await migrate(url)
            assert await conn.fetchval("SELECT 'bp_call_start_t'::regtype::oid") == oid
            attributes = ("SELECT count(*) FROM pg_attribute WHERE attrelid = 'bp_call_start_t'::regclass "
                          "AND attnum > 0")
            await conn.execute("SELECT bp_define_type('bp_call_start_t', 'tenant text')")
            assert await conn.fetchval(attributes) == 1
            await migrate(url)
            assert await conn.fetchval(attributes) == len(CallStart.__struct_fields__)
            for gone in ("bp_call_start", "bp_bytes"):
                assert not await conn.fetchval("SELECT count(*) FROM pg_proc WHERE proname = $1", gone)
        finally:
            await conn.close()

    run(check())


def test_an_existing_database_upgrades_to_the_call_contracts(pg_server_url):
    """A database with the start and finish of before (21 and 10 arguments) migrates to one
    overload of each, taking one jsonb contract."""
    url = new_database(pg_server_url)
    old = {
        "bp_begin_call": "text, text, text, uuid, uuid, text, text, text, uuid, jsonb, bytea[], bytea[], integer, "
                         "bytea, double precision, text, text, jsonb, integer[], text, uuid[]",
        "bp_begin_full": "text, text, text, uuid, uuid, text, jsonb, bytea[], integer, bytea, double precision, "
                         "text, text, jsonb, integer[], text, uuid[]",
        "bp_finish_call": "uuid, uuid, text, jsonb, bytea[], jsonb, text, jsonb, bytea, boolean",
    }

    async def check():
        conn = await asyncpg.connect(url)
        try:
            await _migrate_to(conn, 12)
            for name, args in old.items():
                await conn.execute(f"CREATE FUNCTION {name}({args}) RETURNS boolean LANGUAGE sql AS 'SELECT true'")
            assert 13 in await migrate(url)
            signatures = {r["p"] for r in await conn.fetch(
                "SELECT oid::regprocedure::text AS p FROM pg_proc WHERE proname = ANY($1)", list(old))}
            assert signatures == {"bp_begin_call(jsonb,uuid[])", "bp_begin_full(jsonb,uuid[])",
                                  "bp_finish_call(uuid,uuid,jsonb)"}
        finally:
            await conn.close()

    run(check())


def test_ready_on_the_schema_of_this_version_or_a_newer_one(own_proxy):
    """/readyz is 503 while migrations are pending; a schema a newer version migrated (its
    `migrate` run before it rolls out, as the README says) serves this one too: it stays ready --
    every running process left its load balancer at once."""
    db, ready = own_proxy.db, lambda: httpx.get(f"{own_proxy.url}/readyz", timeout=10)
    assert ready().status_code == 200
    db.fetch("INSERT INTO schema_migrations (version, name) VALUES ($1, 'from a newer version')", latest_version() + 1)
    r = ready()
    assert (r.status_code, r.json()["schema_version"]) == (200, latest_version() + 1)
    db.fetch("DELETE FROM schema_migrations WHERE version >= $1", latest_version())
    r = ready()
    assert (r.status_code, r.json()["status"]) == (503, "unavailable") and "pending" in r.text
