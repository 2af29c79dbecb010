"""PostgreSQL going away under traffic: requests fail fast with 503 (never hang, never 500), the
pool recovers by itself, and an outcome that could not be stored is stored once it is back."""

import asyncio
import struct
import threading
import time
from urllib.parse import urlsplit

import asyncpg
import httpx
import pytest

from storage import StorageUnavailable
from storage.database import Database

from .conftest import Db, RowLocks, assert_invariants, make_settings, run, serve_proxy, wait_for
from .fakes import Reply
from .helpers import MODEL


def call(http, key, cid, text, timeout=10):
    return http.post("/v1/chat/completions", timeout=timeout,
                     headers={"Authorization": f"Bearer {key}", "X-Conversation-Id": cid},
                     json={"model": MODEL, "messages": [{"role": "user", "content": text}]})


def _held_call(http, upstream, key, cid, answer):
    """The conversation's second call ("in flight"), its upstream's ``answer`` held until the
    returned event is set: (the thread, its result, the event)."""
    hold = threading.Event()
    upstream.enqueue(Reply(content=answer, hold=hold))
    result: dict = {}
    t = threading.Thread(target=lambda: result.update(r=call(http, key, cid, "in flight", timeout=30)))
    t.start()
    upstream.wait_for(2)
    return t, result, hold


def test_database_restart_under_traffic(own_server, upstream_url, upstream, key, cid):
    url = own_server.url
    db = Db(url)
    with serve_proxy(own_server.settings(upstream_url)) as p, httpx.Client(base_url=p.url) as http:
        assert call(http, key, cid, "before").status_code == 200

        # a call whose answer arrives while the database is down
        t, result, hold = _held_call(http, upstream, key, cid, "answered during the outage")

        own_server.stop()  # the outage begins
        hold.set()
        t.join(30)
        assert result["r"].status_code == 200  # the client still gets the answer it waited for
        in_flight = result["r"].headers["x-node-id"]

        durations = []
        for i in range(5):
            t0 = time.monotonic()
            r = call(http, key, f"{cid}-{i}", "during")
            durations.append(time.monotonic() - t0)
            assert r.status_code == 503, r.text
            assert r.json()["error"]["code"] == "database_unavailable"
            assert set(r.json()["error"]) == {"message", "type", "param", "code"}
        assert max(durations) < 3.0, durations  # fast, not a hang
        assert http.get("/readyz").status_code == 503
        assert http.get("/healthz").status_code == 200
        admin = http.get(f"/admin/conversations/{cid}", headers={"Authorization": f"Bearer {key}"})
        assert admin.status_code == 503

        own_server.start()  # ... and ends
        deadline = time.monotonic() + 20
        while True:
            r = call(http, key, cid, "after")
            if r.status_code == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert r.status_code == 200, r.text
        assert http.get("/readyz").status_code == 200
        # the answer of the call that finished during the outage was stored after all
        node = db.node(in_flight)
        assert node["status"] == "success" and node["received"][0]["content"] == "answered during the outage"
        assert r.headers["x-parent-node-id"] == in_flight
        assert "answered during the outage" in upstream.last.text()
        assert db.fetchval("SELECT count(*) FROM nodes WHERE status = 'pending'") == 0
    assert_invariants(url)


def _execute(url, *statements):
    """Run ``statements`` one by one on a connection of their own (an operator's session)."""
    async def go():
        conn = await asyncpg.connect(url)
        try:
            for statement in statements:
                await conn.execute(statement)
        finally:
            await conn.close()

    run(go())


