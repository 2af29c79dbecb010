"""The in-flight lease lives in PostgreSQL: it holds across proxy processes, lives as long as the
call does, and a crashed process's call is reaped as ``interrupted``."""

import os
import signal
import threading
import time
import uuid

import openai
import pytest

from proxy.leases import LeaseKeeper
from proxy.metrics import Metrics
from storage.database import Database
from storage.ids import uuid7
from storage.transcript import digests
from storage.tree import CallStart, TreeStore

from .conftest import Db, make_settings, new_key, run, serve_proxy, spawn_proxy, wait_for
from .fakes import Reply
from .helpers import MODEL, say, user


def ask(client, cid, text, **kw):
    return say(client, cid, user(text), **kw)


def test_lease_holds_across_two_proxy_instances(fresh_database_url, upstream_url, upstream, key, cid):
    settings = make_settings(fresh_database_url, upstream_url)
    with serve_proxy(settings) as a, serve_proxy(settings) as b:
        ask(a.openai(key), cid, "setup")
        answer = threading.Event()
        upstream.enqueue(Reply(content="slow", hold=answer))  # (in flight until B has been refused)
        t = threading.Thread(target=lambda: ask(a.openai(key), cid, "long call on A"))
        t.start()
        try:
            upstream.wait_for(2)
            with pytest.raises(openai.ConflictError) as e:
                ask(b.openai(key), cid, "meanwhile on B")
            assert e.value.body["code"] == "conversation_busy"
            assert b.http(key).put(f"/admin/conversations/{cid}/head", json={"node_id": None}).status_code == 409
        finally:
            answer.set()
        t.join(20)
        _, h = ask(b.openai(key), cid, "after")
        assert "long call on A" in upstream.last.text()  # B sees what A stored
        assert h["x-node-id"]


def test_a_live_call_keeps_its_lease_however_long_it_takes(fresh_database_url, upstream_url, upstream, key, cid):
    # (a lease of 3 s is renewed within 2 s of being set: the 1 s to spare is what a busy machine
    # -- two test runs and the clients' step at once -- may hold A's loop; with 1.2 s, 0.4 s was
    # too little, and the reaper took the live call)
    # (and the upstream's read timeout well past the ~8 s the call is held: with the suites' 10 s, a
    # slow Citus cluster's statements were enough to time A's call out before the test answered it)
    fast = {"server": {"lease_seconds": 3.0, "reaper_interval_seconds": 0.1},
            "upstream_defaults": {"read_timeout": 60.0}}
    settings = make_settings(fresh_database_url, upstream_url, **fast)
    db = Db(fresh_database_url)
    with serve_proxy(settings) as a, serve_proxy(settings) as b:
        answer = threading.Event()
        upstream.enqueue(Reply(content="took a while", hold=answer))  # answered when the test says so
        result = {}
        t = threading.Thread(target=lambda: result.update(zip(("c", "h"), ask(a.openai(key), cid, "slow"))))
        t.start()
        try:
            upstream.wait_for(1)
            pending = db.fetchrow("SELECT id, lease_until FROM nodes WHERE conversation_id = $1 AND status = 'pending'",
                                  cid)
            # about three times the lease gone by (the database's clock), the first lease long run
            # out: B's reaper ran many times -- and A renewed the lease all along
            wait_for(lambda: db.fetchval("SELECT now() > $1::timestamptz + interval '5 seconds'",
                                         pending["lease_until"]), 30, "three leases' time")
            with pytest.raises(openai.ConflictError):
                ask(b.openai(key), cid, "still busy?")
            assert db.fetchval("SELECT count(*) FROM nodes WHERE conversation_id = $1 AND status = 'failed'", cid) == 0
            assert db.fetchval("SELECT lease_until > now() FROM nodes WHERE id = $1", pending["id"])  # renewed
        finally:
            answer.set()
        t.join(20)
        assert result["c"].choices[0].message.content == "took a while"
        assert db.node(result["h"]["x-node-id"])["status"] == "success"
        assert db.head(cid) == result["h"]["x-node-id"]


