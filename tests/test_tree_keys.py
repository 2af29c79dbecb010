"""Co-location (docs/scaling.md#past-one-postgresql): each database round trip of a call touches
rows of one tree only, so a PostgreSQL distributed by tree_id (Citus) keeps every call on one
shard.

How it is proven on the real schema, two ways:

1. Every plan names one tree. The proxy connects as a role for which auto_explain logs the plan
   of every statement, nested ones (inside the server-side functions) included; every scan of
   `nodes`, `conversations` or `conversation_aliases` must have a `tree_id = ...` condition --
   what a distributed PostgreSQL routes a statement by. (Read from the embedded server's log;
   with an external test database whose log is not readable, only check 2 runs.)
2. Every round trip touches one tree. That role is under row-level security whose
policies let every row through but record, for every row a statement reads or writes in
`nodes`, `conversations` and `conversation_aliases`, its tree_id -- keyed by the client statement
(backend pid + statement start). The indexes that do not begin with tree_id are dropped, so a
statement that finds rows without naming their tree -- a fan-out to every shard on a distributed
database -- has to scan, and records the other trees' rows it passes."""

import uuid
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx
import pytest

from .conftest import make_settings, run, serve_proxy
from .helpers import MODEL

GUARD = r"""
CREATE UNLOGGED TABLE bp_touches (pid integer, stmt timestamptz, query text, rel text, tree uuid);
CREATE FUNCTION bp_touch(p_rel text, p_tree uuid) RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    INSERT INTO bp_touches VALUES (pg_backend_pid(), statement_timestamp(), current_query(), p_rel, p_tree);
    RETURN true;
END $$;
DO $$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'bp_guarded') THEN
        CREATE ROLE bp_guarded LOGIN PASSWORD 'guarded';
    END IF;
END $$;
GRANT ALL ON ALL TABLES IN SCHEMA public TO bp_guarded;
ALTER ROLE bp_guarded SET session_preload_libraries = 'auto_explain';
ALTER ROLE bp_guarded SET auto_explain.log_min_duration = 0;
ALTER ROLE bp_guarded SET auto_explain.log_nested_statements = on;
ALTER ROLE bp_guarded SET auto_explain.log_format = 'json';
GRANT ALL ON SCHEMA public TO bp_guarded;
-- the proxy re-applies its functions (storage/functions/) at start: it owns the functions (the
-- tables stay the superuser's, so their row-level security applies to it)
DO $$ DECLARE f record; BEGIN
    FOR f IN SELECT p.oid::regprocedure AS sig FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
              WHERE n.nspname = 'public' AND p.proname LIKE 'bp\_%' LOOP
        EXECUTE format('ALTER FUNCTION %s OWNER TO bp_guarded', f.sig);
    END LOOP;
END $$;
"""

TABLES = ("nodes", "conversations", "conversation_aliases")


def _guarded(url: str) -> str:
    """``url`` with the guarded role, whose statements are recorded."""
    async def setup():
        conn = await asyncpg.connect(url)
        try:
            await conn.execute(GUARD)
            db = urlsplit(url).path.lstrip("/")
            await conn.execute(f'ALTER ROLE bp_guarded IN DATABASE "{db}" SET enable_seqscan = off')
            for index in ("conversations_by_created", "conversations_by_name", "nodes_by_id", "nodes_by_conversation",
                          "nodes_by_chain", "nodes_pending_lease"):
                await conn.execute(f"DROP INDEX {index}")
            for table in TABLES:
                await conn.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
                await conn.execute(f"CREATE POLICY guard ON {table} TO bp_guarded "
                                   f"USING (bp_touch('{table}', tree_id)) WITH CHECK (bp_touch('{table}', tree_id))")
        finally:
            await conn.close()

    run(setup())
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme, f"bp_guarded:guarded@{host}", parts.path, parts.query, parts.fragment))


def _statements(url: str) -> list[tuple[str, dict[str, set[uuid.UUID]]]]:
    """Each recorded client statement since the last call: (its text, {table: trees touched})."""
    async def read():
        conn = await asyncpg.connect(url)
        try:
            rows = await conn.fetch("SELECT pid, stmt, query, rel, tree FROM bp_touches")
            await conn.execute("TRUNCATE bp_touches")
        finally:
            await conn.close()
        out: dict[tuple[int, object], tuple[str, dict[str, set[uuid.UUID]]]] = {}
        for r in rows:
            _, rels = out.setdefault((r["pid"], r["stmt"]), (r["query"], {}))
            rels.setdefault(r["rel"], set()).add(r["tree"])
        return list(out.values())

    return run(read())


