"""Stopping ``branchpoint serve`` with calls in flight (docs/behaviour.md#shutdown): calls that end
within ``[server] shutdown_grace_seconds`` finish normally; the rest are answered as interrupted --
503 with an OpenAI-shaped error, or a stream's final error event -- and their nodes are stored
failed (``interrupted``) with the conversation released, before the process exits."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx

from .conftest import Db, RowLocks
from .fakes import Reply, free_port
from .helpers import MODEL, user


def _serve(database_url: str, upstream_url: str, tmp_path: Any, grace: float,
           workers: int = 1) -> tuple[subprocess.Popen, str]:
    config = tmp_path / "shutdown.toml"
    config.write_text(f"[server]\nshutdown_grace_seconds = {grace}\nlog_level = \"warning\"\n")
    port = free_port()
    env = {**os.environ, "BRANCHPOINT_DATABASE_URL": database_url, "BRANCHPOINT_UPSTREAM_URL": upstream_url,
           "BRANCHPOINT_CONFIG": str(config)}
    proc = subprocess.Popen([sys.executable, "-m", "proxy.cli", "serve", "--port", str(port), "--workers", str(workers)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 40
    ready: set[int] = set()  # (the workers seen ready)
    while True:
        try:
            if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
                ready.add(httpx.get(f"{base}/healthz", timeout=2).json()["pid"])
                if len(ready) == workers:
                    return proc, base
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"serve did not come up: {proc.stdout.read() if proc.stdout else ''}")
        time.sleep(0.2)


@contextlib.contextmanager
def _serving(database_url: str, upstream_url: str, tmp_path: Any, grace: float,
             held: threading.Event, workers: int = 1) -> Iterator[tuple[subprocess.Popen, str]]:
    """A ``serve`` process; on the way out ``held`` is set (whatever the fake upstream still holds
    goes) and a process still alive is killed."""
    proc, base = _serve(database_url, upstream_url, tmp_path, grace, workers)
    try:
        yield proc, base
    finally:
        held.set()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def _chat(base: str, cid: str, stream: bool) -> tuple[int | None, str | None, str]:
    """One call -- a chat call; ``pass-*``: no conversation, passed through; ``resp-*``: a
    Responses call -- as status, X-Node-Id, body."""
    path, body = "/v1/chat/completions", {"model": MODEL, "messages": [user(f"question of {cid}")], "stream": stream}
    if cid.startswith("resp"):
        path, body = "/v1/responses", {"model": MODEL, "input": f"question of {cid}", "stream": stream}
    headers = {"Authorization": "Bearer sk-shutdown"}
    if not cid.startswith("pass"):
        headers["X-Conversation-Id"] = cid
    try:
        with httpx.Client(base_url=base, timeout=30) as http, http.stream("POST", path, json=body, headers=headers) as r:
            return r.status_code, r.headers.get("x-node-id"), r.read().decode()
    except httpx.HTTPError as exc:  # (no answer at all: the assertions say which call)
        return None, None, repr(exc)


def _in_threads(base: str, calls: Any, answers: dict[str, Any], upstream: Any) -> list[threading.Thread]:
    """Start the calls one at a time -- each once the upstream has the one before, so each meets
    its scripted reply -- in threads that put their answers in ``answers``."""
    threads = []
    for n, (cid, stream) in enumerate(calls, start=1):
        threads.append(threading.Thread(target=lambda c=cid, s=stream: answers.__setitem__(c, _chat(base, c, s))))
        threads[-1].start()
        upstream.wait_for(n)
    return threads


def _stops_listening(base: str, timeout: float = 10.0) -> None:
    """Wait until ``base`` refuses connections: the process has begun its shutdown."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            httpx.get(f"{base}/healthz", timeout=1)
        except httpx.ConnectError:
            return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "the process still accepts connections"
        time.sleep(0.02)


def _exits(proc: subprocess.Popen, stopped: float, within: float) -> float:
    """The process exits as a shut-down server does within ``within`` seconds of ``stopped`` (when
    SIGTERM was sent) -- by the SIGTERM, which uvicorn raises again once its shutdown is over (not
    SIGKILL, nor an error's exit code); returns how long it took."""
    try:
        code = proc.wait(max(0.0, stopped + within - time.monotonic()))
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the process still ran {within} s after SIGTERM") from None
    took = time.monotonic() - stopped
    assert code == -signal.SIGTERM, (code, proc.stdout.read().decode() if proc.stdout else "")
    return took


def _log(proc: subprocess.Popen) -> str:
    """What the process wrote (it has exited), its pipe closed."""
    assert proc.stdout is not None
    with proc.stdout:
        return proc.stdout.read().decode()


