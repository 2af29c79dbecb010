"""A call's start commits without waiting for the disk; a start the database loses (a crash before
its WAL was flushed) is written again by the call's finish, where the start had put it
(docs/architecture.md#durability). A loss is what a crash leaves: the pending node gone, and the
lease it held -- and, for a conversation's first call, the conversation row too."""

import json
import threading
import uuid

import asyncpg
import httpx
import msgspec
import pytest

from storage.ids import uuid7
from storage.transcript import digests
from storage.tree import Begun, CallFinish, CallStart, _jsonb

from .conftest import Db, assert_invariants, run, serve_proxy, tenant_of, wait_for
from .fakes import Reply
from .helpers import MODEL, user

# what a start writes to its node; a node written again must hold the same
_WRITTEN = ("tenant", "conversation_id", "parent_id", "kind", "sent", "model", "provider", "params", "depth",
            "system_hash", "api", "tree_id")


def _post(http, key, cid, messages, *, stream=False, full=False, timeout=30, extra=None):
    headers = {"Authorization": f"Bearer {key}", "X-Conversation-Id": cid, **(extra or {})}
    if full:
        headers["X-Context-Mode"] = "full"
    body = {"model": MODEL, "messages": messages, "stream": stream}
    r = http.post("/v1/chat/completions", headers=headers, json=body, timeout=timeout)
    if stream:
        r.read()
    return r


def _content(r, stream):
    if not stream:
        return r.json()["choices"][0]["message"]["content"]
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    return "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e.get("choices"))


def _in_flight(db, key, cid, upstream, count, reply, messages, *, stream=False, full=False, http=None, extra=None):
    """Send a call whose upstream answer waits; returns (the thread, its result, the release,
    the pending node's row once the start has written it)."""
    hold = threading.Event()
    upstream.enqueue(Reply(kind="stream" if stream else "json", content=reply, hold=hold))
    result: dict = {}
    t = threading.Thread(target=lambda: result.update(r=_post(http, key, cid, messages, stream=stream, full=full,
                                                              extra=extra)))
    t.start()
    upstream.wait_for(count)
    row = db.fetchrow("SELECT * FROM nodes WHERE tenant = $1 AND conversation_id = $2 AND outcome IS NULL",
                      tenant_of(key), cid)
    assert row is not None
    return t, result, hold, row


def _second_lost(http, db, key, cid, upstream, stream):
    """A first question answered; a second one upstream, its answer held, and its start lost:
    (the first's response, and ``_in_flight``'s four)."""
    first = _post(http, key, cid, [user("first question")])
    assert first.status_code == 200
    t, result, hold, pending = _in_flight(db, key, cid, upstream, 2, "second answer", [user("second question")],
                                          stream=stream, http=http)
    _lose(db, key, cid, pending["id"])
    return first, t, result, hold, pending


def _lost_and_answered(db, key, cid, in_flight, answer):
    """An ``_in_flight`` call's start lost, then its upstream's ``answer`` given: written again."""
    t, result, hold, pending = in_flight
    _lose(db, key, cid, pending["id"])
    hold.set()
    t.join(30)
    assert result["r"].status_code == 200
    _assert_written_again(db, pending, answer)


def _lose(db, key, cid, node, *, conversation=False):
    """What a crash that lost the start leaves."""
    db.fetch("DELETE FROM nodes WHERE id = $1", node)
    if conversation:
        db.fetch("DELETE FROM conversations WHERE tenant = $1 AND id = $2", tenant_of(key), cid)
    else:
        db.fetch("UPDATE conversations SET lease_node_id = NULL, lease_until = NULL WHERE tenant = $1 AND id = $2",
                 tenant_of(key), cid)


def _assert_written_again(db, pending, answer):
    node = db.node(pending["id"])
    assert {k: node[k] for k in _WRITTEN} == {k: pending[k] for k in _WRITTEN}
    assert node["status"] == "success" and node["received"][0]["content"] == answer
    assert node["lease_until"] is None and node["finished_at"] is not None and node["answered"]
    # the transcript hash: the start's, extended by the answer (as for a start never lost)
    assert node["chain"] == db.fetchval("SELECT bp_fold($1, $2::bytea[])", pending["chain"], digests(node["received"]))
    return node


