"""Branchpoint distributed by tree on Citus (docs/scaling.md): ``branchpoint distribute``, and the
single-shard property on Citus itself.

The Citus tests run when ``BRANCHPOINT_TEST_DATABASE_URL`` is a Citus coordinator with workers
(tests/citus_cluster.py; .ci/citus.sh builds and starts one); elsewhere they are skipped, saying so.
Three tests run everywhere: ``branchpoint distribute`` on a database without Citus changes nothing,
a plain database is not taken for a distributed one (batching stays on), and a call makes asyncpg
introspect no type on a new connection.

The single-shard property is checked two ways, on a database of the test's own:

1. Every statement of every hot operation is a router statement. The database is set, on the
   coordinator and on every worker, to refuse any statement Citus would run as more than one task
   (``citus.multi_task_query_log_level = error``): nested statements of the server-side functions
   included, on the coordinator and inside the functions run on a worker (``DELEGATED``). Each hot
   operation -- turn, stream, side call, full-history match in a named conversation, head move,
   switch, fork, compaction, reap -- must then succeed through the HTTP API; a statement reading
   several shards would fail it. A control statement that reads every shard is refused there, on
   the coordinator and on a worker, so the check is live.
2. EXPLAIN of the statements themselves, with real values: the calls ``branchpoint distribute``
   delegates show one task sent to one worker (the function runs there), and the recursive path
   read is one task (router); ``/auto/v1`` discovery's probe shows a task per shard (its fan-out,
   measured: bench/citus.py).
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from typing import Any

import asyncpg
import httpx
import openai
import pytest
from click.testing import CliRunner

from proxy.cli import main as cli
from storage import open_database, queries
from storage.distribute import DELEGATED, NotDistributable, distribute, is_distributed

from .conftest import citus_of, make_settings, new_database, run, serve_proxy, with_database
from .fakes import Reply
from .helpers import MODEL

NO_CLUSTER = ("no Citus cluster configured: BRANCHPOINT_TEST_DATABASE_URL is not a Citus coordinator with workers "
              "(.ci/citus.sh starts one and runs these)")


@pytest.fixture
def cluster(pg_server_url):
    found = citus_of(pg_server_url)
    if found is None:
        pytest.skip(NO_CLUSTER)
    return found


async def _fetch(url: str, sql: str, *args: Any, settings: dict[str, str] | None = None) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(url, server_settings=settings or {})
    try:
        return await conn.fetch(sql, *args)
    finally:
        await conn.close()


def fetch(url: str, sql: str, *args: Any, **kw: Any) -> list[asyncpg.Record]:
    return run(_fetch(url, sql, *args, **kw))


def _plain_database(pg_server_url: str) -> str:
    """A database without Citus on the test server (on a Citus coordinator too: Citus is per database)."""
    name = f"bp_plain_{uuid.uuid4().hex[:12]}"

    async def make():
        conn = await asyncpg.connect(pg_server_url)
        try:
            await conn.execute(f'CREATE DATABASE "{name}"')
        finally:
            await conn.close()

    run(make())
    return with_database(pg_server_url, name)


# ---- everywhere -------------------------------------------------------------------------------

def test_distribute_without_citus_changes_nothing(pg_server_url, monkeypatch):
    """``branchpoint distribute`` on a database without Citus says so, fails, and changes nothing;
    the product then takes its schema for a plain one (batching stays on)."""
    from storage import migrate

    url = _plain_database(pg_server_url)
    run(migrate(url))
    before = fetch(url, "SELECT p.oid::regprocedure::text AS f, md5(prosrc) AS body FROM pg_proc p "
                        "WHERE proname LIKE 'bp\\_%' ORDER BY 1")
    monkeypatch.setenv("BRANCHPOINT_DATABASE_URL", url)
    result = CliRunner().invoke(cli, ["distribute"])
    assert result.exit_code == 1, result.output
    assert "no Citus extension" in result.output and "nothing was changed" in result.output
    assert fetch(url, "SELECT count(*) FROM pg_extension WHERE extname = 'citus'")[0][0] == 0
    assert fetch(url, "SELECT p.oid::regprocedure::text AS f, md5(prosrc) AS body FROM pg_proc p "
                      "WHERE proname LIKE 'bp\\_%' ORDER BY 1") == before

    async def opened():
        db = await open_database(url, min_size=1, max_size=1)
        try:
            return db.distributed
        finally:
            await db.close()

    assert run(opened()) is False


def test_a_call_introspects_no_type_on_a_new_connection(fresh_database_url, upstream_url, key, cid, monkeypatch):
    """asyncpg asks the server about every type it has no codec for, once per connection -- a
    catalog query that on a loaded Citus coordinator took seconds (docs/scaling.md). A process's
    calls send and read none: turns (the second sends the path cache's known nodes), a stream, a
    side call, an edit, full history in a named conversation, found by ``/auto/v1``, and continued
    in a new conversation (the prefix hashes), on the connections of a new pool. On one PostgreSQL and on the cluster alike."""
    introspected: list[list[int]] = []
    original = asyncpg.connection.Connection._introspect_types

    async def spy(self: Any, typeoids: Any, timeout: Any) -> Any:
        introspected.append(sorted(typeoids))
        return await original(self, typeoids, timeout)

    monkeypatch.setattr(asyncpg.connection.Connection, "_introspect_types", spy)
    with serve_proxy(make_settings(fresh_database_url, upstream_url)) as p:
        client = p.openai(key)
        first = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": "one"}], extra_headers={"X-Conversation-Id": cid})
        for text in ("two", "three"):
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": text}],
                                           extra_headers={"X-Conversation-Id": cid})
        assert p.runtime.tree.cache.known(p.runtime.auth(f"Bearer {key}").tenant, cid, None)  # (sent as known)
        stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "four"}],
                                                stream=True, extra_headers={"X-Conversation-Id": cid})
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        for headers in ({"X-Node-Kind": "transform"}, {"X-Parent-Node-Id": first.headers["x-node-id"]}):
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "five"}],
                                           extra_headers={"X-Conversation-Id": cid, **headers})
        history = [{"role": "user", "content": "one"}, {"role": "assistant", "content": "echo: one"},
                   {"role": "user", "content": "again"}]
        r = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=history, extra_headers={"X-Conversation-Id": cid, "X-Context-Mode": "full"})
        assert r.headers["x-context-matched"] == "2"
        # /auto/v1: no conversation named, the session found by its prefix hashes (sent as text too)
        auto = openai.OpenAI(base_url=f"{p.url}/auto/v1", api_key=key, max_retries=0)
        r = auto.chat.completions.with_raw_response.create(model=MODEL, messages=history[:2] + [
            {"role": "user", "content": "discovered"}])
        assert r.headers["x-context-matched"] == "2"
        # a new conversation's first full-history call that continues another's node (its prefix
        # hashes, sent as text too: storage/queries/calls.py CONTINUED_NODE)
        r = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=history[:2] + [{"role": "user", "content": "continued"}],
            extra_headers={"X-Conversation-Id": f"{cid}-continued", "X-Context-Mode": "full"})
        assert r.headers["x-context-matched"] == "2"
    assert introspected == []


# ---- on a Citus cluster -------------------------------------------------------------------------

@pytest.fixture
def distributed_url(cluster, fresh_database_url):
    """A database of this test's own, distributed (a clone of the distributed template)."""
    return fresh_database_url


def test_distribute_colocates_by_tree_and_is_idempotent(cluster, pg_server_url, monkeypatch):
    url = new_database(pg_server_url)  # Citus and the workers, no table yet
    monkeypatch.setenv("BRANCHPOINT_DATABASE_URL", url)
    migrated = CliRunner().invoke(cli, ["migrate"])  # as a deployment runs it, before distributing
    assert migrated.exit_code == 0, migrated.output

    async def distributed() -> bool:
        conn = await asyncpg.connect(url)
        try:
            return await is_distributed(conn)
        finally:
            await conn.close()

    assert run(distributed()) is False
    first = CliRunner().invoke(cli, ["distribute"])
    assert first.exit_code == 0, first.output
    assert "distributed by tree_id, co-located: nodes, conversations, conversation_aliases" in first.output
    assert "distributed by tenant: shared_items" in first.output
    assert run(distributed()) is True

    every = fetch(url, "SELECT logicalrelid::text AS t, column_to_column_name(logicalrelid, partkey) AS col, "
                       "colocationid FROM pg_dist_partition ORDER BY 1")
    assert {r["t"]: r["col"] for r in every} == {"nodes": "tree_id", "conversations": "tree_id",
                                                 "conversation_aliases": "tree_id", "shared_items": "tenant"}
    tables = [r for r in every if r["t"] != "shared_items"]
    assert len({r["colocationid"] for r in tables}) == 1
    # the shared items: a group of their own (a tenant's, not a tree's), spread over the workers too
    assert {r["colocationid"] for r in every if r["t"] == "shared_items"}.isdisjoint({tables[0]["colocationid"]})
    spread = fetch(url, "SELECT count(DISTINCT nodename || ':' || nodeport) FROM citus_shards "
                        "WHERE table_name = 'shared_items'::regclass")
    assert spread[0][0] == len(cluster.workers)
    shards = fetch(url, "SELECT count(DISTINCT nodename || ':' || nodeport) FROM citus_shards WHERE table_name = 'nodes'::regclass")
    assert shards[0][0] == len(cluster.workers)  # the shards spread over every worker

    functions = fetch(url, """
        SELECT p.oid::regprocedure::text AS f, o.distribution_argument_index AS arg, o.colocationid
          FROM pg_proc p LEFT JOIN pg_catalog.pg_dist_object o ON o.classid = 'pg_proc'::regclass AND o.objid = p.oid
         WHERE p.proname LIKE 'bp\\_%'""")
    by_name = {r["f"]: r for r in functions}
    group = tables[0]["colocationid"]
    for signature, argument in DELEGATED:
        row = by_name[fetch(url, "SELECT $1::regprocedure::text", signature)[0][0]]
        assert row["arg"] is not None and row["colocationid"] == group, signature
        names = fetch(url, "SELECT proargnames FROM pg_proc WHERE oid = $1::regprocedure", signature)[0][0]
        assert names[row["arg"]] == argument
    # every function of ours is on every node
    for host, port in cluster.workers:
        worker = cluster.node_url(host, port, url.rsplit("/", 1)[1])
        assert {r[0] for r in fetch(worker, "SELECT oid::regprocedure::text FROM pg_proc WHERE proname LIKE 'bp\\_%'")} \
            == set(by_name)

    again = CliRunner().invoke(cli, ["distribute"])
    assert again.exit_code == 0, again.output
    assert "nothing changed" in again.output


def test_the_product_sees_a_distributed_schema_and_batches_nothing(distributed_url, upstream_url, key):
    """No setting: a process on a distributed schema sends every start and finish alone (a batch of
    several trees would be a transaction across shards) -- and its calls work."""
    with serve_proxy(make_settings(distributed_url, upstream_url)) as p:
        assert p.runtime.db.distributed is True
        assert p.settings.database.batch_calls is True  # the default: not what turns it off here
        assert not p.runtime.tree._begins.batching() and not p.runtime.tree._finishes.batching()
        client = p.openai(key)

        async def many():
            import asyncio

            aclient = p.async_openai(key)
            try:
                return await asyncio.gather(*(aclient.chat.completions.with_raw_response.create(
                    model=MODEL, messages=[{"role": "user", "content": f"hello {i}"}],
                    extra_headers={"X-Conversation-Id": f"many-{i}-{uuid.uuid4().hex[:6]}"}) for i in range(16)))
            finally:
                await aclient.close()

        batched = p.runtime.db.batched
        answers = run(many())
        assert all(a.headers["x-node-id"] for a in answers)
        assert p.runtime.db.batched == batched  # nothing went in a batch
        r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "one more"}],
                                           extra_headers={"X-Conversation-Id": "one-more"})
        assert r.choices[0].message.content


