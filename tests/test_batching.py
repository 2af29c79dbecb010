"""Batched round trips (docs/architecture.md#batched-round-trips): the starts and finishes of calls
that reach the database in the same turn of the event loop go as one round trip and one
transaction -- each caller still gets its own answer, its own refusal, its own error."""

import asyncio
import contextlib
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from storage import Busy, NodeMissing, StorageError, StorageUnavailable
from storage.database import Database
from storage.ids import uuid7
from storage.model import Outcome
from storage.transcript import digests
from storage.tree import CallFinish, CallStart, TreeStore

from .conftest import Db, RowLocks, assert_invariants, make_settings, run, serve_proxy, wait_for
from .fakes import Reply
from .helpers import MODEL, say, user

TENANT = "t_batch"


def _conversations(n):
    tag = uuid.uuid4().hex[:8]
    return [f"b-{tag}-{i}" for i in range(n)]


async def _begin(store, cid, text, *, kind="turn", parent_mode="head", parent_id=None):
    sent = [user(text)]
    node = uuid7()
    begun = await store.begin_call(CallStart(
        tenant=TENANT, conversation_id=cid, node_id=node, new_tree_id=uuid.uuid4(), kind=kind, mode="delta",
        parent_mode=parent_mode, parent_id=parent_id, sent=sent, digests=digests(sent), prefixes=[],
        system_hash=None, lease_seconds=60, model=MODEL, provider="default", params={}))
    return node, begun


async def _finish(store, cid, node, begun, text, *, outcome=Outcome.SUCCESS, leased=True):
    return await store.finish_call(begun.tree_id, node, CallFinish(
        outcome=outcome, received=[{"role": "assistant", "content": text}], usage=None, finish_reason="stop",
        error=None, request_hash=None, leased=leased), tenant=TENANT, conversation_id=cid)


def _counts(db):
    return db.statements, db.batches, db.batched


async def _heads(db, cids):
    rows = await db.fetch("SELECT id, head_node_id FROM conversations WHERE tenant = $1 AND id = ANY($2)", TENANT, cids)
    return {r["id"]: r["head_node_id"] for r in rows}


@contextlib.asynccontextmanager
async def _store(url, *, batch=True, **options):
    """A database of its own (closed afterwards) and a TreeStore over it."""
    db = await Database().open(url, min_size=1, max_size=4, **options)
    try:
        yield db, TreeStore(db, batch=batch)
    finally:
        await db.close()


async def _started(store, n):
    """``n`` new conversations, each with a turn started (one at a time) and not finished."""
    cids = _conversations(n)
    return cids, [await _begin(store, c, "q") for c in cids]


def test_calls_reaching_the_database_together_share_a_round_trip(database_url):
    async def scenario():
        async with _store(database_url) as (db, store):
            cids = _conversations(12)
            before = _counts(db)
            first = await asyncio.gather(*(_begin(store, c, f"first in {c}") for c in cids))
            assert _counts(db) == (before[0] + 1, before[1] + 1, before[2] + 12)  # twelve starts, one round trip
            for c, (_, begun) in zip(cids, first):
                assert begun.conversation_id == c and begun.parent_id is None and begun.path == []
            assert all(await asyncio.gather(*(_finish(store, c, n, b, f"answer in {c}")
                                               for c, (n, b) in zip(cids, first))))
            assert _counts(db)[:2] == (before[0] + 2, before[1] + 2)
            assert await _heads(db, cids) == {c: n for c, (n, _) in zip(cids, first)}

            # the next turns: each gets its own conversation's path back out of the shared rows
            before = _counts(db)
            second = await asyncio.gather(*(_begin(store, c, f"second in {c}") for c in cids))
            assert _counts(db) == (before[0] + 1, before[1] + 1, before[2] + 12)
            for c, (n1, _), (_, begun) in zip(cids, first, second):
                assert begun.parent_id == n1
                assert [p.id for p in begun.path] == [n1]
                assert begun.path[0].sent == [user(f"first in {c}")]
                assert begun.path[0].received == [{"role": "assistant", "content": f"answer in {c}"}]
            await asyncio.gather(*(_finish(store, c, n, b, "ok") for c, (n, b) in zip(cids, second)))
            assert await _heads(db, cids) == {c: n for c, (n, _) in zip(cids, second)}

    run(scenario())


