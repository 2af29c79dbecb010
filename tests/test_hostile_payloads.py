"""Payloads that are valid JSON but hostile to the proxy's own handling of them: answers and
requests nested hundreds of levels deep with a NUL inside (which the database cannot hold as it
is), odd token counts in an upstream's usage, and many large bodies at once (the memory they may
hold)."""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from .conftest import make_settings, serve_proxy, spawn_proxy, wait_for
from .fakes import Reply
from .helpers import MODEL, user


def nested(depth: int, leaf: Any = "a\u0000b") -> Any:
    value: Any = leaf
    for _ in range(depth):
        value = [value]
    return value


def deep_json(depth: int, leaf: str = "a\u0000b") -> bytes:
    """``nested(depth, leaf)`` as JSON, written without recursion (json.dumps would hit the limit)."""
    return b"[" * depth + json.dumps(leaf).encode() + b"]" * depth


def unwrap(value: Any) -> tuple[int, Any]:
    """(depth, leaf) of ``nested``'s shape, without recursion (== on it would recurse)."""
    depth = 0
    while isinstance(value, list) and len(value) == 1:
        value, depth = value[0], depth + 1
    return depth, value


@contextlib.contextmanager
def _recursion_room(depth: int) -> Iterator[None]:
    """Room for ``depth`` more levels of recursion than the test stands at, for the test's own
    reading of a deep answer (json's decoder and ``repr`` recurse): a test run in a pytest-xdist
    worker starts some 50 levels deeper than one run by pytest alone. The limit is the process's
    -- the proxy's, served from a thread, too -- so it is raised only while no call is made."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, len(inspect.stack(0)) + depth + 200))
    try:
        yield
    finally:
        sys.setrecursionlimit(limit)


_DEEP = "__deep__"


def encode(body: dict[str, Any], deep: bytes = b"") -> bytes:
    """``body`` as JSON, its string ``"__deep__"`` replaced by ``deep``."""
    return json.dumps(body).encode().replace(json.dumps(_DEEP).encode(), deep)


def _post(proxy: Any, key: str, cid: str, body: dict[str, Any] | bytes, path: str = "/v1/chat/completions") -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(proxy.url + path, content=content, timeout=30,
                      headers={"Authorization": f"Bearer {key}", "content-type": "application/json",
                               "X-Conversation-Id": cid})


# -- 1. an answer the client received is always stored --------------------------------------------

@pytest.mark.parametrize("stream", [False, True])
def test_a_deeply_nested_answer_with_a_nul_is_stored_and_frees_the_conversation(proxy, upstream, key, cid, stream):
    deep = nested(600)
    if stream:
        upstream.enqueue(Reply(kind="stream", content="deep\u0000answer"))
    else:
        upstream.enqueue(Reply(content="deep answer", extra_message={"extra": deep}))
    r = _post(proxy, key, cid, {"model": MODEL, "messages": [user("q")], "stream": stream})
    assert r.status_code == 200, r.text[:300]
    node_id = r.headers["x-node-id"]
    node = proxy.http(key).get(f"/admin/nodes/{node_id}").json()
    assert node["status"] == "success", node.get("error")
    if not stream:
        assert unwrap(node["received"][0]["extra"]) == (600, "a\u0000b")
    # the conversation is free at once, and the answer is the next call's context
    r2 = _post(proxy, key, cid, {"model": MODEL, "messages": [user("next")]})
    assert r2.status_code == 200, r2.text[:300]
    assert r2.headers["x-parent-node-id"] == node_id
    assert upstream.last.messages[1]["content"] == ("deep\u0000answer" if stream else "deep answer")


# objects shaped like the storage's own mark for what jsonb cannot hold: a client's or an
# upstream's, they are theirs -- stored and given back as they were, never read as a mark
LOOKALIKES = [{"$branchpoint:json": "!!!notbase64"}, {"$branchpoint:json": "IlJFUExBQ0VEIg=="},
              {"$branchpoint:json": 7}, {"$branchpoint:json": "IlJFUExBQ0VEIg==", "other": 1}]


@pytest.mark.parametrize("lookalike", LOOKALIKES)
def test_objects_shaped_like_the_storage_mark_come_back_as_they_were_sent(proxy, upstream, key, cid, lookalike):
    upstream.enqueue(Reply(content="a1", extra_message={"x_extra": lookalike}))
    first = {**user("q1"), "metadata_x": lookalike}
    r = _post(proxy, key, cid, {"model": MODEL, "messages": [first], "metadata": {"tag": lookalike}})
    assert r.status_code == 200, r.text[:300]
    node_id = r.headers["x-node-id"]
    http = proxy.http(key)
    node = http.get(f"/admin/nodes/{node_id}").json()
    assert node["sent"][0]["metadata_x"] == lookalike and node["received"][0]["x_extra"] == lookalike
    assert http.get(f"/admin/conversations/{cid}/path").status_code == 200
    assert upstream.last.body["metadata"] == {"tag": lookalike}
    replayed = json.loads(http.get(f"/admin/nodes/{node_id}/request").content)
    assert replayed["messages"][0]["metadata_x"] == lookalike and replayed["metadata"] == {"tag": lookalike}
    r2 = _post(proxy, key, cid, {"model": MODEL, "messages": [user("q2")]})
    assert r2.status_code == 200, r2.text[:300]
    sent = upstream.last.body
    assert sent["messages"][0]["metadata_x"] == lookalike


def test_a_lookalike_stored_before_lookalikes_were_marked_reads_as_itself(proxy, upstream, key, cid, db):
    """A row written before such objects were marked holds one as it is: it reads as what it
    is, and the conversation goes on (it used to fail every read of the path, and lock it)."""
    r = _post(proxy, key, cid, {"model": MODEL, "messages": [user("q1")]})
    node_id = r.headers["x-node-id"]
    db.fetch("UPDATE nodes SET sent = jsonb_set(sent, '{0,metadata_x}', '{\"$branchpoint:json\": \"!!!\"}') "
             "WHERE id = $1", uuid.UUID(node_id))
    assert proxy.http(key).get(f"/admin/nodes/{node_id}").json()["sent"][0]["metadata_x"] == {"$branchpoint:json": "!!!"}
    r2 = _post(proxy, key, cid, {"model": MODEL, "messages": [user("q2")]})
    assert r2.status_code == 200, r2.text[:300]
    assert upstream.last.messages[0]["metadata_x"] == {"$branchpoint:json": "!!!"}


def test_the_shield_is_depth_proof():
    """The NUL shielding of jsonb values walks without recursion, both ways."""
    from storage.database import _shield, _unshield

    for depth in (600, 5000, 50_000):
        shielded = _shield({"k": nested(depth), "n": nested(depth, "x")})
        assert unwrap(shielded["n"]) == (depth, "x")
        d, leaf = unwrap(shielded["k"])
        assert d == depth and isinstance(leaf, dict)
        back = _unshield(shielded)
        assert unwrap(back["k"]) == (depth, "a\u0000b") and unwrap(back["n"]) == (depth, "x")
    assert _unshield(_shield({"k\u0000": 1, "x": [{"a\u0000": [2]}]})) == {"k\u0000": 1, "x": [{"a\u0000": [2]}]}


def test_a_permanent_refusal_of_a_finish_fails_the_node_at_once_and_frees_the_conversation(
        fresh_database_url, upstream_url, upstream, key, cid, monkeypatch):
    """A storage error that is not the database being away is not retried as an outage: the node
    is failed right away (its lease released), so the conversation is not locked for
    ``lease_seconds``."""
    from storage import StorageError, TreeStore

    real = TreeStore.finish_call
    refused = {"n": 0}

    async def finish_call(self: Any, tree_id: Any, node_id: Any, finish: Any, **kw: Any) -> Any:
        if finish.outcome.value == "success":  # refused whenever it comes
            refused["n"] += 1
            raise StorageError("database error: ProgramLimitExceededError: too big")
        return await real(self, tree_id, node_id, finish, **kw)

    monkeypatch.setattr(TreeStore, "finish_call", finish_call)
    with serve_proxy(make_settings(fresh_database_url, upstream_url, server={"lease_seconds": 60.0})) as proxy:
        r = _post(proxy, key, cid, {"model": MODEL, "messages": [user("q")]})
        assert r.status_code == 200
        node_id = r.headers["x-node-id"]
        node = wait_for(lambda: (n := proxy.http(key).get(f"/admin/nodes/{node_id}").json())["status"] != "pending" and n,
                        timeout=5, what="the node finished")
        assert node["status"] == "failed" and node["outcome"] == "transient"
        assert node["error"]["code"] == "storage_refused" and refused["n"] == 1  # (not retried)
        r2 = _post(proxy, key, cid, {"model": MODEL, "messages": [user("again")]})
        assert r2.status_code == 200, r2.text[:300]  # (not 409 for lease_seconds)
        # the failed node's question stays in context (the failure table's transient)
        assert r2.headers["x-parent-node-id"] == node_id
        assert [m["content"] for m in upstream.last.messages] == ["q", "again"]


# -- 2. odd usage from an upstream -----------------------------------------------------------------

ODD_USAGE = [
    {"prompt_tokens": 3, "completion_tokens": -1, "total_tokens": 2},
    {"prompt_tokens": 3, "completion_tokens": "seven", "total_tokens": "x"},
    {"prompt_tokens": 1e40, "completion_tokens": 2, "total_tokens": 1e40},
    {"prompt_tokens": 10**30, "completion_tokens": True, "total_tokens": None},
    {"prompt_tokens": {"a": 1}, "completion_tokens": [1], "total_tokens": 3},
]


def _tokens(proxy: Any) -> dict[str, float]:
    text = httpx.get(proxy.url + "/metrics", timeout=10).text
    out = {}
    for line in text.splitlines():
        if line.startswith("branchpoint_tokens_total{"):
            direction = line.split('direction="')[1].split('"')[0]
            out[direction] = float(line.rsplit(" ", 1)[1])
    return out


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("usage", ODD_USAGE, ids=[str(i) for i in range(len(ODD_USAGE))])
def test_odd_usage_is_ignored_and_the_answer_comes_back_with_its_node(proxy, upstream, key, cid, usage, stream):
    before = _tokens(proxy)
    upstream.enqueue(Reply(kind="stream" if stream else "json", content="fine", usage=usage))
    body = {"model": MODEL, "messages": [user("q")], "stream": stream}
    r = _post(proxy, key, cid, body)
    assert r.status_code == 200, r.text[:300]
    assert "x-node-id" in r.headers
    if stream:
        assert r.text.rstrip().endswith("data: [DONE]"), r.text[-300:]
        assert '"error"' not in r.text
    else:
        assert r.json()["choices"][0]["message"]["content"] == "fine"
    node = proxy.http(key).get(f"/admin/nodes/{r.headers['x-node-id']}").json()
    assert node["status"] == "success"
    after = _tokens(proxy)
    for direction in ("in", "out"):
        grown = after.get(direction, 0) - before.get(direction, 0)
        assert 0 <= grown <= 10**12, (direction, grown)
    r2 = _post(proxy, key, cid, {"model": MODEL, "messages": [user("next")]})
    assert r2.status_code == 200 and r2.headers["x-parent-node-id"] == r.headers["x-node-id"]


ODD_DETAILS = [
    {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15, "prompt_tokens_details": 3},
    {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15, "completion_tokens_details": "x"},
    {"prompt_tokens": 10, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": "all"}},
]


def _in_responses_terms(usage: dict[str, Any]) -> dict[str, Any]:
    return {k.replace("prompt_", "input_").replace("completion_", "output_"): v for k, v in usage.items()}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("usage", [*ODD_USAGE, *ODD_DETAILS], ids=[str(i) for i in range(len(ODD_USAGE) + len(ODD_DETAILS))])
def test_odd_usage_through_a_translation_fails_no_call(native, upstream, key, cid, usage, stream):
    """The same through a translation -- a Responses client over a chat upstream, a chat client
    over a Responses one (the usage in its terms): the answer comes back, its node is stored, the
    conversation is free for the next call. (A text count failed the call, 500; streamed, its node
    stayed pending, its lease renewed for as long as the process lived: every later call 409.)"""
    client = native.openai(key, conversation=cid)
    upstream.enqueue(Reply(kind="stream" if stream else "json", content="fine", usage=usage))
    if stream:
        events = list(client.responses.create(model=MODEL, input="q", stream=True))
        assert events[-1].type == "response.completed", events[-1]
        assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "fine"
    else:
        assert client.responses.create(model=MODEL, input="q").output_text == "fine"
    upstream.enqueue(Reply(content="fine too", usage=_in_responses_terms(usage)))
    if stream:
        chunks = client.chat.completions.create(model="native-1", messages=[user("again")], stream=True,
                                                stream_options={"include_usage": True})
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "fine too"
    else:
        assert client.chat.completions.create(model="native-1", messages=[user("again")]).choices[0].message.content \
            == "fine too"
    nodes = native.http(key).get(f"/admin/conversations/{cid}/tree").json()["data"]
    assert [n["status"] for n in nodes] == ["success", "success"]
    assert client.chat.completions.create(model=MODEL, messages=[user("next")]).choices[0].message.content


def test_a_stream_whose_usage_cannot_be_read_still_finishes_its_node(native, upstream, key, cid, monkeypatch):
    """Whatever a stream's translation cannot read at its end, its node is finished -- failed, as
    an answer that cannot be read is -- and the conversation is free: a usage that raised there left
    the node pending and its lease renewed for as long as the process lived (every later call 409)."""
    from proxy.dialects.responses.stream import FromChat

    def broken(self: Any) -> Any:
        raise ValueError("unreadable usage")

    monkeypatch.setattr(FromChat, "usage", property(broken))
    client = native.openai(key, conversation=cid)
    with pytest.raises(openai.APIConnectionError):  # (its last event cannot be written either)
        list(client.responses.create(model=MODEL, input="q", stream=True))
    (node,) = native.http(key).get(f"/admin/conversations/{cid}/tree").json()["data"]
    assert node["status"] == "failed"
    monkeypatch.undo()
    assert client.responses.create(model=MODEL, input="next").output_text


# -- 3. a client's request nested deeply, with a NUL inside --------------------------------------

def _deep_request(where: str, deep: bytes) -> tuple[str, bytes]:
    if where == "content":
        body = {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "text", "text": "x", "deep": _DEEP}]}]}
    elif where == "params":
        body = {"model": MODEL, "messages": [user("q")], "metadata": {"deep": _DEEP}}
    else:
        return "/v1/responses", encode(
            {"model": MODEL, "input": [{"role": "user", "content": [{"type": "input_text", "text": "x", "deep": _DEEP}]}]},
            deep)
    return "/v1/chat/completions", encode(body, deep)


@pytest.mark.parametrize("depth", [600, 800, 950])
@pytest.mark.parametrize("where", ["content", "params", "responses"])
def test_a_deeply_nested_request_with_a_nul_is_stored_like_one_without(proxy, upstream, key, cid, depth, where, caplog):
    """What the body parser accepts is stored losslessly, NUL or not, however deep; deeper is its
    400 (below). Nothing of the message reaches the logs."""
    path, body = _deep_request(where, deep_json(depth, "s3cret-text\u0000"))
    with caplog.at_level(logging.DEBUG):
        r = _post(proxy, key, cid, body, path)
        assert r.status_code == 200, r.text[:300]
        got = proxy.http(key).get(f"/admin/nodes/{r.headers['x-node-id']}")
        with _recursion_room(depth):  # (the test's own reading only: the proxy keeps the default limit)
            node = got.json()
        stored = node["params"]["metadata"]["deep"] if where == "params" else node["sent"][0]["content"][0]["deep"]
        assert unwrap(stored) == (depth, "s3cret-text\u0000")
        # the conversation goes on, the deep item in its context
        assert _post(proxy, key, cid, {"model": MODEL, "messages": [user("next")]}).status_code == 200
        if where == "content":  # (a Responses item's extra field does not survive the translation to chat)
            with _recursion_room(depth):
                sent = upstream.last.body["messages"][0]["content"][0]["deep"]
            assert unwrap(sent) == (depth, "s3cret-text\u0000")
    assert "s3cret" not in caplog.text


@pytest.mark.parametrize("where", ["content", "params", "responses"])
def test_a_request_deeper_than_the_parser_takes_is_a_400(proxy, key, cid, where):
    path, body = _deep_request(where, deep_json(1000, "s3cret-text\u0000"))
    r = _post(proxy, key, cid, body, path)
    assert r.status_code == 400, r.text[:300]
    error = r.json()["error"]
    assert error["code"] == "invalid_request" and "nested too deeply" in error["message"]


@pytest.mark.parametrize(("method", "path"), [
    ("POST", "/v1/conversations"), ("POST", "/v1/conversations/{cid}"), ("POST", "/v1/conversations/{cid}/items"),
    ("PUT", "/admin/conversations/{cid}/head"), ("POST", "/admin/conversations/{cid}/switch"),
    ("POST", "/admin/conversations/{cid}/fork"),
])
def test_a_body_deeper_than_the_parser_takes_is_a_400_on_every_route(proxy, key, cid, method, path):
    """(the model routes say it themselves; every other route that reads a JSON body too)"""
    body = b'{"metadata": ' + b"[" * 1000 + b"1" + b"]" * 1000 + b"}"
    for auth in ({"Authorization": f"Bearer {key}"}, {}):
        r = httpx.request(method, f"{proxy.url}{path.format(cid=cid)}", content=body, timeout=30,
                          headers={"content-type": "application/json", **auth})
        assert r.status_code in (400, 401), (auth, r.status_code, r.text[:300])
        if r.status_code == 400:
            assert "nested too deeply" in r.json()["error"]["message"]


def test_an_import_nested_too_deeply_is_a_400(proxy, key, cid):
    line = {"id": "0190b6b0-0000-7000-8000-000000000001", "kind": "turn", "created_at": "2026-01-01T00:00:00Z",
            "sent": [{"role": "user", "content": "x", "deep": _DEEP}], "head": True}
    r = httpx.post(f"{proxy.url}/admin/conversations/{cid}/import", content=encode(line, deep_json(5000)) + b"\n",
                   headers={"Authorization": f"Bearer {key}"}, timeout=30)
    assert r.status_code == 400, r.text[:300]
    assert "nested too deeply" in r.json()["error"]["message"]


# -- 4. memory: request bytes in flight are bounded across requests --------------------------------

def _rss_kb(pid: int) -> dict[str, int]:
    with open(f"/proc/{pid}/status") as f:
        return {k: int(v.split()[0]) for k, v in (line.split(":", 1) for line in f) if k in ("VmRSS", "VmHWM")}


BIG = 30 * 1024 * 1024


def _big_calls(url: str, n: int, size: int = BIG) -> list[httpx.Response]:
    """``n`` stored calls of a ``size``-byte body each, sent at once (each its own conversation)."""
    body = b'{"model": "big-model", "messages": [{"role": "user", "content": "' + b"x" * (size - 80) + b'"}]}'
    results: list[Any] = [None] * n
    start = threading.Barrier(n)

    def one(i: int) -> None:
        start.wait()
        try:
            results[i] = httpx.post(url + "/v1/chat/completions", content=body, timeout=120, headers={
                "Authorization": "Bearer sk-test-big", "content-type": "application/json",
                "X-Conversation-Id": f"big-{i}-{time.monotonic_ns()}"})
        except httpx.HTTPError as exc:
            results[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


_BIG_MODEL = '[models."big-*"]\ncontext_window = 1000000000000\nmax_output_tokens = 1000\n'


@pytest.mark.slow  # (seconds of its own: the slow CI step, .ci/slow.sh)
def test_eight_large_bodies_at_once_stay_within_the_bound_and_memory_is_given_back(
        fresh_database_url, upstream_url, upstream, tmp_path):
    """Eight 30 MB stored calls at once (each echoed back: a 30 MB answer too) to a proxy in a
    process of its own, bounded to 64 MiB of request bytes in flight: two run at once, the others
    wait and are answered 503 server_busy with Retry-After when no room came in time. Measured
    (2 cores): without the bound +1,170 MB at the peak and +510 MB still resident when idle; with
    the default 128 MiB +625..960 MB and +0 MB idle."""
    config = _BIG_MODEL + "[server]\nmax_bytes_in_flight = 67108864\n"
    proc, url = spawn_proxy(fresh_database_url, upstream_url, tmp_path, config)
    try:
        _big_calls(url, 1, 1000)
        base = _rss_kb(proc.pid)["VmRSS"]
        results = _big_calls(url, 8)
        peak = _rss_kb(proc.pid)["VmHWM"]
        idle = wait_for(lambda: (rss := _rss_kb(proc.pid)["VmRSS"]) < base + 100 * 1024 and rss, timeout=10,
                        what="memory given back")
        statuses = [r.status_code if isinstance(r, httpx.Response) else type(r).__name__ for r in results]
        print(f"\nRSS: base {base // 1024} MB, peak +{(peak - base) // 1024} MB, idle +{(idle - base) // 1024} MB;"
              f" statuses {statuses}")
        assert set(statuses) <= {200, 503} and statuses.count(200) >= 2, statuses
        for r in results:
            if r.status_code == 503:
                assert r.json()["error"]["code"] == "server_busy" and r.headers["retry-after"] == "1"
        assert peak - base < 700 * 1024, (peak - base) // 1024
        metrics = httpx.get(url + "/metrics", timeout=10).text
        assert "branchpoint_request_bytes_in_flight 0.0" in metrics
    finally:
        proc.kill()
        proc.wait()


def test_the_budget_serves_waiters_in_order_and_gives_back_what_it_granted():
    import asyncio

    from proxy.limits import SMALL_BODY, BytesBudget

    async def scenario() -> None:
        budget = BytesBudget(100 * SMALL_BODY)
        big = 60 * SMALL_BODY
        assert await budget.take(big, 1)
        first = asyncio.ensure_future(budget.take(big, 5))  # waits: 120 > 100
        await asyncio.sleep(0.01)
        assert await budget.take(SMALL_BODY, 0.01)  # small bodies are never held back
        second = asyncio.ensure_future(budget.take(10 * SMALL_BODY, 5))  # fits, but waits its turn
        await asyncio.sleep(0.01)
        assert not first.done() and not second.done()
        budget.give(big)
        assert await first and await second and budget.used == 71 * SMALL_BODY
        assert not await budget.take(big, 0.05)  # no room in time: refused, nothing kept
        cancelled = asyncio.ensure_future(budget.take(big, 5))
        await asyncio.sleep(0.01)
        cancelled.cancel()
        await asyncio.gather(cancelled, return_exceptions=True)
        assert not budget._waiters and budget.used == 71 * SMALL_BODY
        budget.give(71 * SMALL_BODY)
        assert budget.used == 0 and await budget.take(10**12, 0.01)  # alone: always

    asyncio.run(scenario())


def held(url: str) -> float:
    """The request bytes a proxy's /metrics says it holds."""
    metrics = httpx.get(url + "/metrics", timeout=10).text
    return next(float(line.split()[1]) for line in metrics.splitlines()
                if line.startswith("branchpoint_request_bytes_in_flight "))


