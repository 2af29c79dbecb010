"""The path cache end to end (docs/architecture.md#the-path-cache): a call reads from the database
only the nodes below those its process keeps, and what the upstream receives is still exactly the
path -- with two processes writing the same conversation, edits, head moves, failures, tool
rounds and a conversation deleted and made again under the same id."""

import uuid

import openai
import pytest

from storage import queries
from storage.database import Database
from storage.ids import uuid7
from storage.model import Outcome
from storage.transcript import digests
from storage.tree import CallFinish, CallStart, TreeStore, _jsonb

from .conftest import make_settings, run, serve_proxy
from .fakes import Reply
from .helpers import MODEL, say, tool, tool_call, user


def _messages(upstream):
    return [(m["role"], m.get("content")) for m in upstream.last.body["messages"]]


def _verified(http, node_id, upstream):
    r = http.get(f"/admin/nodes/{node_id}/request")
    assert r.headers["x-request-verified"] == "true"
    assert r.json() == upstream.last.body


def test_each_node_is_read_once_and_every_call_gets_the_whole_path(database_url, upstream_url, upstream, key, cid):
    with serve_proxy(make_settings(database_url, upstream_url)) as a, \
            serve_proxy(make_settings(database_url, upstream_url)) as b:
        cache = a.runtime.tree.cache
        ca, cb, http = a.openai(key), b.openai(key), a.http(key)
        ids = []
        for i in range(10):
            _, h = say(ca, cid, user(f"q{i}"))
            ids.append(h["x-node-id"])
        _verified(http, ids[-1], upstream)
        # ten calls: every node came from the database once, the rest of each path from memory
        assert cache.reads <= 10 and cache.hits >= 30, (cache.reads, cache.hits)
        assert len(upstream.last.body["messages"]) == 19

        # the other process moves the conversation on: A reads only what it does not have
        reads = cache.reads
        say(cb, cid, user("from b"))
        upstream.enqueue(Reply(content=None, tool_calls=[tool_call("c1")]))
        say(cb, cid, user("use the tool"))
        _, h = say(ca, cid, tool("c1", "42"))
        assert cache.reads - reads == 3  # its own last node and the two B made
        assert _messages(upstream)[-5:] == [("user", "from b"), ("assistant", "echo: from b"), ("user", "use the tool"),
                                            ("assistant", None), ("tool", "42")]
        _verified(http, h["x-node-id"], upstream)

        # an edit in the middle (a kept parent), then a turn on the new branch
        _, h = say(ca, cid, user("edited q3"), parent=ids[2])
        assert _messages(upstream)[-2:] == [("assistant", "echo: q2"), ("user", "edited q3")]
        assert len(upstream.last.body["messages"]) == 7
        _, h = say(cb, cid, user("next"))
        _, h = say(ca, cid, user("and next"))
        assert [c for _, c in _messages(upstream)][-5:] == ["edited q3", "echo: edited q3", "next", "echo: next", "and next"]
        _verified(http, h["x-node-id"], upstream)

        # a failed call stays out of the context as an answer; its retry hangs beside it
        upstream.enqueue(Reply(kind="error", status=500, error={"message": "boom", "type": "server_error"}))
        with pytest.raises(openai.APIStatusError):
            say(ca, cid, user("fails"))
        _, h = say(cb, cid, user("fails"))  # the retry, from the other process
        assert [c for _, c in _messages(upstream)][-3:] == ["and next", "echo: and next", "fails"]
        _, h = say(ca, cid, user("after the retry"))
        assert [c for _, c in _messages(upstream)][-4:] == ["echo: and next", "fails", "echo: fails", "after the retry"]
        _verified(http, h["x-node-id"], upstream)
        # the head moves back (admin) in the other process: A's next call follows it
        assert b.http(key).put(f"/admin/conversations/{cid}/head", json={"node_id": ids[5]}).status_code == 200
        _, h = say(ca, cid, user("after the move"))
        assert [c for _, c in _messages(upstream)][-3:] == ["q5", "echo: q5", "after the move"]
        _verified(http, h["x-node-id"], upstream)