def test_a_start_commits_without_waiting_for_the_disk_and_a_finish_waits(database_url):
    async def go():
        conn = await asyncpg.connect(database_url)
        try:
            sent = [user("hello")]
            node = uuid7()
            start = CallStart(tenant="t_async", conversation_id=f"a-{uuid.uuid4().hex[:8]}", node_id=node,
                              new_tree_id=uuid7(), kind="turn", mode="delta", parent_mode="head", parent_id=None,
                              sent=sent, digests=digests(sent), prefixes=[], system_hash=None, lease_seconds=60,
                              model=MODEL, provider="default", params={})
            async with conn.transaction():
                row = await conn.fetchrow("SELECT * FROM bp_begin_call($1::text::jsonb)", bytes(_jsonb(start)).decode())
                assert await conn.fetchval("SHOW synchronous_commit") == "off"
            async with conn.transaction():
                finish = CallFinish(outcome="success", received=[{"role": "assistant", "content": "hi"}],
                                    received_digests=digests([{"role": "assistant", "content": "hi"}]), leased=True)
                assert await conn.fetchval("SELECT bp_finish_call($1, $2, $3::text::jsonb)", row["tree_id"], node,
                                           bytes(_jsonb(finish)).decode()) is True
                assert await conn.fetchval("SHOW synchronous_commit") == "on"
            # a start of a process from before its finish could write it again (a rolling upgrade:
            # the old version calls the new functions; its start says nothing of it) waits for the disk
            older = json.loads(bytes(_jsonb(msgspec.structs.replace(
                start, node_id=uuid7(), conversation_id=start.conversation_id + "-old"))))
            del older["restorable"]
            async with conn.transaction():
                await conn.fetch("SELECT * FROM bp_begin_call($1::text::jsonb)", json.dumps(older))
                assert await conn.fetchval("SHOW synchronous_commit") == "on"
        finally:
            await conn.close()

    run(go())