def test_a_refused_start_is_refused_alone(database_url):
    """One start of a batch refused (a turn in flight, an unknown parent): the batch is undone and
    every start runs again alone -- the others are stored once, the refused ones get their refusal."""
    async def scenario():
        async with _store(database_url) as (db, store):
            busy, fine, side, unknown = _conversations(4)
            await _begin(store, busy, "in flight")  # holds the lease: its next turn is refused
            node, begun = await _begin(store, unknown, "first")
            await _finish(store, unknown, node, begun, "a")
            before = _counts(db)
            results = await asyncio.gather(
                _begin(store, busy, "again"), _begin(store, fine, "hello"), _begin(store, side, "aside", kind="transform"),
                _begin(store, unknown, "edit", parent_mode="node", parent_id=uuid7()), return_exceptions=True)
            assert isinstance(results[0], Busy) and isinstance(results[3], NodeMissing), results
            assert _counts(db)[:2] == (before[0] + 5, before[1] + 1)  # the batch, then four alone
            for cid, (node, begun) in ((fine, results[1]), (side, results[2])):
                assert begun.conversation_id == cid
                count = await db.fetchval("SELECT count(*) FROM nodes WHERE tenant = $1 AND conversation_id = $2",
                                          TENANT, cid)
                assert count == 1, cid  # stored once: the undone batch left nothing behind
                await _finish(store, cid, node, begun, "fine", leased=cid == fine)  # (side calls take no lease)

    run(scenario())


def test_a_failed_finish_fails_alone(database_url):
    async def scenario():
        async with _store(database_url) as (db, store):
            cids, started = await _started(store, 3)
            (n0, b0), (n1, b1), (n2, b2) = started
            results = await asyncio.gather(
                _finish(store, cids[0], n0, b0, "a"),
                store.finish_call(b1.tree_id, n1, CallFinish(outcome=Outcome.SUCCESS,  # an answer that is
                                  received="not a list", usage=None, finish_reason="stop", error=None,  # no array
                                  request_hash=None, leased=True, received_digests=[]), tenant=TENANT,
                                  conversation_id=cids[1]),
                _finish(store, cids[2], n2, b2, "c"),
                return_exceptions=True)
            assert results[0] is True and results[2] is True, results
            assert isinstance(results[1], StorageError), results
            assert await _heads(db, cids) == {cids[0]: n0, cids[1]: None, cids[2]: n2}

    run(scenario())


def test_a_batch_runs_in_conversation_order(database_url):
    """Batches lock conversation rows in one order -- (tenant, conversation) -- so two of them cannot
    deadlock on those rows. Seen in the order the finishes ran (each stamps ``finished_at``)."""
    async def scenario():
        async with _store(database_url) as (db, store):
            cids, started = await _started(store, 5)
            cids, started = cids[::-1], started[::-1]  # finished in the reverse order of the names
            await asyncio.gather(*(_finish(store, c, n, b, "a") for c, (n, b) in zip(cids, started)))
            rows = await db.fetch("SELECT conversation_id FROM nodes WHERE id = ANY($1) ORDER BY finished_at",
                                  [n for n, _ in started])
            assert [r["conversation_id"] for r in rows] == sorted(cids)

    run(scenario())