def test_a_crashed_process_is_reaped_as_interrupted(fresh_database_url, upstream_url, upstream, cid, tmp_path):
    key = new_key()
    db = Db(fresh_database_url)
    proc, url = spawn_proxy(fresh_database_url, upstream_url, tmp_path, "[server]\nlease_seconds = 1.0\n")
    try:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=30)
        ask(client, cid, "before the crash")
        upstream.enqueue(Reply(kind="hang"))
        outcome: list[BaseException] = []

        def dying_call() -> None:
            try:
                ask(client, cid, "the call that dies")
            except BaseException as exc:
                outcome.append(exc)

        t = threading.Thread(target=dying_call, daemon=True)
        t.start()
        upstream.wait_for(2)
        node = wait_for(lambda: db.fetchrow("SELECT * FROM nodes WHERE conversation_id = $1 AND status = 'pending'", cid),
                          what="the pending node")
    finally:
        os.kill(proc.pid, signal.SIGKILL)  # no finally blocks, no shutdown: a crash
        proc.wait()
    t.join(10)
    assert len(outcome) == 1 and isinstance(outcome[0], openai.APIConnectionError), outcome  # the client saw the crash
    # a surviving instance's periodic reaper -- not a call -- marks it interrupted after the lease
    settings = make_settings(fresh_database_url, upstream_url, server={"lease_seconds": 1.0, "reaper_interval_seconds": 0.2})
    with serve_proxy(settings) as survivor:
        row = wait_for(lambda: (r := db.node(node["id"]))["status"] == "failed" and r, 15, "the reaper")
        assert row["error"]["code"] == "interrupted" and row["finished_at"] is not None
        assert "branchpoint_reaped_total 1.0" in survivor.http(key).get("/metrics").text
        assert db.head(cid) == str(node["id"])  # a transient failure: the failed node is the head
        assert db.fetchval("SELECT lease_node_id FROM conversations WHERE id = $1", cid) is None
        # the SDK's retry of the same items hangs beside it; the conversation is usable again
        _, h = ask(survivor.openai(key), cid, "the call that dies")
        assert h["x-parent-node-id"] == str(node["parent_id"])
        assert upstream.last.messages[-1] == user("the call that dies")


def test_the_next_call_reaps_an_expired_lease_itself(fresh_database_url, upstream_url, upstream, key, cid):
    # reaper effectively off: only the next call can notice the dead lease
    settings = make_settings(fresh_database_url, upstream_url, server={"lease_seconds": 0.5, "reaper_interval_seconds": 3600})
    db = Db(fresh_database_url)
    with serve_proxy(settings) as p:
        ask(p.openai(key), cid, "first")
        # simulate a process that died mid-call: a pending node holding the lease, never renewed
        db.fetch("""
            WITH c AS (SELECT * FROM conversations WHERE id = $1), n AS (
                INSERT INTO nodes (tree_id, id, tenant, conversation_id, parent_id, kind, sent, chain,
                                   depth, lease_until)
                SELECT c.tree_id, gen_random_uuid(), c.tenant, c.id, c.head_node_id, 'turn',
                       '[{"role": "user", "content": "lost"}]', '\\x00', 1, now() - interval '1 second' FROM c
                RETURNING id, tenant, conversation_id)
            UPDATE conversations SET lease_node_id = n.id, lease_until = now() - interval '1 second'
              FROM n WHERE conversations.tenant = n.tenant AND conversations.id = n.conversation_id""", cid)
        _, h = ask(p.openai(key), cid, "next")
        lost = db.fetchrow("SELECT * FROM nodes WHERE conversation_id = $1 AND sent->0->>'content' = 'lost'", cid)
        assert lost["status"] == "failed" and lost["error"]["code"] == "interrupted"
        assert h["x-parent-node-id"] == str(lost["id"])  # reaped, made the head, then built upon
        assert "lost" in upstream.last.text()