ROUTER_ONLY = "citus.multi_task_query_log_level"


@pytest.fixture
def router_only(cluster, distributed_url):
    """The test's database, on every node, refusing any statement of more than one task."""
    name = distributed_url.rsplit("/", 1)[1]
    for host, port in cluster.every_node():
        fetch(cluster.node_url(host, port), f"ALTER DATABASE \"{name}\" SET {ROUTER_ONLY} = 'error'")
    return distributed_url


def _tree_of(url: str, tenant: str, conversation: str) -> uuid.UUID:
    return fetch(url, "SELECT bp_tree_of($1, $2)", tenant, conversation)[0][0]


def test_every_statement_of_a_hot_operation_is_a_router_statement(cluster, router_only, upstream_url, key, cid):
    url = router_only
    # the check is live: a statement reading every shard is refused -- on the coordinator, and on
    # a worker (where the delegated functions run)
    with pytest.raises(asyncpg.PostgresError, match="multi-task query about to be executed"):
        fetch(url, "SELECT count(*) FROM nodes")
    host, port = cluster.workers[0]
    with pytest.raises(asyncpg.PostgresError, match="multi-task query about to be executed"):
        fetch(cluster.node_url(host, port, url.rsplit("/", 1)[1]), "SELECT count(*) FROM nodes")

    settings = make_settings(url, upstream_url, server={"reaper_interval_seconds": 3600})  # no sweep (a fan-out)
    with serve_proxy(settings) as p, httpx.Client(base_url=p.url, headers={"Authorization": f"Bearer {key}"},
                                                  timeout=30) as http:
        tenant = p.runtime.auth(f"Bearer {key}").tenant

        def chat(what: str, conversation: str = cid, **kw: Any) -> httpx.Response:
            body = {"model": MODEL, "messages": [{"role": "user", "content": what}], **kw.pop("body", {})}
            r = http.post("/v1/chat/completions", headers={"X-Conversation-Id": conversation, **kw.pop("headers", {})},
                          json=body)
            assert r.status_code == 200, (what, r.text)
            return r

        first = chat("first turn")  # the conversation is made
        chat("second turn")  # its path read, its finish, the head moved
        streamed = chat("a stream", body={"stream": True})
        assert "data:" in streamed.text and "[DONE]" in streamed.text
        chat("a side call", headers={"X-Node-Kind": "transform"})
        chat("an edit", headers={"X-Parent-Node-Id": first.headers["x-node-id"]})
        history = [{"role": "user", "content": "first turn"}, {"role": "assistant", "content": "echo: first turn"},
                   {"role": "user", "content": "resent"}]
        r = http.post("/v1/chat/completions", headers={"X-Conversation-Id": cid, "X-Context-Mode": "full"},
                      json={"model": MODEL, "messages": history})
        assert r.status_code == 200 and r.headers["x-context-matched"] == "2", r.text
        # head moves
        assert http.put(f"/admin/conversations/{cid}/head", json={"node_id": first.headers["x-node-id"]}).status_code == 200
        r = http.post(f"/admin/conversations/{cid}/switch", json={"node_id": first.headers["x-node-id"]})
        assert r.status_code == 200, r.text
        # compaction
        r = http.post(f"/admin/conversations/{cid}/compact")
        assert r.status_code == 200, r.text
        # a fork, and a turn on it
        fork = f"{cid}-fork"
        r = http.post(f"/admin/conversations/{cid}/fork", json={"conversation_id": fork})
        assert r.status_code == 200, r.text
        chat("on the fork", conversation=fork)
        # the admin reads of one conversation
        assert http.get(f"/admin/conversations/{cid}").status_code == 200
        assert http.get(f"/admin/conversations/{cid}/path").status_code == 200
        # a delete (the fork's: what its source still reaches stays)
        r = http.delete(f"/admin/conversations/{fork}")
        assert r.status_code == 200, r.text

    # reap: a dead process's call, reaped by the statement the reaper runs for each expired node
    tree = _tree_of(url, tenant, cid)
    node = uuid.UUID(first.headers["x-node-id"])
    fetch(url, "UPDATE nodes SET outcome = NULL, lease_until = now() - interval '1 min', finished_at = NULL, "
               "received = NULL WHERE tree_id = $1 AND id = $2", tree, node)
    assert fetch(url, "SELECT bp_reap(p_tree => $1, p_node => $2)", tree, node)[0][0] is True