@pytest.mark.slow  # (seconds of its own: the slow CI step, .ci/slow.sh)
def test_the_bytes_in_flight_bound_is_one_for_the_whole_process(fresh_database_url, upstream_url, upstream, key):
    """``max_bytes_in_flight`` bounds the request bytes of all of a process's requests: bytes
    held on one route leave no room on any other. Litestar builds an app's middleware once per
    route, and each built its own budget: a connection that declared a body as large as the bound
    (and sent none of it) held up only its own route -- a large request to a pass-through route
    or to the Messages API went through at once, and the gauge, which every budget set, read 0."""
    settings = make_settings(fresh_database_url, upstream_url,
                             server={"max_bytes_in_flight": 1_000_000, "max_body_bytes": 2_000_000})
    big = {"model": MODEL, "max_tokens": 5, "input": "x", "messages": [user("x" * 200_000)]}
    with serve_proxy(settings) as proxy:
        port = int(proxy.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=30) as hog:
            hog.sendall(f"POST /c/hog/v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
                        "Content-Type: application/json\r\nContent-Length: 1000000\r\n\r\n".encode())  # no body
            wait_for(lambda: held(proxy.url) == 1_000_000, what="the hog's bytes held")
            results: dict[str, httpx.Response] = {}

            def call(path: str) -> None:
                results[path] = httpx.post(proxy.url + path, json=big, timeout=60,
                                           headers={"Authorization": f"Bearer {key}"})

            others = ["/v1/embeddings", f"/c/big-{uuid.uuid4().hex[:8]}/v1/messages"]
            threads = [threading.Thread(target=call, args=(path,)) for path in others]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            for path in others:
                r = results[path]
                assert r.status_code == 503 and r.headers["retry-after"] == "1", (path, r.status_code, r.text[:200])
                error = r.json()["error"]  # (the Messages API's in Anthropic's shape)
                assert error["type"] == "overloaded_error" if "messages" in path else error["code"] == "server_busy"
            assert held(proxy.url) == 1_000_000
            assert not upstream.requests  # nothing was sent
        # the hog gone, its bytes are given back: room again
        wait_for(lambda: held(proxy.url) == 0, what="the hog's bytes given back")
        r = httpx.post(proxy.url + "/v1/embeddings", json=big, timeout=60, headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 200 and len(upstream.requests[-1].raw) > 200_000