def test_a_batch_that_times_out_fails_every_caller_once(database_url):
    """The database gone quiet once a batch was sent -- here a conversation row another transaction
    holds past the timeout -- fails every caller of the batch, as it would have alone; nobody runs
    again alone, since the batch may have been carried out (and here it may: see the end)."""
    async def scenario():
        async with _store(database_url, command_timeout=0.5) as (db, store):
            cids, started = await _started(store, 3)
            async with db.connection() as holder, holder.transaction():
                await holder.execute("SELECT 1 FROM conversations WHERE tenant = $1 AND id = $2 FOR UPDATE",
                                     TENANT, cids[0])
                before = _counts(db)
                results = await asyncio.gather(*(_finish(store, c, n, b, "a") for c, (n, b) in zip(cids, started)),
                                               return_exceptions=True)
                assert all(isinstance(r, StorageUnavailable) and r.sent for r in results), results
                assert _counts(db)[:2] == (before[0] + 1, before[1] + 1)
            # all or nothing -- and possibly all: the batch had been sent whole (its Sync too), so
            # the server may still carry it out once the row is free, whatever the client thinks
            heads = await _heads(db, cids)
            assert heads in (dict.fromkeys(cids), {c: n for c, (n, _) in zip(cids, started)}), heads

    run(scenario())


def test_a_caller_that_stops_waiting_does_not_stop_the_batch(database_url):
    async def scenario():
        async with _store(database_url) as (db, store):
            cids, started = await _started(store, 3)
            tasks = [asyncio.create_task(_finish(store, c, n, b, "a")) for c, (n, b) in zip(cids, started)]
            await asyncio.sleep(0)  # all three queued
            tasks[1].cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            assert results[0] is True and results[2] is True and isinstance(results[1], asyncio.CancelledError)
            # the cancelled caller's finish went with the batch all the same
            assert await _heads(db, cids) == {c: n for c, (n, _) in zip(cids, started)}

            # the first caller of the turn, which gathers the others, cancelled while it gathers:
            # its own statement was never sent, the others' go without it
            cids, started = await _started(store, 3)
            tasks = [asyncio.create_task(_finish(store, c, n, b, "a")) for c, (n, b) in zip(cids, started)]
            await asyncio.sleep(0)
            tasks[0].cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            assert isinstance(results[0], asyncio.CancelledError) and results[1:] == [True, True], results
            assert await _heads(db, cids) == {cids[0]: None, cids[1]: started[1][0], cids[2]: started[2][0]}

    run(scenario())


def test_batching_off_sends_each_alone(database_url):
    async def scenario():
        async with _store(database_url, batch=False) as (db, store):
            before = _counts(db)
            started = await asyncio.gather(*(_begin(store, c, "q") for c in _conversations(4)))
            assert len(started) == 4
            assert _counts(db) == (before[0] + 4, before[1], before[2])

    run(scenario())


@pytest.mark.parametrize("batch", [True, False])
def test_concurrent_clients_get_their_own_context(database_url, upstream_url, upstream, key, batch):
    """Through the SDK: eight clients whose answers arrive at once, turn after turn -- each
    conversation's upstream request holds its own history, whatever shared a round trip."""
    settings = make_settings(database_url, upstream_url, database={"batch_calls": batch})
    with serve_proxy(settings) as p:
        client = p.openai(key)
        cids = _conversations(8)
        batched = p.runtime.db.batched
        for turn in range(3):
            release = threading.Event()
            upstream.enqueue(*[Reply(content=f"answer {turn}", hold=release) for _ in cids])
            with ThreadPoolExecutor(len(cids)) as pool:
                futures = [pool.submit(say, client, c, user(f"{c} turn {turn}")) for c in cids]
                upstream.wait_for(len(cids) * (turn + 1))
                release.set()
                for f in futures:
                    f.result()
        for c in cids:
            sent = [r for r in upstream.chat_requests if r.messages and r.messages[-1]["content"] == f"{c} turn 2"]
            assert len(sent) == 1
            assert [(m["role"], m["content"]) for m in sent[0].messages] == [
                ("user", f"{c} turn 0"), ("assistant", "answer 0"), ("user", f"{c} turn 1"), ("assistant", "answer 1"),
                ("user", f"{c} turn 2")]
        if batch:  # answers released together are stored together (32-39 of the 48 statements, as measured)
            assert p.runtime.db.batched > batched
        else:
            assert p.runtime.db.batched == batched


WAITING = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"