def test_a_lost_start_is_written_again_on_the_worker_holding_its_tree(cluster, router_only, upstream_url, upstream,
                                                                     key, cid):
    """A call's finish finding its node gone (a worker's crash lost the start: docs/architecture.md
    #durability) writes it again -- on the worker, in router statements only: for a turn on a
    conversation's path, and for a conversation's first call (the conversation made again too)."""
    url = router_only
    settings = make_settings(url, upstream_url, server={"reaper_interval_seconds": 3600})
    with serve_proxy(settings) as p, httpx.Client(base_url=p.url, headers={"Authorization": f"Bearer {key}"},
                                                  timeout=30) as http:
        tenant = p.runtime.auth(f"Bearer {key}").tenant

        def lost_call(conversation: str, text: str, count: int, *, first: bool) -> tuple[httpx.Response, dict]:
            hold = threading.Event()
            upstream.enqueue(Reply(content=f"answer to {text}", hold=hold))
            result: dict = {}
            t = threading.Thread(target=lambda: result.update(r=http.post(
                "/v1/chat/completions", headers={"X-Conversation-Id": conversation},
                json={"model": MODEL, "messages": [{"role": "user", "content": text}]})))
            t.start()
            upstream.wait_for(count)
            tree = _tree_of(url, tenant, conversation)
            pending = fetch(url, "SELECT * FROM nodes WHERE tree_id = $1 AND conversation_id = $2 AND outcome IS NULL",
                            tree, conversation)[0]
            fetch(url, "DELETE FROM nodes WHERE tree_id = $1 AND id = $2", tree, pending["id"])
            if first:
                fetch(url, "DELETE FROM conversations WHERE tree_id = $1 AND tenant = $2 AND id = $3",
                      tree, tenant, conversation)
            else:
                fetch(url, "UPDATE conversations SET lease_node_id = NULL, lease_until = NULL "
                           "WHERE tree_id = $1 AND tenant = $2 AND id = $3", tree, tenant, conversation)
            hold.set()
            t.join(30)
            assert result["r"].status_code == 200, result["r"].text
            return result["r"], dict(pending)

        # a conversation's first call
        r, pending = lost_call(cid, "first", 1, first=True)
        tree = _tree_of(url, tenant, cid)
        node = fetch(url, "SELECT * FROM nodes WHERE tree_id = $1 AND id = $2", tree, pending["id"])[0]
        assert node["status"] == "success" and node["parent_id"] is None
        head = fetch(url, "SELECT head_node_id FROM conversations WHERE tree_id = $1 AND tenant = $2 AND id = $3",
                     tree, tenant, cid)
        assert head[0][0] == pending["id"]
        # a turn on its path
        r, second = lost_call(cid, "second", 2, first=False)
        node = fetch(url, "SELECT * FROM nodes WHERE tree_id = $1 AND id = $2", tree, second["id"])[0]
        assert node["status"] == "success" and node["parent_id"] == pending["id"] and node["depth"] == 1
        third = http.post("/v1/chat/completions", headers={"X-Conversation-Id": cid},
                          json={"model": MODEL, "messages": [{"role": "user", "content": "third"}]})
        assert third.status_code == 200 and third.headers["x-parent-node-id"] == str(second["id"])
        assert "answer to second" in upstream.last.text() and "answer to first" in upstream.last.text()