def test_a_conversation_made_again_under_the_same_id_starts_empty(proxy, upstream, key, cid):
    client, http = proxy.openai(key), proxy.http(key)
    for i in range(3):
        say(client, cid, user(f"old {i}"))
    deleted = http.delete(f"/admin/conversations/{cid}")
    assert deleted.status_code == 200, deleted.text
    assert deleted.json() == {"id": cid, "object": "conversation.deleted", "deleted": True, "nodes_deleted": 3, "nodes_kept": 0}
    say(client, cid, user("new start"))
    assert _messages(upstream) == [("user", "new start")]
    say(client, cid, user("again"))
    assert _messages(upstream) == [("user", "new start"), ("assistant", "echo: new start"), ("user", "again")]


def test_with_the_cache_off_every_call_reads_its_whole_path(database_url, upstream_url, upstream, key, cid):
    with serve_proxy(make_settings(database_url, upstream_url, server={"path_cache_mb": 0})) as p:
        client = p.openai(key)
        for i in range(4):
            say(client, cid, user(f"q{i}"))
        assert len(upstream.last.body["messages"]) == 7
        assert p.runtime.tree.cache.hits == 0 and p.runtime.tree.cache.nbytes == 0


def test_the_usual_next_turn_reads_its_parent_by_key_without_the_walk(database_url, cid):
    """When the caller keeps everything above the parent, bp_begin_call returns the parent's row
    read by its key; the recursive walk (bp_path_walk) runs only when more is missing. Counted
    with the backend's function statistics."""
    async def scenario():
        db = await Database().open(database_url, min_size=1, max_size=1)
        try:
            store = TreeStore(db)  # no cache: the test says what is known
            first = await _turn(store, cid, "q0", [])
            second = await _turn(store, cid, "q1", [])
            async with db.connection() as conn:
                for known, rows, walks in (([first], [second], 0),      # only the parent is missing
                                           ([], [first, second], 1),   # the whole path is missing
                                           ([second], [None], 0)):     # the parent itself is kept
                    tx = conn.transaction()
                    await tx.start()
                    try:
                        await conn.execute("SET LOCAL track_functions = 'all'")
                        before = await conn.fetchval(WALKS)  # (counts not yet reported may be there)
                        got = await conn.fetch(queries.BEGIN_CALL, *_begin_args(cid, "q2", known))
                        assert [r["node_id"] for r in got] == rows
                        assert got[-1]["parent_id"] == second
                        assert await conn.fetchval(WALKS) - before == walks, known
                    finally:
                        await tx.rollback()
        finally:
            await db.close()

    run(scenario())


WALKS = "SELECT coalesce(pg_stat_get_xact_function_calls('bp_path_walk(uuid,uuid,uuid[])'::regprocedure), 0)"


def _begin_args(cid, text, known):
    sent = [user(text)]
    return (_jsonb(CallStart(tenant="t_walk", conversation_id=cid, node_id=uuid7(), new_tree_id=uuid.uuid4(),
                             kind="turn", mode="delta", parent_mode="head", parent_id=None, sent=sent,
                             digests=digests(sent), prefixes=[], system_hash=None, lease_seconds=60.0, model=MODEL,
                             provider="default", params={})), queries.uuid_array(known))


async def _turn(store, cid, text, known):
    sent = [user(text)]
    node = uuid7()
    begun = await store.begin_call(CallStart(
        tenant="t_walk", conversation_id=cid, node_id=node, new_tree_id=uuid.uuid4(), kind="turn", mode="delta",
        parent_mode="head", parent_id=None, sent=sent, digests=digests(sent), prefixes=[], system_hash=None,
        lease_seconds=60, model=MODEL, provider="default", params={}))
    assert await store.finish_call(begun.tree_id, node, CallFinish(
        outcome=Outcome.SUCCESS, received=[{"role": "assistant", "content": "a"}], usage=None,
        finish_reason="stop", error=None, request_hash=None, leased=True))
    return node