def test_only_calls_older_than_the_interval_are_renewed(fresh_database_url, cid):
    """A renewal pass renews only the leases set at least an interval (a third of the lease) ago:
    a short call costs no statement; a long one's lease is pushed on, its conversation's with it.
    (A database of its own: the two calls are left pending, leased.)"""
    async def scenario():
        db = await Database().open(fresh_database_url, min_size=1, max_size=2)
        try:
            store = TreeStore(db)
            keeper = LeaseKeeper(store, Metrics(), lease_seconds=30, reaper_interval=3600)
            started = {}
            for name in ("young", "old"):
                sent = [user(name)]
                node = uuid7()
                since = time.monotonic()
                begun = await store.begin_call(CallStart(
                    tenant="t_renew", conversation_id=f"{cid}-{name}", node_id=node, new_tree_id=uuid.uuid4(),
                    kind="turn", mode="delta", parent_mode="head", parent_id=None, sent=sent, digests=digests(sent),
                    prefixes=[], system_hash=None, lease_seconds=30, model=MODEL, provider="default", params={}))
                keeper.track(begun.tree_id, node, since)
                started[name] = node
            tree, _ = keeper.inflight[started["old"]]
            keeper.inflight[started["old"]] = (tree, time.monotonic() - keeper.interval)  # set an interval ago
            leases = "SELECT n.lease_until AS node, c.lease_until AS conv FROM nodes n JOIN conversations c " \
                     "ON c.tree_id = n.tree_id AND c.tenant = n.tenant AND c.id = n.conversation_id WHERE n.id = $1"
            before = {k: await db.fetchrow(leases, n) for k, n in started.items()}
            statements = db.statements
            await keeper.renew_due()
            assert db.statements == statements + 1  # one renewal
            after = {k: await db.fetchrow(leases, n) for k, n in started.items()}
            assert after["young"] == before["young"]
            assert after["old"]["node"] > before["old"]["node"] and after["old"]["conv"] > before["old"]["conv"]
            statements = db.statements
            await keeper.renew_due()  # just renewed: not again within the interval
            assert db.statements == statements
        finally:
            await db.close()

    run(scenario())


def test_a_lease_is_held_while_surely_alive_and_lapses_for_good():
    """What a finish goes by when its node is missing (``LeaseKeeper.held``): the lease is held
    for ``lease_seconds`` from before the statement that set it; a renewal that finds the node
    no longer pending renews nothing -- sent while the lease was held, nobody can have reaped the
    node (a start the database lost: still held until the lease runs out); sent after, the lease
    ran out for good, however the database answers later. A renewal that found the node pending
    sets it again. (A renewal that found the node gone once the database was back counted as a
    renewal: a reaped call whose conversation was deleted was written back at its finish.)"""
    answers: list[object] = []

    class Tree:
        async def renew(self, tree_id, node_id, seconds):
            answer = answers.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return answer

    from storage import StorageUnavailable

    keeper = LeaseKeeper(Tree(), Metrics(), lease_seconds=30, reaper_interval=3600)
    tree, node = uuid.uuid4(), uuid.uuid4()
    now = time.monotonic()
    keeper.track(tree, node, now - 29.5)  # set 29.5 s ago: within the spare second of running out
    assert not keeper.held(node)
    keeper.track(tree, node, now - 11)  # set 11 s ago
    assert keeper.held(node)
    answers[:] = [False]  # the node is missing: a lost start (the lease was held when asked)
    run(keeper.renew_due())
    assert keeper.held(node) and keeper.inflight[node][1] == now - 11  # (nothing renewed)
    answers[:] = [True]  # found pending: renewed from when it was asked
    run(keeper.renew_due())
    assert keeper.held(node) and keeper.inflight[node][1] >= now
    keeper.inflight[node] = (tree, now - 40)  # renewals failed for longer than the lease (cut off)
    answers[:] = [StorageUnavailable("away")]
    run(keeper.renew_due())
    assert not keeper.held(node)
    answers[:] = [False]  # back: the node reaped (or reaped and deleted) meanwhile
    run(keeper.renew_due())
    assert node in keeper.lapsed
    keeper.inflight[node] = (tree, time.monotonic())  # whatever comes later: lapsed for good
    assert not keeper.held(node)
    keeper.untrack(node)
    assert node not in keeper.lapsed