def test_a_database_refusing_writes_is_unavailable_and_the_answer_is_stored_once_it_takes_them(
        own_server, upstream_url, upstream, key, cid):
    """A database that refuses writes for a while -- a failover to a standby not yet promoted, a
    database in recovery, ``default_transaction_read_only`` (SQLSTATE 25006) -- is the database
    being away, as a stopped one: a new call is answered 503 ``database_unavailable`` and
    ``/readyz`` says not ready; the answer of a call in flight reaches its client and is stored
    once writes work again, and the conversation is free at once. It was a 500 ``storage_error``;
    the outcome was taken for refused, the node could not be failed either and was left to the
    reaper: the conversation busy for the whole lease, then the node reaped ``interrupted`` --
    the answer its client had was never stored."""
    url = own_server.url
    db = Db(url)
    with serve_proxy(own_server.settings(upstream_url)) as p, httpx.Client(base_url=p.url) as http:
        assert call(http, key, cid, "before").status_code == 200
        t, result, hold = _held_call(http, upstream, key, cid, "answered while read-only")

        _execute(url, "ALTER SYSTEM SET default_transaction_read_only = on", "SELECT pg_reload_conf()")
        during = wait_for(lambda: (r := call(http, key, f"{cid}-new", "during")).status_code != 200 and r,
                          what="the database read-only")
        assert during.status_code == 503, during.text
        assert during.json()["error"]["code"] == "database_unavailable"
        assert http.get("/readyz").status_code == 503
        hold.set()
        t.join(30)
        assert result["r"].status_code == 200, result["r"].text  # the client gets the answer it waited for
        in_flight = result["r"].headers["x-node-id"]
        assert db.node(in_flight)["status"] == "pending"  # (nothing can be written yet)

        _execute(url, "SET default_transaction_read_only = off", "ALTER SYSTEM RESET default_transaction_read_only",
                 "SELECT pg_reload_conf()")
        node = wait_for(lambda: (n := db.node(in_flight))["outcome"] is not None and n, timeout=15,
                        what="the outcome stored")
        assert node["status"] == "success" and node["received"][0]["content"] == "answered while read-only"
        assert http.get("/readyz").status_code == 200
        after = call(http, key, cid, "after")
        assert after.status_code == 200, after.text
        assert after.headers["x-parent-node-id"] == in_flight
        assert [m["content"] for m in upstream.last.messages] == [
            "before", "echo: before", "in flight", "answered while read-only", "after"]
    assert_invariants(url)


def test_a_finish_whose_lock_wait_timed_out_is_stored_once_the_lock_is_gone(fresh_database_url, upstream_url,
                                                                            upstream, key, cid):
    """An operator's ``lock_timeout`` (SQLSTATE 55P03) hit by a call's finish, its conversation's
    row locked by another session: contention that passes, retried as a statement timeout or a
    deadlock is -- the client has its answer, which is stored once the lock is gone, and the next
    turn continues from it. It was taken for a refusal: the node could not be failed either (the
    same lock), stayed pending, the next turn was 409 until the lease ran out, and the answer was
    never stored."""
    database = urlsplit(fresh_database_url).path.lstrip("/")
    _execute(fresh_database_url, f'ALTER DATABASE "{database}" SET lock_timeout = \'300ms\'')
    with serve_proxy(make_settings(fresh_database_url, upstream_url)) as p, httpx.Client(base_url=p.url) as http:
        assert call(http, key, cid, "first").status_code == 200
        hold = threading.Event()
        upstream.enqueue(Reply(content="answered under a lock", hold=hold))
        result = {}
        t = threading.Thread(target=lambda: result.update(r=call(http, key, cid, "second", timeout=30)))
        t.start()
        upstream.wait_for(2)
        with RowLocks(fresh_database_url, [cid]):
            hold.set()
            t.join(30)
            assert result["r"].status_code == 200, result["r"].text
        node_id = result["r"].headers["x-node-id"]
        wait_for(lambda: Db(fresh_database_url).node(node_id)["status"] == "success", timeout=15,
                 what="the outcome stored")
        third = call(http, key, cid, "third")
        assert third.status_code == 200, third.text
        assert [m["content"] for m in upstream.last.messages] == [
            "first", "echo: first", "second", "answered under a lock", "third"]
    assert_invariants(fresh_database_url)


def test_waiting_for_a_pooled_connection_gives_up_without_losing_it(database_url):
    """All connections busy for longer than ``acquire_timeout``: the statement is refused as
    unavailable (not sent), and the pool afterwards still has every connection."""
    async def scenario():
        db = await Database().open(database_url, min_size=1, max_size=1)
        db.acquire_timeout = 0.2
        try:
            async with db.connection() as held:
                for _ in range(3):
                    with pytest.raises(StorageUnavailable) as refused:
                        await db.fetchval("SELECT 1")
                    assert refused.value.sent is False
                assert await held.fetchval("SELECT 2") == 2
            assert [await db.fetchval("SELECT $1::int", i) for i in range(3)] == [0, 1, 2]
            assert db.pool.idle == 1 and db.pool.size == 1
        finally:
            await db.close()

    run(scenario())


def _server_ends_the_session(conn) -> None:
    """What a server shutting down (or a terminated backend) sends an idle connection before it
    closes the socket -- a FATAL ErrorResponse -- handed to the connection's protocol as if it had
    just arrived: the state a pooled connection is in until the socket's end is read."""
    body = b"SFATAL\0VFATAL\0C57P01\0Mterminating connection due to administrator command\0\0"
    conn._protocol.data_received(b"E" + struct.pack("!i", len(body) + 4) + body)