def test_a_schema_distributed_before_the_shared_items_gets_them_distributed(cluster, pg_server_url, monkeypatch):
    """An upgrade: a schema distributed before ``shared_items`` existed (that table still local
    to the coordinator) -- a second ``branchpoint distribute`` distributes it by tenant, keeping
    its rows, and a third changes nothing."""
    from storage import migrate

    url = new_database(pg_server_url)
    run(migrate(url))
    fetch(url, "INSERT INTO shared_items (tenant, hash, item) VALUES ('t-up', 'h1', '{\"a\": 1}'), "
               "('t-up', 'h2', '[2]'), ('t-other', 'h1', '\"three\"')")

    async def spread(before: Any = None) -> Any:
        conn = await asyncpg.connect(url)
        try:
            if before is not None:
                await before(conn)
            return await distribute(conn)
        finally:
            await conn.close()

    async def without_shared_items(conn: asyncpg.Connection) -> None:
        # what the earlier `distribute` did: the three tree tables only
        await conn.execute("SELECT create_distributed_table('nodes', 'tree_id')")
        await conn.execute("SELECT create_distributed_table('conversations', 'tree_id', colocate_with => 'nodes')")
        await conn.execute("SELECT create_distributed_table('conversation_aliases', 'tree_id', "
                           "colocate_with => 'nodes')")

    first = run(spread(without_shared_items))
    assert first.tables == ["shared_items"]
    assert fetch(url, "SELECT column_to_column_name(logicalrelid, partkey) FROM pg_dist_partition "
                      "WHERE logicalrelid = 'shared_items'::regclass")[0][0] == "tenant"
    assert sorted(tuple(r) for r in fetch(url, "SELECT tenant, hash FROM shared_items")) == [
        ("t-other", "h1"), ("t-up", "h1"), ("t-up", "h2")]
    assert not run(spread()).changed