@pytest.mark.parametrize("stream", [False, True])
def test_an_answer_whose_node_was_reaped_meanwhile_is_not_told_a_success(fresh_database_url, upstream_url, upstream,
                                                                        key, cid, stream):
    """A call whose lease ran out while its upstream still answered (a process cut off from the
    database for longer than the lease: no renewal came) was reaped as interrupted, and the next
    turn went on without it. When its answer then comes, it is stored nowhere -- so its client is
    told the call was interrupted (503, or a stream's error end), never that it succeeded: it was
    answered 200 with an answer the conversation does not hold."""
    db = Db(fresh_database_url)
    settings = make_settings(fresh_database_url, upstream_url, server={"lease_seconds": 30, "reaper_interval_seconds": 0.1})
    with serve_proxy(settings) as p:
        client = p.openai(key)
        say(client, cid, user("q1"))
        hold = threading.Event()
        upstream.enqueue(Reply(content="answer A", hold=hold))
        outcome: dict[str, object] = {}

        def slow() -> None:
            try:
                answer, _ = say(client, cid, user("qA"), stream=stream)
                outcome["text"] = "".join(c.choices[0].delta.content or "" for c in answer if c.choices) if stream \
                    else answer.choices[0].message.content
            except openai.APIError as exc:  # (a stream's error end raises as the chunks are read)
                outcome["error"] = exc

        thread = threading.Thread(target=slow)
        thread.start()
        try:
            upstream.wait_for(2)
            pending = wait_for(lambda: db.fetchval(
                "SELECT id FROM nodes WHERE conversation_id = $1 AND outcome IS NULL", cid))
            # (the conversation's lease first: the reaper, every 0.1 s, goes by the node's, and clears both)
            db.fetch("UPDATE conversations SET lease_until = now() - interval '1 second' "
                     "WHERE id = $1 AND lease_node_id = $2", cid, pending)
            db.fetch("UPDATE nodes SET lease_until = now() - interval '1 second' WHERE id = $1", pending)
            wait_for(lambda: db.node(pending)["status"] == "failed", 10, "the reaper")
            say(client, cid, user("qB"))
        finally:
            hold.set()
        thread.join(20)
    assert "error" in outcome, outcome
    error = outcome["error"]
    assert "lease ran out" in str(error) and (stream or getattr(error, "status_code", None) == 503), error
    assert db.node(pending)["received"] is None


def _cut_off_from_renewing(monkeypatch) -> tuple[threading.Event, list[bool]]:
    """The process cannot reach the database to renew its leases (its calls go on) -- until the
    event returned is set; then the renewals' answers are listed."""
    back = threading.Event()
    answered: list[bool] = []
    renew = TreeStore.renew

    async def lost(self, tree_id, node_id, lease_seconds):
        if back.is_set():
            answered.append(await renew(self, tree_id, node_id, lease_seconds))
            return answered[-1]
        from storage import StorageUnavailable
        raise StorageUnavailable("connection lost (simulated)")
    monkeypatch.setattr(TreeStore, "renew", lost)
    return back, answered


def _a_late_call(proxy, upstream, key: str, cid: str) -> tuple[threading.Thread, threading.Event, dict[str, object]]:
    """A turn of ``proxy``'s, to be started, whose upstream answer waits for the event; the error
    its client got, if any, in the dict."""
    hold = threading.Event()
    upstream.enqueue(Reply(content="OLD ANSWER", hold=hold))
    outcome: dict[str, object] = {}

    def old_call() -> None:
        try:
            ask(proxy.openai(key, max_retries=0), cid, "OLD QUESTION")
        except openai.APIError as exc:
            outcome["error"] = exc

    return threading.Thread(target=old_call), hold, outcome