def _log_file(url: str):
    async def q():
        conn = await asyncpg.connect(url)
        try:
            return await conn.fetchval("SELECT current_setting('data_directory')")
        finally:
            await conn.close()
    from pathlib import Path

    path = Path(run(q())) / "log"  # where the embedded server logs (pg_ctl -l)
    return path if path.exists() else None


def _plans(log, offset: int) -> list[dict]:
    """The JSON plans auto_explain wrote to ``log`` after ``offset``."""
    import json

    text = log.read_bytes()[offset:].decode("utf-8", "replace")
    decoder = json.JSONDecoder()
    plans, at = [], 0
    while (at := text.find("plan:", at)) >= 0:
        start = text.find("{", at)
        try:
            plan, end = decoder.raw_decode(text, start)
        except ValueError:
            at += 5
            continue
        plans.append(plan)
        at = end
    return plans


def _scans_without_tree(plan: dict) -> list[str]:
    """Scans of our tables in ``plan`` whose conditions do not name a tree_id."""
    bad = []

    def walk(node: dict) -> None:
        if node.get("Relation Name") in TABLES and node.get("Node Type") != "ModifyTable":
            conditions = " ".join(str(node.get(k, "")) for k in ("Index Cond", "Recheck Cond", "Filter"))
            if "tree_id =" not in conditions:
                bad.append(f"{node['Node Type']} on {node['Relation Name']}: {conditions or 'no condition'}")
        for child in node.get("Plans", []):
            walk(child)

    walk(plan["Plan"])
    return bad


def _trees(statement: dict[str, set[uuid.UUID]]) -> set[uuid.UUID]:
    return set().union(*statement.values())


@pytest.fixture
def guarded(fresh_database_url, upstream_url):
    settings = make_settings(_guarded(fresh_database_url), upstream_url,
                             server={"reaper_interval_seconds": 3600},  # no background sweep in the records
                             database={"batch_calls": False})  # as docs/scaling.md has it for a distributed database
    with serve_proxy(settings) as p:
        _statements(fresh_database_url)  # forget the start-up
        yield p, fresh_database_url


@pytest.fixture
def plan_log(fresh_database_url):
    """(the server log, where it ends now) -- None when the log cannot be read here."""
    log = _log_file(fresh_database_url)
    return (log, log.stat().st_size) if log is not None else None


def _tree_of(url, tenant, conversation):
    async def q():
        conn = await asyncpg.connect(url)
        try:
            return await conn.fetchval("SELECT bp_tree_of($1, $2)", tenant, conversation)
        finally:
            await conn.close()
    return run(q())


def _one_tree_each(url, what, allowed_extra=()):
    statements = _statements(url)
    assert statements, f"{what}: nothing recorded"
    for query, rels in statements:
        trees = _trees(rels)
        extra = trees - set(allowed_extra)
        assert len(extra) <= 1, f"{what}: one statement touched {len(trees)} trees: {query[:200]} {rels}"
    return statements


