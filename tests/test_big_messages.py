"""Giant messages stored in a conversation (issue 27, row 10): a 30 MB paste, a huge tool result.
Through the real HTTP API: what a later call assembles from the stored path is bounded (counted
against ``max_bytes_in_flight``: 503 ``server_busy`` while only waiting for room, 413 when it can
never fit), token estimates of a giant text do not tokenise it whole, compaction copes (what the
summariser is given is cut, the giant message is summarised instead of kept raw, nothing is
summarised when the call's own items alone overflow), and a pass-through answer cut at the limit
never ends as a short 200. The proxy's memory is measured as tests/test_hostile_payloads.py does
(the peak RSS of a proxy in a process of its own)."""

from __future__ import annotations

import json
import random
import threading
import uuid
from typing import Any

import httpx
import pytest

from .conftest import Db, make_settings, serve_proxy, spawn_proxy, wait_for
from .fakes import Reply
from .helpers import user
from .test_upstream_bombs import BombUpstream

MIB = 1 << 20
TINY = "tiny-model"
# input limit 3000 tokens: hard 2700, soft 2100, summary budget 450; the summariser's room ~2400
TINY_LIMITS = {"models": {"tiny*": {"context_window": 4000, "max_output_tokens": 1000}}}
ROOMY = "roomy-model"  # never compacted: what is assembled is all there is
ROOMY_LIMITS = {"models": {"roomy*": {"context_window": 10**12, "max_output_tokens": 1000}}}


def words(n: int, seed: int = 0) -> str:
    """``n`` characters of ordinary-looking text (tokenised at a few MB/s, a token per ~5 chars)."""
    r = random.Random(seed)
    vocab = ["sales", "region", "north", "grew", "by", "12.5%", "customer", "Hanbit", "order", "the", "of", "42"]
    out: list[str] = []
    size = 0
    while size < n:
        w = r.choice(vocab)
        out.append(w)
        size += len(w) + 1
    return " ".join(out)[:n]


def post(url: str, key: str, cid: str | None, content: Any, *, model: str = TINY, parent: str | None = None,
         timeout: float = 120) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}", "content-type": "application/json"}
    if cid is not None:
        headers["X-Conversation-Id"] = cid
    if parent is not None:
        headers["X-Parent-Node-Id"] = parent
    body = json.dumps({"model": model, "messages": [user(content)]}).encode()
    return httpx.post(url + "/v1/chat/completions", content=body, headers=headers, timeout=timeout)


def size_of(recorded: Any) -> int:
    return len(json.dumps(recorded.body))


class Spy:
    """Wraps the proxy's tiktoken encoding: the longest text it was asked to tokenise."""

    def __init__(self, encoding: Any) -> None:
        self.encoding = encoding
        self.longest = 0
        self.lock = threading.Lock()

    def encode_ordinary(self, text: str) -> list[int]:
        with self.lock:
            self.longest = max(self.longest, len(text))
        return self.encoding.encode_ordinary(text)


@pytest.fixture
def tiny(fresh_database_url, upstream_url):
    with serve_proxy(make_settings(fresh_database_url, upstream_url, **TINY_LIMITS)) as p:
        yield p


# -- token estimates ----------------------------------------------------------------------------

def test_a_long_text_is_estimated_from_samples_within_a_few_percent():
    from proxy.tokens import EXACT_CHARS, TokenCounter

    counter = TokenCounter()
    counter.load()
    encoding = counter._encoding
    assert encoding is not None
    spy = Spy(encoding)
    counter._encoding = spy
    r = random.Random(3)
    texts = [words(2 * MIB), json.dumps([{"id": i, "v": r.random()} for i in range(30_000)]),
             "".join(r.choice("数据库查询结果客户公司销售额") for _ in range(200_000)),
             "The quick brown fox. " * 20_000]
    for text in texts:
        exact = len(encoding.encode_ordinary(text))
        spy.longest = 0
        estimate = counter.text(text)
        assert spy.longest <= EXACT_CHARS, spy.longest  # never tokenised whole
        assert abs(estimate - exact) <= 0.03 * exact, (estimate, exact)
        assert estimate <= 4 * len(text)  # (the bound the thresholds ask first)
    spy.longest = 0
    assert counter.text("b" * (30 * MIB)) > 0 and spy.longest <= EXACT_CHARS  # one 30 MB pre-token: not merged