@pytest.mark.parametrize(("made_again", "back_before_the_answer"), [(False, False), (True, False), (False, True),
                                                                    (True, True)])
def test_a_reaped_call_whose_conversation_was_deleted_is_not_written_back(fresh_database_url, upstream_url, upstream,
                                                                          key, monkeypatch, made_again,
                                                                          back_before_the_answer):
    """A process cut off from the database longer than the lease: another process reaps its call,
    and then the conversation is deleted (nothing holds it any more) -- and made again under its
    name. When the old call's answer comes, its node is missing; it was written again, as a start
    the database had lost: the deleted conversation came back, or its question and answer became
    the new one's head and context, and the client was told it succeeded. A node is written again
    only while its process surely held the lease; the client is told the call was interrupted."""
    cid = f"again-{uuid.uuid4().hex[:8]}"
    db = Db(fresh_database_url)
    settings = make_settings(fresh_database_url, upstream_url, server={"lease_seconds": 1.5, "reaper_interval_seconds": 0.1})
    with serve_proxy(settings) as a, serve_proxy(settings) as b:
        thread, hold, outcome = _a_late_call(a, upstream, key, cid)
        back, answered = _cut_off_from_renewing(monkeypatch)
        thread.start()
        try:
            upstream.wait_for(1)
            wait_for(lambda: db.fetchval("SELECT outcome FROM nodes WHERE conversation_id = $1", cid) == "transient",
                     10, "the reaper")
            assert b.http(key).delete(f"/admin/conversations/{cid}").status_code == 200
            if made_again:
                ask(b.openai(key), cid, "NEW QUESTION")
            if back_before_the_answer:  # A reaches the database again, and renews: the node is gone
                back.set()
                wait_for(lambda: answered, 10, "a renewal of A's")
                assert answered[0] is False
        finally:
            hold.set()
        thread.join(20)
        assert getattr(outcome.get("error"), "status_code", None) == 503, outcome
        assert not any("OLD QUESTION" in str(row["sent"]) for row in db.fetch("SELECT sent FROM nodes"))
        if made_again:
            ask(b.openai(key), cid, "FOLLOW-UP")
            assert upstream.last.messages == [user("NEW QUESTION"), {"role": "assistant", "content": "echo: NEW QUESTION"},
                                              user("FOLLOW-UP")]
        else:
            assert db.fetchval("SELECT count(*) FROM conversations WHERE id = $1", cid) == 0


def test_a_reaped_call_whose_response_was_deleted_leaves_the_head_where_it_was_put(
        fresh_database_url, upstream_url, upstream, key, monkeypatch):
    """The same for a later call: reaped, the head moved back by hand, the reaped node deleted as a
    response (DELETE /v1/responses/{id}) -- its answer, coming then, neither brought the node back
    nor moved the head onto it."""
    cid = f"resp-{uuid.uuid4().hex[:8]}"
    db = Db(fresh_database_url)
    settings = make_settings(fresh_database_url, upstream_url, server={"lease_seconds": 1.5, "reaper_interval_seconds": 0.1})
    with serve_proxy(settings) as a, serve_proxy(settings) as b:
        first = ask(b.openai(key), cid, "first")[1]["x-node-id"]
        thread, hold, outcome = _a_late_call(a, upstream, key, cid)
        _cut_off_from_renewing(monkeypatch)  # (for good)
        thread.start()
        try:
            upstream.wait_for(2)
            old = wait_for(lambda: db.fetchval("SELECT id FROM nodes WHERE conversation_id = $1 AND outcome = 'transient'",
                                               cid), 10, "the reaper")
            http = b.http(key)
            assert http.put(f"/admin/conversations/{cid}/head", json={"node_id": first}).status_code == 200
            assert http.delete(f"/v1/responses/resp_{old.hex}").status_code == 200
        finally:
            hold.set()
        thread.join(20)
        assert getattr(outcome.get("error"), "status_code", None) == 503, outcome
        assert db.head(cid) == first
        assert db.fetchval("SELECT count(*) FROM nodes WHERE id = $1", old) == 0