def test_every_round_trip_of_a_call_touches_one_tree(plan_log, guarded, key, cid):
    p, url = guarded
    headers = {"Authorization": f"Bearer {key}"}
    tenant = p.runtime.auth(f"Bearer {key}").tenant
    with httpx.Client(base_url=p.url, headers=headers, timeout=30) as http:
        # other conversations of the tenant exist beside it, with the very same history
        for other in ("other-1", "other-2"):
            http.post("/v1/chat/completions", headers={"X-Conversation-Id": other},
                      json={"model": MODEL, "messages": [{"role": "user", "content": "first turn"}]}).raise_for_status()
        _statements(url)
        tree = _tree_of(url, tenant, cid)

        def chat(what, **kw):
            body = {"model": MODEL, "messages": [{"role": "user", "content": what}], **kw.pop("body", {})}
            r = http.post("/v1/chat/completions", headers={"X-Conversation-Id": cid, **kw.pop("headers", {})},
                          json=body)
            assert r.status_code == 200, r.text
            statements = _one_tree_each(url, what)
            assert all(_trees(rels) == {tree} for _, rels in statements), (what, statements)
            return r

        first = chat("first turn")  # the conversation is made
        chat("second turn")
        chat("a stream", body={"stream": True})
        chat("a side call", headers={"X-Node-Kind": "transform"})
        chat("an edit", headers={"X-Parent-Node-Id": first.headers["x-node-id"]})
        history = [{"role": "user", "content": "first turn"}, {"role": "assistant", "content": "echo: first turn"},
                   {"role": "user", "content": "resent"}]
        r = http.post("/v1/chat/completions", headers={"X-Conversation-Id": cid, "X-Context-Mode": "full"},
                      json={"model": MODEL, "messages": history})
        assert r.status_code == 200 and r.headers["x-context-matched"] == "2"
        assert all(_trees(rels) == {tree} for _, rels in _one_tree_each(url, "full-history match"))

        # head moves
        assert http.put(f"/admin/conversations/{cid}/head", json={"node_id": first.headers["x-node-id"]}).status_code == 200
        assert all(_trees(rels) == {tree} for _, rels in _one_tree_each(url, "head move"))
        assert http.post(f"/admin/conversations/{cid}/switch", json={"node_id": first.headers["x-node-id"]}).status_code == 200
        assert all(_trees(rels) == {tree} for _, rels in _one_tree_each(url, "switch"))

        # compaction applied
        r = http.post(f"/admin/conversations/{cid}/compact")
        assert r.status_code == 200, r.text
        assert all(_trees(rels) == {tree} for _, rels in _one_tree_each(url, "compaction"))

        # a fork: it lives in its source's tree; its own name's tree holds only its alias row
        fork = f"{cid}-fork"
        assert http.post(f"/admin/conversations/{cid}/fork", json={"conversation_id": fork}).status_code == 200
        alias_tree = _tree_of(url, tenant, fork)
        for _, rels in _one_tree_each(url, "fork", allowed_extra=(alias_tree,)):
            assert _trees(rels) <= {tree, alias_tree}
        r = http.post("/v1/chat/completions", headers={"X-Conversation-Id": fork},
                      json={"model": MODEL, "messages": [{"role": "user", "content": "on the fork"}]})
        assert r.status_code == 200
        for _, rels in _one_tree_each(url, "a turn on a fork", allowed_extra=(alias_tree,)):
            # the one extra lookup: the alias row at the fork's own name
            assert rels.get("conversation_aliases", set()) <= {alias_tree}
            assert {t for rel, ts in rels.items() if rel != "conversation_aliases" for t in ts} <= {tree}

    if plan_log is not None:
        log, offset = plan_log
        plans = _plans(log, offset)
        assert len(plans) > 50, "auto_explain wrote no plans"
        bad = {(p.get("Query Text", "")[:160], b) for p in plans for b in _scans_without_tree(p)}
        assert not bad, "statements that name no tree:\n" + "\n".join(f"{q!r}: {b}" for q, b in sorted(bad))

    # reap: a dead process's call (the reaper's sweep finds expired leases across trees -- a
    # background query, not a call's -- and reaps each node in a statement of its own)
    node = uuid.UUID(first.headers["x-node-id"])

    async def reap():
        conn = await asyncpg.connect(url)
        try:
            await conn.execute("UPDATE nodes SET outcome = NULL, lease_until = now() - interval '1 min', "
                               "finished_at = NULL, received = NULL WHERE id = $1", node)
            await conn.execute("TRUNCATE bp_touches")
        finally:
            await conn.close()
        guarded_conn = await asyncpg.connect(p.settings.database.url)
        try:
            return await guarded_conn.fetchval("SELECT bp_reap(p_tree => $1, p_node => $2)", tree, node)
        finally:
            await guarded_conn.close()

    assert run(reap()) is True
    assert all(_trees(rels) == {tree} for _, rels in _one_tree_each(url, "reap"))