def test_a_giant_message_is_never_tokenised_whole(tiny, upstream, key, cid):
    """A 3 MB message, stored and then behind every later turn of its conversation: the turns'
    estimates (and the summariser's) tokenise samples of it, never all of it."""
    from proxy.tokens import EXACT_CHARS

    tokens = tiny.runtime.tokens
    tokens.load()
    spy = Spy(tokens._encoding)
    tokens._encoding = spy
    try:
        assert post(tiny.url, key, cid, words(3 * MIB)).status_code == 200
        for i in range(2):
            assert post(tiny.url, key, cid, f"after {i}").status_code == 200
    finally:
        tokens._encoding = spy.encoding
    assert spy.longest <= EXACT_CHARS, spy.longest


# -- compaction ---------------------------------------------------------------------------------

def test_compaction_copes_with_one_giant_message(tiny, upstream, key, cid):
    """Four small turns, then a 1 MB message (about 200,000 tokens: above the model's whole input
    limit by itself): nothing is summarised for that call -- no summary could make room for it --
    and it goes to the upstream as it is (which echoes it: a 1 MB answer stored too). The next
    turn compacts: the giant question and answer are summarised although they are among the last
    ``keep_recent`` messages, the summariser is given them cut to what one of its requests takes,
    and the upstream gets a small request."""
    for i in range(4):
        assert post(tiny.url, key, cid, f"question {i}").status_code == 200
    giant = "BEGIN " + words(MIB) + " END"
    r = post(tiny.url, key, cid, giant)
    assert r.status_code == 200, r.text[:300]
    sent = next(i for i, x in enumerate(upstream.chat_requests) if size_of(x) > MIB)
    # not summarised first (the background compaction its answer asks for may come after it)
    assert not any(upstream.is_summariser(x) for x in upstream.chat_requests[:sent])
    r = post(tiny.url, key, cid, "and now?")
    assert r.status_code == 200, r.text[:300]
    asked = upstream.summariser_requests
    assert asked and all(size_of(x) < 16 * 1024 for x in asked), [size_of(x) for x in asked]  # (room ~2,400 tokens)
    text = "".join(x.text() for x in asked)
    assert "BEGIN" in text and "END" in text and "characters of this message left out for the summary" in text
    turn = upstream.last
    assert size_of(turn) < 16 * 1024, size_of(turn)
    assert turn.messages[-1]["content"] == "and now?"
    assert turn.messages[0]["content"].startswith("Summary of the earlier part")
    parent = tiny.http(key).get(f"/admin/nodes/{r.headers['x-parent-node-id']}").json()
    assert parent["kind"] == "compaction"
    # and the conversation goes on small
    assert post(tiny.url, key, cid, "more").status_code == 200 and size_of(upstream.last) < 16 * 1024


# -- what a call assembles: bounded -----------------------------------------------------------------

def test_a_call_that_could_never_fit_is_refused_and_leaves_the_conversation_usable(
        fresh_database_url, upstream_url, upstream, key, cid):
    """Bytes in flight bounded to 4 MiB: a 2.5 MB question and a 2.5 MB answer are stored (its
    usage says 20 tokens: nothing asks for a compaction). The next call would assemble 5 MB -- it
    can never fit: 413 payload_too_large before anything is sent, its node failed as invalid (the
    head stays), the conversation not left busy (the call after it is refused the same way, not
    409). Moving the head past the large messages makes it usable again."""
    settings = make_settings(fresh_database_url, upstream_url, server={"max_bytes_in_flight": 4 * MIB}, **TINY_LIMITS)
    with serve_proxy(settings) as proxy:
        upstream.enqueue(Reply(content=words(2_500_000, seed=1), usage={"prompt_tokens": 10, "completion_tokens": 10}))
        r = post(proxy.url, key, cid, words(2_500_000))
        assert r.status_code == 200, r.text[:300]
        head = r.headers["x-node-id"]
        turns = len(upstream.turn_requests)
        for _ in range(2):
            r = post(proxy.url, key, cid, "next")
            assert r.status_code == 413, r.text[:300]
            error = r.json()["error"]
            assert error["code"] == "payload_too_large" and "max_bytes_in_flight" in error["message"]
            node = proxy.db.node(r.headers["x-node-id"])
            assert node["status"] == "failed" and node["outcome"] == "invalid"
            assert proxy.db.head(cid) == head
        assert len(upstream.turn_requests) == turns  # nothing was sent
        assert proxy.http(key).put(f"/admin/conversations/{cid}/head", json={"node_id": None}).status_code == 200
        r = post(proxy.url, key, cid, "again")
        assert r.status_code == 200, r.text[:300]
        metrics = httpx.get(proxy.url + "/metrics", timeout=10).text
        assert "branchpoint_request_bytes_in_flight 0.0" in metrics