def test_finishes_whose_connection_is_cut_are_stored_afterwards(fresh_database_url, upstream_url, upstream, key):
    """Answers released together are being stored -- in batches, as they come -- when their
    connections are cut (the backends terminated while they wait for row locks): every client still
    gets its answer, and every outcome is stored once the database lets it, each finish running
    again in the background (docs/architecture.md#batched-round-trips: a batch that lost its
    connection after being sent fails all of its callers, and each handles it as alone)."""
    cids = _conversations(6)
    db = Db(fresh_database_url)
    with serve_proxy(make_settings(fresh_database_url, upstream_url)) as p:
        client = p.openai(key)
        for c in cids:
            say(client, c, user("first"))
        release = threading.Event()
        upstream.enqueue(*[Reply(content="second answer", hold=release) for _ in cids])
        with ThreadPoolExecutor(len(cids)) as pool:
            futures = {c: pool.submit(say, client, c, user(f"second in {c}")) for c in cids}
            upstream.wait_for(2 * len(cids))  # every start stored
            with RowLocks(fresh_database_url, cids) as locks:
                release.set()
                wait_for(lambda: db.fetchval(WAITING) >= 1, what="the finishes waiting for the locks")
                time.sleep(0.3)  # (the stragglers, if any, join the wait)
                assert db.fetchval("SELECT count(*) FROM nodes WHERE conversation_id = ANY($1) AND status = 'pending'",
                                   cids) == len(cids)
                cut = db.fetchval("SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                  "WHERE datname = current_database() AND wait_event_type = 'Lock') t")
                assert cut >= 1
                locks.release()
            answers = {c: f.result(timeout=30) for c, f in futures.items()}
        for completion, _ in answers.values():
            assert completion.choices[0].message.content == "second answer"
        wait_for(lambda: db.fetchval("SELECT count(*) FROM nodes WHERE status = 'pending'") == 0, timeout=20,
                 what="every outcome stored")
        for c, (_, headers) in answers.items():
            assert db.node(headers["x-node-id"])["status"] == "success"
            assert db.head(c) == headers["x-node-id"]
    assert_invariants(fresh_database_url)


@pytest.mark.slow  # (seconds of its own: the slow CI step, .ci/slow.sh)
def test_starts_whose_connection_is_cut_answer_503_and_leave_nothing_pending(fresh_database_url, upstream_url, key):
    """Turns started together wait for their conversations' rows -- alone or in batches, as they
    arrive -- when their connections are cut: each client gets 503 ``database_unavailable`` (the start may or may not
    have been written), nothing is left pending or leased, and the next turns go through."""
    cids = _conversations(6)
    db = Db(fresh_database_url)
    with serve_proxy(make_settings(fresh_database_url, upstream_url)) as p, \
            httpx.Client(base_url=p.url, headers={"Authorization": f"Bearer {key}"}, timeout=30) as http:
        def turn(c, text):
            return http.post("/v1/chat/completions", headers={"X-Conversation-Id": c},
                             json={"model": MODEL, "messages": [user(text)]})

        for c in cids:
            assert turn(c, "first").status_code == 200
        with ThreadPoolExecutor(len(cids)) as pool, RowLocks(fresh_database_url, cids) as locks:
            futures = {c: pool.submit(turn, c, "second") for c in cids}
            wait_for(lambda: db.fetchval(WAITING) >= 1, what="the starts waiting for the locks")
            time.sleep(0.3)
            db.fetchval("SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND wait_event_type = 'Lock') t")
            locks.release()
            answers = {c: f.result(timeout=30) for c, f in futures.items()}
        cut = [c for c, r in answers.items() if r.status_code != 200]
        assert cut, "no start was cut"
        for c in cut:
            assert answers[c].status_code == 503 and answers[c].json()["error"]["code"] == "database_unavailable"
        wait_for(lambda: db.fetchval("SELECT count(*) FROM nodes WHERE status = 'pending'") == 0
                 and db.fetchval("SELECT count(*) FROM conversations WHERE lease_node_id IS NOT NULL") == 0,
                 timeout=20, what="nothing pending or leased")
        for c in cids:
            assert turn(c, "third").status_code == 200
    assert_invariants(fresh_database_url)