def test_a_start_beside_its_tree_reads_that_tree_only(guarded, key, cid):
    """On a schema distributed by tree a named conversation's start runs on the worker holding
    the tree it is sent beside (``bp_begin_call_at``, storage.tree): each such round trip must
    touch that one tree, or it would reach other shards from a worker. Checked here by making the
    proxy take its database for a distributed one: every start statement's rows, and where the
    starts go -- a fork's first turn beside its name's tree (its alias row only), then beside its
    tree; a new name, and a name made again after a delete, on the coordinator's general start."""
    p, url = guarded
    p.runtime.db.distributed = True  # (read by each start: storage.tree.TreeStore.begin_call)
    headers = {"Authorization": f"Bearer {key}"}
    tenant = p.runtime.auth(f"Bearer {key}").tenant
    tree, fork = _tree_of(url, tenant, cid), f"{cid}-fork"
    fork_tree = _tree_of(url, tenant, fork)

    def starts(what):
        """The start statements of the call just made that touched rows: [(beside a tree?, trees
        touched)] (one that found nothing touched none, and is not recorded)."""
        found = [("bp_begin_call_at" in q, _trees(rels)) for q, rels in _one_tree_each(url, what)
                 if "bp_begin_call" in q]
        assert found, what
        return found

    with httpx.Client(base_url=p.url, headers=headers, timeout=30) as http:
        def chat(what, conversation=cid, **kw):
            r = http.post("/v1/chat/completions", headers={"X-Conversation-Id": conversation, **kw.pop("headers", {})},
                          json={"model": MODEL, "messages": [{"role": "user", "content": what}], **kw.pop("body", {})})
            assert r.status_code == 200, r.text
            return r

        # a new name: looked for beside its derived tree (nothing there), made on the coordinator
        first = chat("first turn")
        assert starts("first turn") == [(False, {tree})]
        for what, kw in (("second turn", {}), ("a stream", {"body": {"stream": True}}),
                         ("a side call", {"headers": {"X-Node-Kind": "transform"}}),
                         ("an edit", {"headers": {"X-Parent-Node-Id": first.headers["x-node-id"]}})):
            chat(what, **kw)
            assert starts(what) == [(True, {tree})], what
        history = [{"role": "user", "content": "first turn"}, {"role": "assistant", "content": "echo: first turn"},
                   {"role": "user", "content": "resent"}]
        r = http.post("/v1/chat/completions", headers={"X-Conversation-Id": cid, "X-Context-Mode": "full"},
                      json={"model": MODEL, "messages": history})
        assert r.status_code == 200 and r.headers["x-context-matched"] == "2"
        assert starts("full history") == [(True, {tree})]
        # the safety net: a delta call resending the history, handled in full mode, beside the tree
        r = http.post("/v1/chat/completions", headers={"X-Conversation-Id": cid},
                      json={"model": MODEL, "messages": history + [{"role": "assistant", "content": "echo: resent"},
                                                                   {"role": "user", "content": "again"}]})
        assert r.status_code == 200 and r.headers["x-context-mode"] == "full", r.headers
        assert starts("safety net") == [(True, {tree})]

        # a fork lives in its source's tree: its first start finds the alias beside its own
        # name's tree, then runs beside the source's; the next goes there at once
        assert http.post(f"/admin/conversations/{cid}/fork", json={"conversation_id": fork}).status_code == 200
        _statements(url)
        p.runtime.tree.cache._conversations.clear()  # (as a process that never saw it)
        chat("on the fork", conversation=fork)
        assert starts("on the fork") == [(True, {fork_tree}), (True, {tree})]
        chat("on the fork again", conversation=fork)
        assert starts("on the fork again") == [(True, {tree})]

        # the fork deleted and its name made again: the remembered tree no longer holds it, so
        # the start goes to the coordinator, which makes it in the name's own tree
        assert http.delete(f"/admin/conversations/{fork}").status_code == 200
        _statements(url)
        chat("a new conversation of that name", conversation=fork)
        assert starts("made again") == [(False, {fork_tree})]
        path = http.get(f"/admin/conversations/{fork}/path").json()
        assert [n["sent"][0]["content"] for n in path["data"]] == ["a new conversation of that name"], path

        # a parent outside the conversation: still 404, from the coordinator's start
        r = http.post("/v1/chat/completions", headers={"X-Conversation-Id": "never-made",
                                                      "X-Parent-Node-Id": first.headers["x-node-id"]},
                      json={"model": MODEL, "messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 404, r.text


def test_the_derived_tree_is_computed_in_python_as_in_the_database(database_url):
    from storage.ids import tree_of

    for tenant, name in (("t", "c"), ("", ""), ("tenant-ß", "conversation ✓ 💬"), ("ab", "c:d"), ("a", "bc:d")):
        assert tree_of(tenant, name) == _tree_of(database_url, tenant, name), (tenant, name)
    assert tree_of("ab", "c") != tree_of("a", "bc")  # (the tenant's length keeps them apart)


def test_a_start_beside_no_tree_is_refused(database_url):
    """``bp_begin_call_at`` needs the tree it runs beside (it sets the start's tree_id to it): a
    null one is refused, not taken for a start that may claim a name anywhere."""
    async def start_beside_nothing():
        conn = await asyncpg.connect(database_url)
        try:
            with pytest.raises(asyncpg.RaiseError, match="no tree given"):
                await conn.fetch("SELECT * FROM bp_begin_call_at(NULL, '{}'::jsonb)")
        finally:
            await conn.close()

    run(start_beside_nothing())