def _batched_statements(base: str) -> float:
    text = httpx.get(f"{base}/metrics").text
    return next(float(line.split()[1]) for line in text.splitlines()
                if line.startswith("branchpoint_db_batched_statements_total "))


def test_shutdown_finishes_what_it_can_and_interrupts_the_rest(fresh_database_url, upstream_url, upstream, tmp_path):
    quick, never = threading.Event(), threading.Event()
    upstream.enqueue(
        Reply(kind="stream", pieces=["Hel", "lo", " there"], gate=never, gate_after=2),  # stalls after "Hel"
        Reply(content="too late", hold=never),
        Reply(kind="stream", pieces=["Hel", "lo", " there"], gate=never, gate_after=2),  # (passed through)
        Reply(content="too late", hold=never),  # (passed through)
        Reply(kind="stream", pieces=["Hel", "lo", " there"], gate=never, gate_after=2),  # (a Responses call)
        Reply(content="in time", hold=quick),
    )
    answers: dict[str, Any] = {}
    grace = 4.0  # (room for the quick one's outcome on a loaded machine, Citus included)
    with _serving(fresh_database_url, upstream_url, tmp_path, grace, never) as (proc, base):
        calls = (("sd-stream", True), ("sd-slow", False), ("pass-stream", True), ("pass-slow", False),
                 ("resp-stream", True), ("sd-quick", False))
        threads = _in_threads(base, calls, answers, upstream)
        stopped = time.monotonic()
        os.killpg(proc.pid, signal.SIGTERM)
        _stops_listening(base)  # the shutdown has begun ...
        quick.set()  # ... and this one answers within the grace
        for t in threads:
            t.join(20)
        took = _exits(proc, stopped, 20)
        assert took >= grace, took  # the process ends once the grace is over (calls were still held)

    db = Db(fresh_database_url)

    def node(cid: str) -> Any:
        return db.fetchrow("SELECT id, status, error FROM nodes WHERE conversation_id = $1", cid)

    status, node_id, text = answers["sd-quick"]
    assert status == 200 and json.loads(text)["choices"][0]["message"]["content"] == "in time"
    assert node("sd-quick")["status"] == "success"

    status, node_id, text = answers["sd-slow"]
    assert status == 503, text
    error = json.loads(text)["error"]
    assert error["code"] == "interrupted" and set(error) == {"message", "type", "param", "code"}
    stored = node("sd-slow")
    assert str(stored["id"]) == node_id and stored["status"] == "failed" and stored["error"]["code"] == "interrupted"

    status, node_id, text = answers["sd-stream"]
    assert status == 200
    events = [line.removeprefix("data: ") for line in text.split("\n") if line.startswith("data: ")]
    assert json.loads(events[1])["choices"][0]["delta"]["content"] == "Hel"  # relayed before the stop
    assert json.loads(events[-1])["error"]["code"] == "interrupted" and "[DONE]" not in events
    stored = node("sd-stream")
    assert str(stored["id"]) == node_id and stored["status"] == "failed" and stored["error"]["code"] == "interrupted"

    # a Responses stream ends with its own failure events
    status, node_id, text = answers["resp-stream"]
    data = [json.loads(line.removeprefix("data: ")) for line in text.split("\n") if line.startswith("data: ")]
    assert status == 200 and any(d["type"] == "response.output_text.delta" and d["delta"] == "Hel" for d in data)
    failed = next(d for d in data if d["type"] == "response.failed")
    assert failed["response"]["error"]["code"] == "interrupted" and data[-1]["type"] == "error", text
    stored = node("resp-stream")
    assert str(stored["id"]) == node_id and stored["status"] == "failed" and stored["error"]["code"] == "interrupted"

    # calls passed through end the same way, with nothing stored
    status, node_id, text = answers["pass-slow"]
    assert status == 503 and node_id is None and json.loads(text)["error"]["code"] == "interrupted", text
    status, node_id, text = answers["pass-stream"]
    events = [line.removeprefix("data: ") for line in text.split("\n") if line.startswith("data: ")]
    assert status == 200 and json.loads(events[1])["choices"][0]["delta"]["content"] == "Hel"
    assert json.loads(events[-1])["error"]["code"] == "interrupted", text
    assert db.fetchval("SELECT count(*) FROM nodes") == 4

    # nothing is left holding a conversation: the next process finds them free
    assert db.fetchval("SELECT count(*) FROM conversations WHERE lease_node_id IS NOT NULL") == 0
    assert db.fetchval("SELECT count(*) FROM nodes WHERE status = 'pending'") == 0
    log = _log(proc)
    assert "Traceback" not in log and "Exception in ASGI application" not in log, log