def test_a_large_system_prompt_and_tools_are_router_statements_end_to_end(cluster, router_only, upstream_url,
                                                                          upstream, key, cid):
    """A call whose system prompt and tools are shared (at least ``[database] share_items_above``
    bytes: stored once per tenant, storage/shared.py) on a database refusing any statement of more
    than one task: storing the items (and marking them seen again, from a second process), reading
    them back for a path, deleting them -- each a statement on the tenant's one shard. The sweep's
    scans (the candidates, the nodes still referring to them) read every shard: refused here, run
    by the background sweep (docs/scaling.md)."""
    from storage import queries

    from .fakes import Reply
    from .helpers import say, system, tool_call, user

    prompt = system("You are a careful agent. " + " ".join(f"Rule {i}: keep it green." for i in range(150)))
    tools = [{"type": "function", "function": {"name": f"tool_{i}", "description": "does a thing " * 30,
                                               "parameters": {"type": "object"}}} for i in range(8)]
    assert len(json.dumps(prompt)) >= 2048 and len(json.dumps(tools)) >= 2048
    url = router_only
    settings = make_settings(url, upstream_url, server={"reaper_interval_seconds": 3600})  # no sweep (a fan-out)
    with serve_proxy(settings) as p:
        tenant = p.runtime.auth(f"Bearer {key}").tenant
        upstream.enqueue(Reply(content=None, tool_calls=[tool_call("call_1", "tool_0", "{}")]))
        _, first = say(p.openai(key), cid, prompt, user("fix the bug"), tools=tools)
        say(p.openai(key), cid, {"role": "tool", "tool_call_id": "call_1", "content": "done"}, tools=tools)
        say(p.openai(key), f"{cid}-2", prompt, user("another session"), tools=tools)
    stored = fetch(url, "SELECT hash FROM shared_items WHERE tenant = $1", tenant)
    assert len(stored) == 2  # the prompt and the tools, once each
    node = fetch(url, "SELECT sent, params FROM nodes WHERE tree_id = $1 AND id = $2",
                 _tree_of(url, tenant, cid), uuid.UUID(first["x-node-id"]))[0]
    assert "_bp_shared" in json.loads(node["sent"])[0] and "_bp_shared" in json.loads(node["params"])["tools"]

    # a second process (nothing cached): it stores the items again (seen, the rows there) and reads
    # them back for the conversation's path; the upstream gets them whole
    upstream.reset()
    with serve_proxy(settings) as p:
        say(p.openai(key), cid, user("and the docs"), tools=tools)
        shown = p.http(key).get(f"/admin/conversations/{cid}/path").json()["data"]
    assert upstream.chat_requests[-1].body["messages"][0] == prompt
    assert upstream.chat_requests[-1].body["tools"] == tools
    assert shown[0]["sent"][0] == prompt and all(n["params"]["tools"] == tools for n in shown)

    hashes = [r["hash"] for r in stored]
    assert fetch(url, queries.SHARED_LOAD, tenant, hashes)  # (as the second process read them)
    fetch(url, queries.SHARED_DELETE, tenant, hashes, 600.0)  # the sweep's delete: one tenant, one shard
    assert len(fetch(url, "SELECT hash FROM shared_items WHERE tenant = $1", tenant)) == 2  # (seen: kept)
    for sql, args in ((queries.SHARED_CANDIDATES, (600.0, "", "", 100)), (queries.SHARED_REFERRED, (tenant, hashes))):
        with pytest.raises(asyncpg.PostgresError, match="multi-task query about to be executed"):
            fetch(url, sql, *args)