@pytest.mark.parametrize("stream", [False, True])
def test_a_lost_start_is_written_again_where_it_was_put(proxy, db, upstream, key, cid, stream):
    with httpx.Client(base_url=proxy.url) as http:
        first, t, result, hold, pending = _second_lost(http, db, key, cid, upstream, stream)
        hold.set()
        t.join(30)
        r = result["r"]
        assert r.status_code == 200 and r.headers["x-node-id"] == str(pending["id"])
        assert _content(r, stream) == "second answer"
        _assert_written_again(db, pending, "second answer")
        assert str(pending["parent_id"]) == first.headers["x-node-id"]
        assert db.head(cid) == str(pending["id"])
        assert db.fetchval("SELECT lease_node_id FROM conversations WHERE tenant = $1 AND id = $2",
                           tenant_of(key), cid) is None

        # ... and it is the next call's context
        third = _post(http, key, cid, [user("third question")])
        assert third.status_code == 200 and third.headers["x-parent-node-id"] == str(pending["id"])
        assert [m["content"] for m in upstream.last.messages] == [
            "first question", "echo: first question", "second question", "second answer", "third question"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_lost_start_written_again_leaves_the_head_to_a_turn_let_in_since(proxy, db, upstream, key, cid, stream):
    """The lease was lost with the start, so another turn of the conversation is let in while the
    call is upstream, answered, and the head moves onto it. The node written again at the call's
    finish moves the head only if no node begun after the call holds it: here one does -- it
    stays a branch, visible in the tree -- and the next turn's context keeps the turn let in. It moved the head wherever it was, and the acknowledged turn left the context
    silently."""
    with httpx.Client(base_url=proxy.url) as http:
        first, t, result, hold, pending = _second_lost(http, db, key, cid, upstream, stream)
        between = _post(http, key, cid, [user("question let in")])  # (nothing holds the conversation)
        assert between.status_code == 200, between.text
        hold.set()
        t.join(30)
        r = result["r"]
        assert r.status_code == 200 and _content(r, stream) == "second answer"
        _assert_written_again(db, pending, "second answer")
        assert db.head(cid) == between.headers["x-node-id"]  # the late node is a branch beside it

        third = _post(http, key, cid, [user("third question")])
        assert third.status_code == 200 and third.headers["x-parent-node-id"] == between.headers["x-node-id"]
        assert [m["content"] for m in upstream.last.messages] == [
            "first question", "echo: first question", "question let in", "echo: question let in", "third question"]


def test_a_lost_retry_written_again_takes_the_head_from_the_attempt_it_retried(proxy, db, upstream, key, cid):
    """A retry of a failed call hangs beside the failed attempt (the retry rule), with the head
    still on that attempt: the head rests where the call began, so the retry written again after
    a lost start takes it, as a retry whose start was not lost does (the attempt began before it)."""
    with httpx.Client(base_url=proxy.url) as http:
        first = _post(http, key, cid, [user("first question")])
        assert first.status_code == 200
        upstream.enqueue(Reply(kind="error", status=500))
        failed = _post(http, key, cid, [user("second question")])
        assert failed.status_code == 500 and db.head(cid) == failed.headers["x-node-id"]
        t, result, hold, pending = _in_flight(db, key, cid, upstream, 3, "second answer", [user("second question")],
                                              http=http)
        assert str(pending["parent_id"]) == first.headers["x-node-id"]  # (beside the failed attempt)
        _lost_and_answered(db, key, cid, (t, result, hold, pending), "second answer")
        assert db.head(cid) == str(pending["id"])
        third = _post(http, key, cid, [user("third question")])
        assert third.headers["x-parent-node-id"] == str(pending["id"])
        assert [m["content"] for m in upstream.last.messages] == [
            "first question", "echo: first question", "second question", "second answer", "third question"]


@pytest.mark.parametrize("how", ["parent", "root", "full_edit"])
def test_a_lost_start_hung_elsewhere_than_the_head_takes_the_head_when_nothing_moved(proxy, db, upstream, key, cid,
                                                                                      how):
    """A turn hung elsewhere than under the head -- under a node it names (an edit, "reply from
    here"), at a new root, or a full-history edit of an earlier question -- takes the head, as
    any turn does. Written again after a lost start with nothing let in meanwhile, it takes it
    too: the head it found rests there still. (Compared with the node's parent, the head stayed
    on the old branch, and the client's next message continued that one.)"""
    with httpx.Client(base_url=proxy.url) as http:
        a = _post(http, key, cid, [user("q1")])
        b = _post(http, key, cid, [user("q2")])
        assert db.head(cid) == b.headers["x-node-id"]
        extra, full = {}, how == "full_edit"
        if how == "parent":
            extra, messages = {"X-Parent-Node-Id": a.headers["x-node-id"]}, [user("q2 edited")]
        elif how == "root":
            extra, messages = {"X-Parent-Node-Id": "root"}, [user("q1 edited")]
        else:
            messages = [user("q1"), {"role": "assistant", "content": "echo: q1"}, user("q2 edited")]
        t, result, hold, pending = _in_flight(db, key, cid, upstream, 3, "branch answer", messages, full=full,
                                              http=http, extra=extra)
        _lost_and_answered(db, key, cid, (t, result, hold, pending), "branch answer")
        assert db.head(cid) == str(pending["id"])


def test_a_conversations_lost_first_call_makes_the_conversation_again(proxy, db, upstream, key, cid):
    with httpx.Client(base_url=proxy.url) as http:
        t, result, hold, pending = _in_flight(db, key, cid, upstream, 1, "the first answer", [user("hello")], http=http)
        tree = pending["tree_id"]
        _lose(db, key, cid, pending["id"], conversation=True)
        hold.set()
        t.join(30)
        assert result["r"].status_code == 200
        _assert_written_again(db, pending, "the first answer")
        conv = db.fetchrow("SELECT * FROM conversations WHERE tenant = $1 AND id = $2", tenant_of(key), cid)
        assert conv["tree_id"] == tree and conv["head_node_id"] == pending["id"]
        again = _post(http, key, cid, [user("and now?")])
        assert again.headers["x-parent-node-id"] == str(pending["id"])
        assert "the first answer" in upstream.last.text()


def test_a_lost_full_history_start_stores_only_what_was_new(proxy, db, upstream, key, cid):
    history = [{"role": "system", "content": "be brief"}, user("one")]
    with httpx.Client(base_url=proxy.url) as http:
        r = _post(http, key, cid, history, full=True)
        assert r.status_code == 200
        history += [{"role": "assistant", "content": "echo: one"}, user("two")]
        t, result, hold, pending = _in_flight(db, key, cid, upstream, 2, "two it is", history, full=True, http=http)
        assert pending["sent"] == [user("two")]  # (matched: only the new question is the node's)
        _lose(db, key, cid, pending["id"])
        hold.set()
        t.join(30)
        assert result["r"].status_code == 200 and result["r"].headers["x-context-mode"] == "full"
        _assert_written_again(db, pending, "two it is")
        # its transcript hash is right: the next resent history matches it whole
        history += [{"role": "assistant", "content": "two it is"}, user("three")]
        r = _post(http, key, cid, history, full=True)
        assert r.headers["x-parent-node-id"] == str(pending["id"])
        assert r.headers["x-context-matched"] == "4"


def test_a_lost_start_whose_conversation_was_deleted_since_stays_gone(proxy, db, upstream, key, cid):
    with httpx.Client(base_url=proxy.url) as http:
        assert _post(http, key, cid, [user("first question")]).status_code == 200
        t, result, hold, pending = _in_flight(db, key, cid, upstream, 2, "late answer", [user("second")], http=http)
        _lose(db, key, cid, pending["id"])
        # nothing holds the conversation any more: a delete goes through
        gone = http.delete(f"/admin/conversations/{cid}", headers={"Authorization": f"Bearer {key}"})
        assert gone.status_code in (200, 204), gone.text
        hold.set()
        t.join(30)
        # its answer is stored nowhere: the client is told the call was interrupted, never that it
        # succeeded (it was answered 200 with an answer no conversation holds)
        assert result["r"].status_code == 503 and result["r"].json()["error"]["code"] == "interrupted"
        # deleted means gone: neither the node nor its conversation comes back
        assert db.fetchval("SELECT count(*) FROM nodes WHERE tenant = $1 AND conversation_id = $2",
                           tenant_of(key), cid) == 0
        assert db.fetchval("SELECT count(*) FROM conversations WHERE tenant = $1 AND id = $2", tenant_of(key), cid) == 0


def test_a_start_lost_in_an_outage_is_written_again_when_the_database_is_back(own_server, upstream_url, upstream,
                                                                               key, cid):
    """The case the asynchronous start had to answer: the database goes away while the call is
    upstream, so its client is answered and the outcome stored once the database is back -- and
    the crash had lost the start."""
    db = Db(own_server.url)
    with serve_proxy(own_server.settings(upstream_url)) as p, httpx.Client(base_url=p.url) as http:
        assert _post(http, key, cid, [user("before")]).status_code == 200
        t, result, hold, pending = _in_flight(db, key, cid, upstream, 2, "answered in the outage",
                                              [user("in flight")], http=http)
        _lose(db, key, cid, pending["id"])
        own_server.stop()  # the outage begins
        hold.set()
        t.join(30)
        assert result["r"].status_code == 200  # the client gets the answer it waited for
        own_server.start()  # ... and ends
        node = wait_for(lambda: db.fetchrow("SELECT * FROM nodes WHERE id = $1 AND outcome IS NOT NULL",
                                            pending["id"]), timeout=30, what="the outcome stored")
        assert node["status"] == "success"
        _assert_written_again(db, pending, "answered in the outage")
        after = _post(http, key, cid, [user("after")])
        assert after.status_code == 200 and after.headers["x-parent-node-id"] == str(pending["id"])
        assert "answered in the outage" in upstream.last.text()
    assert_invariants(own_server.url)


def test_restore_is_read_as_the_start_wrote_it():
    """The start a finish carries is the start's own contract, with what it decided beside it."""
    sent = [user("x")]
    start = CallStart(tenant="t", conversation_id="c", node_id=uuid7(), new_tree_id=uuid7(), kind="turn", mode="delta",
                      parent_mode="head", parent_id=None, sent=sent, digests=digests(sent), prefixes=[],
                      system_hash=None, lease_seconds=60, model=MODEL, provider="default", params={})
    parent = uuid7()
    begun = Begun("c", uuid7(), parent, "full", matched=3, start=3, with_system=True, ran=start)
    decoded = json.loads(bytes(begun.restore()))
    assert decoded["call"] == json.loads(bytes(_jsonb(start)))
    assert {k: v for k, v in decoded.items() if k != "call"} == {
        "conversation_id": "c", "parent_id": str(parent), "mode": "full", "start": 3, "with_system": True}


def test_an_outcome_stored_later_whose_node_was_gone_is_not_taken_for_stored(caplog):
    """The database away at the finish: the client had its answer, and the outcome is stored once
    the database is back. When by then the node was reaped (its lease ran out) or deleted, nothing
    was stored -- it was taken for stored all the same (counted, followed by a compaction check
    of a node that is not there) and nothing said so."""
    from types import SimpleNamespace

    from proxy.outcomes import Outcomes
    from storage import Outcome

    done: list[object] = []

    class Later:
        async def store(self, node_id, attempt):
            await attempt()
            return True

    outcomes = Outcomes.__new__(Outcomes)  # (only what store_later uses)
    outcomes.later = Later()
    outcomes.leases = SimpleNamespace(untrack=lambda node: done.append(("untracked", node)))
    outcomes.stored = lambda *args: done.append("stored")
    started = SimpleNamespace(node_id=uuid7())
    for result, stored in ((None, False), (False, False), (True, True)):
        done.clear()

        async def store(result=result):
            return result

        run(outcomes.store_later(started, store, Outcome.SUCCESS, None, None))
        assert ("stored" in done) is stored, (result, done)
        assert stored or ("untracked", started.node_id) in done
    assert "could not be stored once the database was back" in caplog.text