def test_any_request_the_shutdown_cuts_is_answered_503(fresh_database_url, upstream_url, upstream, tmp_path):
    """Not only chat calls: an admin compaction waiting on its summariser is answered 503
    ``interrupted`` (OpenAI-shaped) when the grace runs out, not with the ASGI server's bare 500."""
    never = threading.Event()
    answer: dict[str, Any] = {}
    with _serving(fresh_database_url, upstream_url, tmp_path, 1, never) as (proc, base):
        with httpx.Client(base_url=base, timeout=30, headers={"Authorization": "Bearer sk-shutdown"}) as http:
            for n in range(4):
                http.post("/v1/chat/completions", headers={"X-Conversation-Id": "sd-admin"},
                          json={"model": MODEL, "messages": [user(f"question {n} " + "words " * 50)]}).raise_for_status()
            head = http.get("/admin/conversations/sd-admin").json()["head_node_id"]
        upstream.enqueue_summary(Reply(content="a summary", hold=never))

        def compact() -> None:
            with httpx.Client(base_url=base, timeout=30, headers={"Authorization": "Bearer sk-shutdown"}) as http:
                r = http.post("/admin/conversations/sd-admin/compact")
                answer["compact"] = (r.status_code, r.text)

        thread = threading.Thread(target=compact)
        thread.start()
        upstream.wait_for(5)  # the four turns, then the summariser's request
        stopped = time.monotonic()
        os.killpg(proc.pid, signal.SIGTERM)
        thread.join(20)
        assert _exits(proc, stopped, 20) >= 1, "the compaction was cut before the grace ran out"
    status, text = answer["compact"]
    assert status == 503, text
    assert json.loads(text)["error"]["code"] == "interrupted"
    db = Db(fresh_database_url)
    assert str(db.fetchval("SELECT head_node_id FROM conversations WHERE id = 'sd-admin'")) == head  # nothing compacted
    assert db.fetchval("SELECT count(*) FROM nodes WHERE kind = 'compaction'") == 0
    log = _log(proc)
    assert "Traceback" not in log, log