def _plan(url: str, sql: str, *args: Any) -> dict:
    return json.loads(fetch(url, f"EXPLAIN (FORMAT JSON) {sql}", *args)[0][0])[0]["Plan"]


def _jobs(plan: dict) -> list[dict]:
    """Citus's distributed plans inside ``plan`` (its custom scans' jobs)."""
    found = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if "Job" in node:
                found.append(node["Job"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(plan)
    return found


def test_explain_shows_one_task_for_the_delegated_calls_and_the_path_read(distributed_url, upstream_url, key, cid):
    url = distributed_url
    with serve_proxy(make_settings(url, upstream_url)) as p:
        client = p.openai(key)
        for text in ("one", "two", "three"):
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": text}],
                                           extra_headers={"X-Conversation-Id": cid})
        tenant = p.runtime.auth(f"Bearer {key}").tenant
    tree = _tree_of(url, tenant, cid)
    head = fetch(url, "SELECT head_node_id FROM conversations WHERE tree_id = $1 AND tenant = $2 AND id = $3",
                 tree, tenant, cid)[0][0]

    # the delegated calls: one task, the whole function call sent to the worker holding the tree
    for sql, args in ((f"SELECT * FROM bp_path_nodes(p_tree => '{tree}', p_node => '{head}')", ()),
                      (f"SELECT * FROM bp_path('{tree}', '{head}')", ()),
                      (queries.BEGIN_CALL_AT, (tree, "{}", "{}")),
                      (f"SELECT bp_renew(p_tree => '{tree}', p_node => '{head}', p_lease_seconds => 1)", ()),
                      (f"SELECT '{head}'::uuid AS call, finished FROM bp_finish_call(p_tree => '{tree}', "
                       f"p_node => '{head}', p_finish => '{{}}') finished", ())):
        jobs = _jobs(_plan(url, sql, *args))
        assert len(jobs) == 1 and jobs[0]["Task Count"] == 1, (sql, jobs)
        remote = json.dumps(jobs[0])
        assert "bp_" in remote, (sql, jobs)  # the function call itself is the task

    # the recursive path read, as bp_path_walk runs it: one task (router), its CTE on one shard
    walk = f"""
        WITH RECURSIVE up (node, lvl) AS (
            SELECT first, 0 FROM nodes first WHERE first.tree_id = '{tree}' AND first.id = '{head}'
            UNION ALL
            SELECT step.parent, up.lvl + 1 FROM up
             CROSS JOIN LATERAL (SELECT parent FROM nodes parent
                                  WHERE parent.tree_id = '{tree}' AND parent.id = (up.node).parent_id LIMIT 1) step)
        SELECT (up.node).id FROM up ORDER BY up.lvl DESC"""
    jobs = _jobs(_plan(url, walk))
    assert len(jobs) == 1 and jobs[0]["Task Count"] == 1, jobs
    assert [r[0] for r in fetch(url, walk)] == [r["id"] for r in fetch(
        url, "SELECT id FROM bp_path_nodes(p_tree => $1, p_node => $2)", tree, head)]

    # /auto/v1 discovery's probe (no conversation named): a task on every shard of the tenant's nodes
    chain = fetch(url, "SELECT chain FROM nodes WHERE tree_id = $1 AND id = $2", tree, head)[0][0]
    probe = (f"SELECT n.id FROM nodes n WHERE n.tenant = '{tenant}' AND n.chain = '\\x{chain.hex()}'::bytea "
             "AND n.kind <> 'transform'")
    shards = fetch(url, "SELECT count(*) FROM pg_dist_shard WHERE logicalrelid = 'nodes'::regclass")[0][0]
    jobs = _jobs(_plan(url, probe))
    assert len(jobs) == 1 and jobs[0]["Task Count"] == shards > 1, jobs


@pytest.mark.skipif(not os.environ.get("BRANCHPOINT_TEST_DATABASE_URL"), reason=NO_CLUSTER)
def test_a_plain_server_is_not_taken_for_a_cluster(pg_server_url):
    """tests/citus_cluster.py finds a cluster only where there is one: a database without Citus on
    the same server is plain."""
    from .citus_cluster import cluster as find

    assert find(_plain_database(pg_server_url)) is None


def test_distribute_refuses_a_schema_that_is_not_current(cluster, pg_server_url):
    url = new_database(pg_server_url)  # Citus, no migrations

    async def attempt():
        conn = await asyncpg.connect(url)
        try:
            await distribute(conn)
        finally:
            await conn.close()

    with pytest.raises(NotDistributable, match="branchpoint migrate"):
        run(attempt())
    assert fetch(url, "SELECT count(*) FROM pg_dist_partition")[0][0] == 0


def _start_node(tmp_path, pg_server_url: str) -> tuple[str, int, Any]:
    """One more PostgreSQL + Citus server on 127.0.0.1, as ../shared/citus/cluster.sh starts its nodes
    (the coordinator's own binaries); returns (its data directory, its port, a stop function)."""
    import shutil
    import subprocess

    from .fakes import free_port

    major = fetch(pg_server_url, "SELECT current_setting('server_version_num')::int / 10000")[0][0]
    pgbin = os.environ.get("PGBIN", f"/usr/lib/postgresql/{major}/bin")
    if not os.path.exists(f"{pgbin}/initdb"):
        pytest.skip(f"no PostgreSQL {major} binaries at {pgbin} to start another node with (PGBIN)")
    root = tmp_path / "node"
    root.mkdir()
    data, port = root / "data", free_port()

    def as_postgres(cmd: str) -> None:
        argv = ["su", "postgres", "-s", "/bin/bash", "-c", cmd] if os.getuid() == 0 else ["bash", "-c", cmd]
        subprocess.run(argv, check=True, capture_output=True, timeout=120)

    if os.getuid() == 0:
        shutil.chown(root, "postgres")
        for parent in root.parents:  # the server's user must reach its folder
            if str(parent) in ("/", "/tmp"):
                break
            os.chmod(parent, os.stat(parent).st_mode | 0o011)
    as_postgres(f"{pgbin}/initdb -D '{data}' -A trust -U postgres >/dev/null")
    with (data / "postgresql.conf").open("a") as conf:
        conf.write("shared_preload_libraries = 'citus'\nmax_connections = 200\n")
    as_postgres(f"{pgbin}/pg_ctl -D '{data}' -w -o '-p {port} -k {root} -c listen_addresses=127.0.0.1' "
                f"-l '{root}/log' start >/dev/null")
    return str(data), port, lambda: as_postgres(f"{pgbin}/pg_ctl -D '{data}' -m fast stop >/dev/null")


def test_a_worker_added_and_the_shards_rebalanced_keeps_every_conversation(cluster, pg_server_url, upstream_url,
                                                                              key, tmp_path):
    """docs/scaling.md's procedure: a new worker (Citus in the database there), citus_add_node, the
    shards rebalanced (block_writes: copied while writes to the moving shards wait); every tree
    stays whole on one node, and every conversation goes on with its whole context. (A database
    made as a deployment makes it -- migrate, distribute --, not a clone of the template: Citus's
    metadata in a clone still names the template's database, which a new node does not have.)"""
    from storage import migrate

    url = new_database(pg_server_url)
    run(migrate(url))

    async def spread():
        conn = await asyncpg.connect(url)
        try:
            await distribute(conn)
        finally:
            await conn.close()

    run(spread())
    name = url.rsplit("/", 1)[1]
    with serve_proxy(make_settings(url, upstream_url)) as p:
        client = p.openai(key)
        conversations = [f"grow-{i}-{uuid.uuid4().hex[:6]}" for i in range(12)]
        for cid in conversations:
            for turn in ("one", "two"):
                client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": f"{turn} {cid}"}],
                                               extra_headers={"X-Conversation-Id": cid})
        _, port, stop = _start_node(tmp_path, url)
        try:
            node = cluster.node_url("127.0.0.1", port, "postgres")
            fetch(node, f'CREATE DATABASE "{name}"')
            fetch(cluster.node_url("127.0.0.1", port, name), "CREATE EXTENSION citus")
            fetch(url, "SELECT citus_add_node('127.0.0.1', $1)", port)
            fetch(url, "SELECT rebalance_table_shards(shard_transfer_mode => 'block_writes')")
            placed = fetch(url, """
                SELECT s.shardminvalue, count(DISTINCT p.nodename || ':' || p.nodeport) AS nodes, min(p.nodeport) AS port
                  FROM pg_dist_shard s JOIN pg_dist_placement pl ON pl.shardid = s.shardid
                  JOIN pg_dist_node p ON p.groupid = pl.groupid
                 WHERE s.logicalrelid IN ('nodes'::regclass, 'conversations'::regclass, 'conversation_aliases'::regclass)
                 GROUP BY s.shardminvalue""")
            assert all(r["nodes"] == 1 for r in placed)  # a tree's three shards on one node
            assert port in {r["port"] for r in placed}  # the new worker holds some of them
            moved = {r["shardminvalue"] for r in placed if r["port"] == port}
            assert moved and len(moved) < len(placed)
            for cid in conversations:
                r = client.chat.completions.with_raw_response.create(
                    model=MODEL, messages=[{"role": "user", "content": f"three {cid}"}], extra_headers={"X-Conversation-Id": cid})
                assert r.status_code == 200
                path = p.http(key).get(f"/admin/conversations/{cid}/path").json()["data"]
                assert [n["sent"][0]["content"] for n in path] == [f"one {cid}", f"two {cid}", f"three {cid}"]
            trees = {_tree_of(url, p.runtime.auth(f"Bearer {key}").tenant, cid) for cid in conversations}
            ports = {fetch(url, "SELECT nodeport FROM citus_shards WHERE shardid = "
                                "get_shard_id_for_distribution_column('nodes', $1::uuid)", tree)[0][0] for tree in trees}
            assert port in ports, "no conversation of the test lives on the new worker: nothing was shown"
        finally:
            stop()