@pytest.mark.slow  # (seconds of its own: the slow CI step, .ci/slow.sh)
def test_a_call_waiting_for_room_to_assemble_is_answered_server_busy(
        fresh_database_url, upstream_url, upstream):
    """Bytes in flight bounded to 8 MiB, two conversations of a model never compacted, each with a
    5 MB message stored. While a call in the first holds its 5 MB path (its upstream answer held
    back), a call in the second cannot assemble its own: it waits, then is answered 503
    server_busy with Retry-After -- its node failed as transient, its conversation free again."""
    settings = make_settings(fresh_database_url, upstream_url, server={"max_bytes_in_flight": 8 * MIB}, **ROOMY_LIMITS)
    key = f"sk-test-{uuid.uuid4().hex}"
    with serve_proxy(settings) as proxy:
        for cid in ("busy-a", "busy-b"):
            upstream.enqueue(Reply(content="short"))
            assert post(proxy.url, key, cid, words(5 * MIB), model=ROOMY).status_code == 200
        gate = threading.Event()
        upstream.enqueue(Reply(content="held", hold=gate))
        first: dict[str, Any] = {}
        t = threading.Thread(target=lambda: first.update(r=post(proxy.url, key, "busy-a", "a", model=ROOMY)))
        t.start()
        try:
            wait_for(lambda: len(upstream.turn_requests) == 3, what="the first call upstream")
            r = post(proxy.url, key, "busy-b", "b", model=ROOMY)
            assert r.status_code == 503, r.text[:300]
            assert r.json()["error"]["code"] == "server_busy" and r.headers["retry-after"] == "1"
            assert len(upstream.turn_requests) == 3  # never sent
            node = proxy.db.node(r.headers["x-node-id"])
            assert node["status"] == "failed" and node["outcome"] == "transient"
        finally:
            gate.set()
            t.join(30)
        assert first["r"].status_code == 200
        r = post(proxy.url, key, "busy-b", "b", model=ROOMY)  # room again (and no 409)
        assert r.status_code == 200, r.text[:300]


def _rss_kb(pid: int) -> dict[str, int]:
    with open(f"/proc/{pid}/status") as f:
        return {k: int(v.split()[0]) for k, v in (line.split(":", 1) for line in f) if k in ("VmRSS", "VmHWM")}


@pytest.mark.slow  # (seconds of its own: the slow CI step, .ci/slow.sh)
def test_turns_after_30_mb_messages_stay_small_in_memory(fresh_database_url, upstream_url, upstream, tmp_path):
    """Three conversations each holding a 30 MB message (and its 30 MB echo) in a proxy of its
    own; then a turn in each at once. Without bounds each turn read, tokenised and sent its 60 MB
    path (and summarised it whole); now each is compacted once -- the giant items summarised from
    a cut of them -- and the turns' peak RSS stays far below what three 60 MB requests cost.
    Measured (2 cores, the three turns' peak above the idle RSS): +3,179 MB before, +233 MB now."""
    proc, url = spawn_proxy(fresh_database_url, upstream_url, tmp_path)
    key = f"sk-test-{uuid.uuid4().hex}"
    try:
        cids = [f"giant-{i}-{uuid.uuid4().hex[:6]}" for i in range(3)]
        for cid in cids:
            for i in range(3):
                assert post(url, key, cid, f"question {i}", model="gpt-4o-mini").status_code == 200
            r = post(url, key, cid, "b" * (30 * MIB), model="gpt-4o-mini", timeout=300)
            assert r.status_code == 200, r.text[:300]
        wait_for(lambda: _rss_kb(proc.pid)["VmRSS"] < 400 * 1024, timeout=30, what="memory given back")
        with open(f"/proc/{proc.pid}/clear_refs", "w") as f:
            f.write("5")  # the peak starts again from here
        base = _rss_kb(proc.pid)["VmRSS"]
        results: list[Any] = [None] * len(cids)

        def turn(i: int) -> None:
            results[i] = post(url, key, cids[i], "and then?", model="gpt-4o-mini", timeout=300)

        threads = [threading.Thread(target=turn, args=(i,)) for i in range(len(cids))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        peak = _rss_kb(proc.pid)["VmHWM"]
        statuses = [r.status_code for r in results]
        print(f"\nRSS base {base // 1024} MB, turns' peak +{(peak - base) // 1024} MB, statuses {statuses}")
        assert statuses == [200] * len(cids), [r.text[:200] for r in results]
        assert peak - base < 600 * 1024, (peak - base) // 1024
        db = Db(fresh_database_url)
        for cid in cids:
            head = db.node(db.head(cid))
            assert head["parent_id"] is not None
            assert db.node(head["parent_id"])["kind"] == "compaction"
    finally:
        proc.kill()
        proc.wait()


# -- a pass-through answer cut at the limit ------------------------------------------------------

@pytest.fixture
def raw_upstream():
    server = BombUpstream()
    yield server
    server.close()


def _plain_head(length: int | None) -> bytes:
    lines = [b"HTTP/1.1 200 OK", b"content-type: application/json", b"connection: close"]
    if length is not None:
        lines.append(b"content-length: %d" % length)
    return b"\r\n".join(lines) + b"\r\n\r\n"


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "until-close"])
def test_a_passthrough_answer_cut_within_the_look_ahead_is_a_502(database_url, raw_upstream, declared):
    """Limit 1 MiB, a 3 MB answer that is not an event stream: read ahead, found too large before
    its status went out -- 502 upstream_response_too_large, never a short 200."""
    body = b'{"data": "' + b"x" * (3 * MIB) + b'"}'
    raw_upstream.answer(_plain_head(len(body) if declared else None), body)
    settings = make_settings(database_url, raw_upstream.url, server={"max_response_bytes": MIB})
    with serve_proxy(settings) as proxy:
        r = httpx.post(proxy.url + "/v1/chat/completions", timeout=30, headers={"Authorization": "Bearer sk-test-pass"},
                       json={"model": "m", "messages": [user("hi")]})
    assert r.status_code == 502, (r.status_code, len(r.content))
    assert r.json()["error"]["code"] == "upstream_response_too_large"