async def wait_until(conn, query, *args, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not await conn.fetchval(query, *args):
        assert time.monotonic() < deadline, query
        await asyncio.sleep(0.02)


def test_a_connection_the_server_is_ending_is_unavailable_and_dropped(database_url):
    """A pooled connection the server ended while it was idle -- its farewell read, not yet the
    socket's end -- refuses any statement (asyncpg: "cannot switch to state ..."): that is the
    database being away (503, an outcome stored later), not a refusal (a 500, an outcome failed);
    and the connection is dropped, not given back. A statement the server ends (FATAL: the
    backend terminated) drops its connection too."""
    async def scenario():
        db = await Database().open(database_url, min_size=1, max_size=1)
        try:
            async with db.connection() as conn:
                pass
            _server_ends_the_session(conn)
            assert not conn.is_closed()
            with pytest.raises(StorageUnavailable) as away:
                await db.fetchval("SELECT 1")
            assert type(away.value.__cause__).__name__ == "InternalClientError"
            assert conn.is_closed()
            assert await db.fetchval("SELECT 2") == 2

            async with db.connection() as conn:
                pid = conn.get_server_pid()
            ended = asyncio.ensure_future(db.fetchval("SELECT pg_sleep(5)"))
            other = await asyncpg.connect(database_url)
            try:
                await wait_until(other, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND query LIKE '%pg_sleep%'", pid)
                assert await other.fetchval("SELECT pg_terminate_backend($1::int)", pid)
            finally:
                await other.close()
            with pytest.raises(StorageUnavailable):
                await ended
            assert conn.is_closed() and db.pool.size == 0 and db.pool.idle == 0
            assert await db.fetchval("SELECT 3") == 3
        finally:
            await db.close()

    run(scenario())


def test_an_answer_whose_finish_meets_a_connection_the_server_ended_is_stored(fresh_database_url, upstream_url, upstream,
                                                                             key, cid):
    """The call's finish borrows a connection the server ended while it was idle (a restart under
    load): the client still gets its answer, which is stored once a connection works -- it was
    'refused', the node failed without it -- and the conversation is free for the next turn. (A
    proxy of its own, with a pool of two: every idle connection is made one the server ended, and
    none is left to another test.)"""
    settings = make_settings(fresh_database_url, upstream_url, database={"pool_min": 1, "pool_max": 2})
    with serve_proxy(settings) as proxy, httpx.Client(base_url=proxy.url, timeout=30) as http:
        assert call(http, key, cid, "first").status_code == 200
        hold = threading.Event()
        upstream.enqueue(Reply(content="the answer", hold=hold))
        answered = []
        asking = threading.Thread(target=lambda: answered.append(call(http, key, cid, "second", timeout=30)))
        asking.start()
        wait_for(lambda: upstream.requests and upstream.last.messages[-1]["content"] == "second")

        async def end_idle_sessions() -> int:
            idle = [conn for conn, _ in proxy.runtime.db.pool._idle]
            for conn in idle:
                _server_ends_the_session(conn)
            return len(idle)

        assert proxy.in_loop(end_idle_sessions()) >= 1
        hold.set()
        asking.join(30)
        assert answered[0].status_code == 200, answered[0].text
        node_id = answered[0].headers["x-node-id"]
        wait_for(lambda: proxy.db.node(node_id)["status"] == "success", timeout=10)
        nxt = call(http, key, cid, "third")
        assert nxt.status_code == 200, nxt.text
        assert [m["content"] for m in upstream.last.messages] == ["first", "echo: first", "second", "the answer",
                                                                  "third"]


@pytest.mark.slow  # (seconds of its own: the slow CI step, .ci/slow.sh)
def test_an_exhausted_pool_answers_503_in_time_and_recovers(fresh_database_url, upstream_url, upstream, key, cid):
    """The only pooled connection stuck (its statement waits on a row lock another session
    holds): the stuck call and one waiting for a connection are both answered 503 within the
    statement timeout -- never a hang, never a 500 -- and once the lock is gone the pool, whose
    stuck connection was given up, serves calls again."""
    import concurrent.futures

    settings = make_settings(fresh_database_url, upstream_url,
                             database={"pool_min": 1, "pool_max": 1, "command_timeout": 1.0},
                             server={"lease_seconds": 2})  # (the stuck start's release is looked for that long)

    with serve_proxy(settings) as p, httpx.Client(base_url=p.url, timeout=15) as http:
        assert call(http, key, cid, "first").status_code == 200
        with RowLocks(fresh_database_url, [cid]):
            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                answers = list(pool.map(lambda text: call(http, key, cid, text), ["stuck", "waiting"]))
            for r in answers:
                assert r.status_code == 503, r.text
                assert r.json()["error"]["code"] == "database_unavailable"
        r = call(http, key, f"{cid}-after", "after")  # (another conversation: the stuck start may hold a lease a moment)
        assert r.status_code == 200, r.text