def test_an_answer_being_stored_when_the_grace_runs_out_still_reaches_its_client(
        fresh_database_url, upstream_url, upstream, tmp_path):
    """The grace runs out while the answers' nodes are being stored (their finishes wait for a row
    lock): the clients get their answers -- a 503 would make their SDKs ask again, with the answer
    already stored -- and the answers are stored before the process exits."""
    answered = threading.Event()
    upstream.enqueue(Reply(content="stored late", hold=answered),
                     Reply(kind="stream", pieces=["stored", " late"], gate=answered, gate_after=1))
    answers: dict[str, Any] = {}
    with _serving(fresh_database_url, upstream_url, tmp_path, 1, answered) as (proc, base):
        # (once the upstream has a call, its start is stored and its conversation row free again)
        threads = _in_threads(base, (("sd-store", False), ("sd-store-stream", True)), answers, upstream)
        batched = _batched_statements(base)
        with RowLocks(fresh_database_url, ["sd-store", "sd-store-stream"]) as locks:
            answered.set()  # the upstream answers; storing them waits for the locks
            db = Db(fresh_database_url)
            deadline = time.monotonic() + 10
            # both finishes sent: two statements waiting for the locks, or one batch carrying both
            # (docs/architecture.md#batched-round-trips)
            while not ((waiting := db.fetchval("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                               "AND wait_event_type = 'Lock'")) >= 2
                       or (waiting == 1 and _batched_statements(base) - batched >= 2)):
                assert time.monotonic() < deadline, "the finishes never waited for the locks"
                time.sleep(0.05)
            stopped = time.monotonic()
            os.killpg(proc.pid, signal.SIGTERM)
            for thread in threads:
                thread.join(20)
            locks.release()  # now the stores in the background go through
        _exits(proc, stopped, 30)

    status, _, text = answers["sd-store"]
    assert status == 200 and json.loads(text)["choices"][0]["message"]["content"] == "stored late", text
    status, _, text = answers["sd-store-stream"]
    assert status == 200 and text.rstrip().endswith("data: [DONE]"), text
    rows = db.fetch("SELECT conversation_id, status, received FROM nodes ORDER BY conversation_id")
    assert [(r["conversation_id"], r["status"]) for r in rows] == [("sd-store", "success"), ("sd-store-stream", "success")]
    assert all(r["received"][0]["content"] == "stored late" for r in rows)
    assert db.fetchval("SELECT count(*) FROM conversations WHERE lease_node_id IS NOT NULL") == 0
    log = _log(proc)
    assert "Traceback" not in log, log


def test_an_outcome_waiting_for_the_database_holds_the_shutdown_no_longer_than_the_grace(
        own_server, upstream_url, upstream, tmp_path):
    """A call answered while the database is away (its outcome to be stored once it is back) when
    SIGTERM comes: the process waits for it within what is left of the grace, then exits, and logs
    an error naming the node whose outcome it abandons -- left pending, its lease lets the reaper
    finish it. It waited 2 s and then 30 s more whatever the grace (32 s, past an orchestrator's
    kill timeout), and dropped the outcome without a word."""
    held = threading.Event()
    upstream.enqueue(Reply(content="answered in the outage", hold=held))
    answers: dict[str, Any] = {}
    with _serving(own_server.url, upstream_url, tmp_path, 3, held) as (proc, base):
        (thread,) = _in_threads(base, [("sd-outage", False)], answers, upstream)
        own_server.stop()  # the outage begins
        held.set()
        thread.join(30)
        status, node_id, text = answers["sd-outage"]
        assert status == 200, text  # the client has its answer; its outcome waits for the database
        stopped = time.monotonic()
        os.killpg(proc.pid, signal.SIGTERM)
        _exits(proc, stopped, 15)
    log = _log(proc)
    abandoned = [json.loads(line) for line in log.splitlines()
                 if line.startswith("{") and "could not be stored before the process exited" in line]
    assert [(entry["level"], entry["node_id"]) for entry in abandoned] == [("error", node_id)], log
    own_server.start()
    node = Db(own_server.url).node(node_id)
    assert node["status"] == "pending" and node["lease_until"] is not None  # (the reaper's, once its lease runs out)


def test_a_call_stopped_while_starting_is_answered_and_leaves_nothing_behind(
        fresh_database_url, upstream_url, upstream, tmp_path):
    """The grace runs out while a call's start waits for its conversation's row (another session
    holds it): the client gets 503 ``interrupted`` -- and the start, which commits once the row is
    free, after the client was answered, is released at once (its node reaped as interrupted), not
    left pending with the conversation leased until the reaper's turn."""
    never = threading.Event()
    answers: dict[str, Any] = {}
    with _serving(fresh_database_url, upstream_url, tmp_path, 1, never) as (proc, base):
        assert _chat(base, "sd-start", False)[0] == 200  # the conversation exists
        with RowLocks(fresh_database_url, ["sd-start"]) as locks:
            thread = threading.Thread(target=lambda: answers.__setitem__("sd-start", _chat(base, "sd-start", False)))
            thread.start()
            db = Db(fresh_database_url)
            deadline = time.monotonic() + 10
            while db.fetchval("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                              "AND wait_event_type = 'Lock'") < 1:
                assert time.monotonic() < deadline, "the start never waited for the lock"
                time.sleep(0.05)
            stopped = time.monotonic()
            os.killpg(proc.pid, signal.SIGTERM)
            thread.join(20)
            locks.release()
        _exits(proc, stopped, 10)
    status, _, text = answers["sd-start"]
    assert status == 503 and json.loads(text)["error"]["code"] == "interrupted", text
    assert db.fetchval("SELECT count(*) FROM nodes WHERE status = 'pending'") == 0
    assert db.fetchval("SELECT count(*) FROM nodes WHERE error->>'code' = 'interrupted'") == 1
    assert db.fetchval("SELECT count(*) FROM conversations WHERE lease_node_id IS NOT NULL") == 0
    assert len(upstream.chat_requests) == 1  # the stopped call never reached the upstream
    log = _log(proc)
    assert "Traceback" not in log, log


def test_workers_refuse_new_connections_from_the_signal_on(fresh_database_url, upstream_url, upstream, tmp_path):
    """`serve --workers 2` (compose.yaml runs it; docker stop signals the parent only): the call in
    flight is interrupted as with one process, and new connections are refused from the signal on
    -- the parent kept its copy of the listening socket open, and they hung until the grace ran out."""
    never = threading.Event()
    upstream.enqueue(Reply(content="too late", hold=never))
    answers: dict[str, Any] = {}
    with _serving(fresh_database_url, upstream_url, tmp_path, 6.0, never, workers=2) as (proc, base):
        (thread,) = _in_threads(base, [("w-slow", False)], answers, upstream)
        stopped = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)
        _stops_listening(base, timeout=3.0)
        thread.join(20)
        assert proc.wait(20) is not None and time.monotonic() - stopped < 15
    status, _, body = answers["w-slow"]
    assert status == 503 and json.loads(body)["error"]["code"] == "interrupted", body