def test_a_passthrough_answer_cut_past_the_look_ahead_is_aborted(database_url, raw_upstream):
    """Limit 8 MiB, a 12 MB answer: its first 4 MiB went out with its status; the cut at 8 MiB ends
    the connection unfinished -- the client sees a broken answer, not a complete 200."""
    from proxy.bytes_relay import LOOKAHEAD

    assert LOOKAHEAD < 8 * MIB
    body = b'{"data": "' + b"x" * (12 * MIB) + b'"}'
    raw_upstream.answer(_plain_head(None), body)
    settings = make_settings(database_url, raw_upstream.url, server={"max_response_bytes": 8 * MIB})
    with serve_proxy(settings) as proxy, httpx.Client(timeout=30) as http, \
            http.stream("POST", proxy.url + "/v1/chat/completions", headers={"Authorization": "Bearer sk-test-pass"},
                        json={"model": "m"}) as r:
        assert r.status_code == 200
        got = 0
        with pytest.raises(httpx.RemoteProtocolError):
            for chunk in r.iter_raw():
                got += len(chunk)
        assert LOOKAHEAD <= got <= 8 * MIB + 65536


def test_a_passthrough_answer_within_the_limit_is_relayed_whole(database_url, raw_upstream):
    for size in (10, 3 * MIB, 6 * MIB):  # within the look-ahead, and past it
        body = b'{"data": "' + b"y" * size + b'"}'
        raw_upstream.answer(_plain_head(None), body)
        settings = make_settings(database_url, raw_upstream.url, server={"max_response_bytes": 8 * MIB})
        with serve_proxy(settings) as proxy:
            r = httpx.post(proxy.url + "/v1/chat/completions", timeout=30, headers={"Authorization": "Bearer sk-test-pass"},
                           json={"model": "m"})
        assert r.status_code == 200 and r.content == body


def test_a_request_alone_may_hold_more_than_the_bound_on_top_of_its_body():
    """The budget's 'alone' counts what the asking request holds already: its own body never makes
    it wait for itself; anyone else's does (first come, first served, as for bodies)."""
    import asyncio

    from proxy.limits import SMALL_BODY, BytesBudget

    async def scenario() -> None:
        budget = BytesBudget(100 * SMALL_BODY)
        body = 30 * SMALL_BODY
        assert await budget.take(body, 1)
        assert await budget.take(200 * SMALL_BODY, 0.01, own=body)  # alone: more than the bound, at once
        budget.give(200 * SMALL_BODY)
        assert await budget.take(body, 1)  # a second request's body
        assert not await budget.take(80 * SMALL_BODY, 0.05, own=body)  # 140 > 100, and not alone
        budget.give(body)
        assert await budget.take(80 * SMALL_BODY, 0.05, own=body) and budget.used == 110 * SMALL_BODY

    asyncio.run(scenario())
