"""Compaction (docs/behaviour.md#compaction) end to end: a small model limit, a fake upstream that also plays the
summariser, and assertions on what the upstream received after the compaction."""

import asyncio
import base64
import threading
import time
import uuid

import anthropic
import httpx
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy import tokens as tokens_module
from proxy.compaction import SUMMARY_PREFIX, split_recent
from proxy.tokens import TokenCounter, estimate_request
from storage import PathNode

from .conftest import Db, make_settings, proxy_with, serve_proxy, spawn_proxy, wait_for
from .fakes import Reply
from .helpers import say as _say
from .helpers import tool, tool_call, user

MODEL = "tiny-model"
# input limit 3000 tokens: hard 2700, soft 2100, summary budget 450, keep 4 messages raw
LIMITS = {"models": {"tiny*": {"context_window": 4000, "max_output_tokens": 1000}},
          "compaction": {"keep_recent": 4}}
FILLER = "The quarterly revenue figures for the northern region were reviewed in detail. " * 14  # ~200 tokens


def say(client, cid, *messages, parent=None):
    return _say(client, cid, *messages, parent=parent, model=MODEL)


def usage(prompt, completion=20):
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def compaction_nodes(db, cid):
    return db.fetch("SELECT * FROM nodes WHERE conversation_id = $1 AND kind = 'compaction' ORDER BY created_at", cid)


@pytest.fixture
def small(fresh_database_url, upstream_url):
    yield from proxy_with(fresh_database_url, upstream_url, **LIMITS)


def grow(p, upstream, key, cid, turns, start=0, prompt_step=300):
    """``turns`` turns whose reported usage grows by ``prompt_step`` per turn."""
    client = p.openai(key)
    heads = []
    for i in range(start, start + turns):
        upstream.enqueue(Reply(content=f"answer {i}", usage=usage(300 + prompt_step * i)))
        _, h = say(client, cid, user(f"question {i}: {FILLER[:200]}"))
        heads.append(h["x-node-id"])
    return heads


def test_background_compaction_then_the_next_request_starts_with_the_summary(small, upstream, key, cid):
    heads = grow(small, upstream, key, cid, 7)  # the 7th turn reports 2100+20 > soft (2100)
    node = wait_for(lambda: compaction_nodes(small.db, cid), what="the background compaction")[0]
    assert str(node["compacted_from"]) == heads[-1] and node["parent_id"] is None
    assert small.db.head(cid) == str(node["id"])
    summary_request = upstream.summariser_requests[0]
    assert "question 0" in summary_request.text() and "question 6" not in summary_request.text()
    say(small.openai(key), cid, user("what now?"))
    sent = upstream.last.messages
    assert sent[0]["role"] == "user" and sent[0]["content"].startswith(SUMMARY_PREFIX)
    assert "Facts so far" in sent[0]["content"]
    # then the last 4 messages raw (turns 5 and 6), then the new question; nothing older
    assert [m["content"][:10] for m in sent[1:]] == ["question 5", "answer 5", "question 6", "answer 6", "what now?"]
    assert "question 4" not in upstream.last.text()
    # the admin path starts at the compaction node
    path = small.http(key).get(f"/admin/conversations/{cid}/path").json()["data"]
    assert path[0]["id"] == str(node["id"]) and path[0]["kind"] == "compaction" and path[0]["parent_id"] is None
    assert path[0]["compacted_from"] == heads[-1]
    # nothing was deleted
    assert small.db.fetchval("SELECT count(*) FROM nodes WHERE conversation_id = $1 AND kind = 'turn'", cid) == 8


def test_background_compaction_does_not_delay_the_response(small, upstream, key, cid):
    hold = threading.Event()
    upstream.enqueue_summary(Reply(content="Facts: held summary.", hold=hold))
    try:
        grow(small, upstream, key, cid, 7)  # returns although the summariser has not answered
        wait_for(lambda: upstream.summariser_requests, what="the summariser request")
        assert compaction_nodes(small.db, cid) == []  # still summarising: the turn did not wait
    finally:
        hold.set()
    wait_for(lambda: compaction_nodes(small.db, cid), what="the compaction after release")


def test_a_head_move_during_background_compaction_wins(small, upstream, key, cid):
    hold = threading.Event()
    upstream.enqueue_summary(Reply(content="Facts: stale summary.", hold=hold))
    heads = grow(small, upstream, key, cid, 7)
    wait_for(lambda: upstream.summariser_requests, what="the summariser request")
    r = small.http(key).put(f"/admin/conversations/{cid}/head", json={"node_id": heads[2]})
    assert r.status_code == 200
    hold.set()

    def dropped():
        text = httpx.get(f"{small.url}/metrics").text
        return 'branchpoint_compactions_total{mode="soft",result="moved"} 1.0' in text

    wait_for(dropped, what="the compaction to be dropped")
    assert compaction_nodes(small.db, cid) == []  # nothing half-written
    assert small.db.head(cid) == heads[2]
    say(small.openai(key), cid, user("continue from turn 2"))
    assert "Facts: stale summary" not in upstream.last.text() and "question 2" in upstream.last.text()


def test_synchronous_compaction_above_the_hard_threshold(fresh_database_url, upstream_url, upstream, key, cid):
    settings = make_settings(fresh_database_url, upstream_url, models=LIMITS["models"],
                             compaction={"keep_recent": 2, "soft": 1.0, "hard": 0.9})
    with serve_proxy(settings) as p:
        db = Db(fresh_database_url)
        grow(p, upstream, key, cid, 5, prompt_step=500)  # last usage 2320 + 20: below hard 2700
        assert compaction_nodes(db, cid) == []
        big = user("a long pasted report: " + FILLER * 3)  # ~600 tokens more: above hard
        _, h = say(p.openai(key), cid, big)
        node = compaction_nodes(db, cid)[0]
        assert h["x-parent-node-id"] == str(node["id"])  # the parent actually used
        assert db.node(h["x-node-id"])["parent_id"] == node["id"]
        assert db.head(cid) == h["x-node-id"]
        sent = upstream.last.messages
        assert sent[0]["content"].startswith(SUMMARY_PREFIX)
        assert [m["content"][:10] for m in sent[1:3]] == ["question 4", "answer 4"]
        assert sent[-1] == big
        assert len(upstream.summariser_requests) == 1
        # the summariser was asked before the call, not after
        assert upstream.chat_requests.index(upstream.summariser_requests[0]) < upstream.chat_requests.index(upstream.last)


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_gone_during_a_synchronous_compaction_gets_no_upstream_call(fresh_database_url, upstream_url,
                                                                             upstream, key, cid, stream):
    """The client gives up while its call compacts first: the summary may still be made, but the
    call is not sent upstream for nobody -- its node fails as client_disconnected."""
    settings = make_settings(fresh_database_url, upstream_url, models=LIMITS["models"],
                             compaction={"keep_recent": 2, "soft": 1.0, "hard": 0.9})
    with serve_proxy(settings) as p:
        db = Db(fresh_database_url)
        grow(p, upstream, key, cid, 5, prompt_step=500)
        turns = len(upstream.turn_requests)
        hold = threading.Event()
        upstream.enqueue_summary(Reply(content="Facts: a summary made late.", hold=hold))
        try:
            with httpx.Client(base_url=p.url) as http, pytest.raises(httpx.ReadTimeout):
                http.post("/v1/chat/completions", timeout=0.5,
                          json={"model": MODEL, "messages": [user("a long pasted report: " + FILLER * 3)], "stream": stream},
                          headers={"Authorization": f"Bearer {key}", "X-Conversation-Id": cid})
        finally:
            hold.set()
        row = wait_for(lambda: (r := db.fetchrow("SELECT * FROM nodes WHERE conversation_id = $1 AND kind = 'turn' "
                                                 "ORDER BY created_at DESC LIMIT 1", cid)) and r["status"] != "pending" and r,
                       10, "the call's node to fail")
        assert row["status"] == "failed" and row["error"]["code"] == "client_disconnected"
        assert len(upstream.summariser_requests) == 1 and len(upstream.turn_requests) == turns


def test_a_transforms_own_compaction_never_moves_the_head(fresh_database_url, upstream_url, upstream, key, cid):
    """A side call above the hard threshold is compacted for its own request -- it hangs under the
    compaction node -- but the conversation's head stays: its next turn gets its path whole."""
    settings = make_settings(fresh_database_url, upstream_url, models=LIMITS["models"],
                             compaction={"keep_recent": 2, "soft": 1.0, "hard": 0.9})
    with serve_proxy(settings) as p:
        db = Db(fresh_database_url)
        heads = grow(p, upstream, key, cid, 5, prompt_step=500)
        raw = p.openai(key).chat.completions.with_raw_response.create(
            model=MODEL, messages=[user("turn this into a playbook: " + FILLER * 3)],
            extra_headers={"X-Conversation-Id": cid, "X-Node-Kind": "transform"})
        node = compaction_nodes(db, cid)[0]
        assert raw.headers["x-parent-node-id"] == str(node["id"])
        assert upstream.last.messages[0]["content"].startswith(SUMMARY_PREFIX)
        assert db.head(cid) == heads[-1]
        say(p.openai(key), cid, user("next"))
        sent = upstream.last.messages
        assert [m["content"][:10] for m in sent] == [*[s for i in range(5) for s in (f"question {i}", f"answer {i}")], "next"]


def test_a_failed_summarisation_changes_nothing(fresh_database_url, upstream_url, upstream, key, cid):
    settings = make_settings(fresh_database_url, upstream_url, models=LIMITS["models"],
                             compaction={"keep_recent": 2, "soft": 1.0, "hard": 0.9})
    with serve_proxy(settings) as p:
        db = Db(fresh_database_url)
        heads = grow(p, upstream, key, cid, 5, prompt_step=500)
        upstream.enqueue_summary(Reply(kind="error", status=500))
        _, h = say(p.openai(key), cid, user("big: " + FILLER * 3))
        assert compaction_nodes(db, cid) == []
        assert h["x-parent-node-id"] == heads[-1]  # the uncompacted path was used
        assert "question 0" in upstream.last.text()
        metrics = httpx.get(f"{p.url}/metrics").text
        assert 'branchpoint_compactions_total{mode="hard",result="failed"} 1.0' in metrics


def test_summary_is_held_to_its_budget(small, upstream, key, cid):
    long_summary = "Fact: the northern region grew. " * 200  # ~1400 tokens > budget 450
    upstream.enqueue_summary(Reply(content=long_summary), Reply(content=long_summary))
    grow(small, upstream, key, cid, 7)
    node = wait_for(lambda: compaction_nodes(small.db, cid), what="the compaction")[0]
    assert len(upstream.summariser_requests) == 2  # summarised, then asked to shorten
    assert "Rewrite it shorter" in upstream.summariser_requests[1].text()
    summary = node["sent"][0]["content"]
    tokens = TokenCounter()
    assert tokens.text(summary[len(SUMMARY_PREFIX):]) <= 450 and summary.endswith("[...]")
    assert node["params"]["summary_tokens"] <= 450
    # the recent items were not pushed out
    assert [m["content"][:10] for m in node["sent"][1:]] == ["question 5", "answer 5", "question 6", "answer 6"]


def test_edit_before_a_compaction_is_refused(small, upstream, key, cid):
    heads = grow(small, upstream, key, cid, 7)
    node = wait_for(lambda: compaction_nodes(small.db, cid), what="the compaction")[0]
    r = small.http(key).post("/v1/chat/completions", headers={"X-Conversation-Id": cid, "X-Parent-Node-Id": heads[1]},
                              json={"model": MODEL, "messages": [user("edit of turn 2")]})
    assert r.status_code == 409 and r.json()["error"]["code"] == "parent_before_compaction"
    assert small.db.head(cid) == str(node["id"])
    # asking again cannot help: the SDKs, which retry every 409, are told so and ask once
    assert r.headers["x-should-retry"] == "false"
    for ask in (lambda c: c.chat.completions.create(model=MODEL, messages=[user("edit")],
                                                    extra_headers={"X-Conversation-Id": cid, "X-Parent-Node-Id": heads[1]}),
                lambda c: anthropic.Anthropic(base_url=small.url, api_key=key, max_retries=2, http_client=c._client)
                .messages.create(model=MODEL, max_tokens=9, messages=[{"role": "user", "content": "edit"}],
                                 extra_headers={"X-Conversation-Id": cid, "X-Parent-Node-Id": heads[1]})):
        sent: list[str] = []
        client = openai.OpenAI(base_url=f"{small.url}/v1", api_key=key, max_retries=2, http_client=type(
            small.openai(key)._client)(event_hooks={"request": [lambda request, sent=sent: sent.append(request.url.path)]}))
        with pytest.raises((openai.ConflictError, anthropic.ConflictError)):
            ask(client)
        assert len(sent) == 1, sent
    # a parent on the current path (after the compaction) is fine
    _, h = say(small.openai(key), cid, user("next"))
    _, h2 = say(small.openai(key), cid, user("regenerated next"), parent=str(node["id"]))
    assert h2["x-parent-node-id"] == str(node["id"])


def test_continuing_from_the_answer_a_summary_replaced_hangs_under_the_summary(small, upstream, key, cid):
    """A client that names its last answer as the parent after a compaction moved the head -- the
    Responses API's previous_response_id chain (the Agents SDK's, every call), a chat client's
    X-Parent-Node-Id -- continues from the summary that stands for it; before, 409 on the next
    call after every compaction. Any other node before the summary is still refused."""
    heads = grow(small, upstream, key, cid, 7)
    node = wait_for(lambda: compaction_nodes(small.db, cid), what="the background compaction")[0]
    assert str(node["compacted_from"]) == heads[-1]
    responses = small.openai(key, conversation=cid)
    upstream.enqueue(Reply(content="after the summary"))
    nxt = responses.responses.with_raw_response.create(model=MODEL, input="what now?",
                                                       previous_response_id=f"resp_{heads[-1].replace('-', '')}")
    assert nxt.headers["x-parent-node-id"] == str(node["id"]) and small.db.head(cid) == nxt.headers["x-node-id"]
    sent = upstream.last.messages
    assert sent[0]["content"].startswith(SUMMARY_PREFIX) and sent[-1]["content"] == "what now?"
    assert not any("question 0" in str(m["content"]) for m in sent)
    _, h = say(small.openai(key), cid, user("beside it"), parent=heads[-1])  # (the same through the header)
    assert h["x-parent-node-id"] == str(node["id"])
    r = small.http(key).post("/v1/chat/completions", headers={"X-Conversation-Id": cid, "X-Parent-Node-Id": heads[-2]},
                             json={"model": MODEL, "messages": [user("an edit")]})
    assert r.status_code == 409 and r.json()["error"]["code"] == "parent_before_compaction"


def test_system_prompt_sent_only_first_survives_compaction(small, upstream, key, cid):
    system = {"role": "system", "content": "Answer in Korean."}
    upstream.enqueue(Reply(content="first", usage=usage(100)))
    say(small.openai(key), cid, system, user("hello"))
    grow(small, upstream, key, cid, 7, start=1)
    node = wait_for(lambda: compaction_nodes(small.db, cid), what="the compaction")[0]
    assert node["sent"][0] == system
    say(small.openai(key), cid, user("next"))
    assert upstream.last.messages[0] == system
    assert upstream.last.messages[1]["content"].startswith(SUMMARY_PREFIX)


def test_admin_compact_now(small, upstream, key, cid):
    grow(small, upstream, key, cid, 4)  # below every threshold
    r = small.http(key).post(f"/admin/conversations/{cid}/compact")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["compacted"] is True and body["kept_messages"] == 4 and body["compacted_messages"] == 4
    assert small.db.head(cid) == body["node_id"]
    r = small.http(key).post(f"/admin/conversations/{cid}/compact")
    assert r.json() == {"object": "compaction", "compacted": False, "reason": "nothing_to_compact"}
    metrics = small.http(key).get("/metrics").text
    assert 'branchpoint_compactions_total{mode="admin",result="ok"} 1.0' in metrics
    assert small.http(key).post(f"/admin/conversations/{cid}-none/compact").status_code == 404


def post(p, key, cid, *messages):
    """One chat call by hand (an upstream error is answered, not raised -- nor retried)."""
    return p.http(key).post("/v1/chat/completions", json={"model": MODEL, "messages": list(messages)},
                            headers={"X-Conversation-Id": cid})


def count(messages, content):
    return sum(1 for m in messages if m.get("content") == content)


@pytest.mark.parametrize("method", ["summary", "clear_tool_results"])
def test_a_head_on_a_failed_call_is_not_compacted_and_its_items_stay_for_the_retry_and_after(small, upstream, key,
                                                                                           cid, method):
    """A round of (paid-for) tool results the upstream failed: the head is on the failed node, its
    items the retry's. Compacting now would keep them raw and the retry send them again (a second
    result for one call, dropped only by the pairing check), or leave them out and lose them for a
    call that continues -- so it is refused (``head_failed``), nothing changed; the retry then
    sends the result once, and a call after a failure would still have it."""
    client = small.openai(key)
    for i in range(5):
        upstream.enqueue(Reply(content=None, tool_calls=[tool_call(f"call_{i}")]))
        say(client, cid, user(f"use tool {i}"))
        if i < 4:
            upstream.enqueue(Reply(content=f"done {i}"))
            say(client, cid, tool(f"call_{i}", f"result {i}: {FILLER}"))
    upstream.enqueue(Reply(kind="error", status=503))
    failed = post(small, key, cid, tool("call_4", "PAID-RESULT"))
    assert failed.status_code == 503 and small.db.head(cid) == failed.headers["x-node-id"]
    body = small.http(key).post(f"/admin/conversations/{cid}/compact", json={"method": method}).json()
    assert body["compacted"] is False and body["reason"] == "head_failed", body
    assert small.db.head(cid) == failed.headers["x-node-id"]
    upstream.enqueue(Reply(kind="error", status=503))
    again = post(small, key, cid, tool("call_4", "PAID-RESULT"))  # (the SDK's retry: beside the failed node)
    assert again.headers["x-parent-node-id"] == failed.headers["x-parent-node-id"]
    assert count(upstream.last.messages, "PAID-RESULT") == 1
    upstream.enqueue(Reply(content="noted"))
    post(small, key, cid, user("and then?"))  # (a call after the failure: under it, its items kept)
    sent = upstream.last.messages
    assert count(sent, "PAID-RESULT") == 1 and sent[-2:] == [tool("call_4", "PAID-RESULT"), user("and then?")]


def test_unfolding_an_opaque_compaction_for_another_provider(fresh_database_url, upstream_url, upstream, key, cid):
    settings = make_settings(fresh_database_url, upstream_url, **LIMITS, upstreams=[
        {"name": "other", "base_url": upstream_url, "models": ["tiny-other*"]},
        {"name": "fake", "base_url": upstream_url, "models": ["*"]},
    ])
    with serve_proxy(settings) as p:
        db = Db(fresh_database_url)
        grow(p, upstream, key, cid, 7)
        node = wait_for(lambda: compaction_nodes(db, cid), what="the compaction")[0]
        # as if the provider had produced it in its own native, opaque format
        db.fetch("UPDATE nodes SET params = params || '{\"format\": \"opaque\"}' WHERE id = $1", node["id"])
        say(p.openai(key), cid, user("same provider"))
        assert upstream.last.messages[0]["content"].startswith(SUMMARY_PREFIX)
        raw = p.openai(key).chat.completions.with_raw_response.create(
            model="tiny-other-1", messages=[user("another provider")], extra_headers={"X-Conversation-Id": cid})
        sent = upstream.last.messages
        assert not any(str(m.get("content", "")).startswith(SUMMARY_PREFIX) for m in sent)
        assert sent[0]["content"].startswith("question 0") and sent[-1] == user("another provider")
        # the replay of that request unfolds the same way, and matches what was sent byte for byte
        replay = p.http(key).get(f"/admin/nodes/{raw.headers['x-node-id']}/request")
        assert replay.headers["x-request-verified"] == "true"
        assert replay.json()["messages"] == sent


def test_a_tool_call_is_never_split_from_its_result():
    call = {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    items = [user("a"), {"role": "assistant", "content": "A"}, user("b"), call,
             {"role": "tool", "tool_call_id": "c1", "content": "r"}, {"role": "assistant", "content": "B"}]
    older, recent = split_recent(items, 2)  # the naive cut would start at the tool result
    assert recent[0] is call and older == items[:3]
    older, recent = split_recent(items, 6)
    assert older == []
    # a call answered only by the next call's new items stays raw even with keep_recent = 0
    older, recent = split_recent(items[:4], 0, frozenset({"c1"}))
    assert recent == [call]


def test_token_estimates_work_offline():
    counter = TokenCounter()
    assert counter.text("hello world") == 2
    assert "tiktoken" in counter.method
    fallback = TokenCounter(use_tiktoken=False)
    assert fallback.text("abcdefgh") == 2 and fallback.method == "chars/4"
    node = PathNode(id=uuid.uuid4(), parent_id=None, kind="turn", status="success", sent=[user("x")],
                    received=[{"role": "assistant", "content": "y"}],
                    usage={"prompt_tokens": 1000, "completion_tokens": 500,
                           "completion_tokens_details": {"reasoning_tokens": 400}})
    later = PathNode(id=uuid.uuid4(), parent_id=node.id, kind="turn", status="failed", sent=[user("hello world")])
    # reported usage (minus reasoning, never sent back) + only what was added since
    assert estimate_request(counter, [node, later], [user("hello world")]) == 1100 + 2 * (3 + 1 + 2)


_texts = st.text(st.characters(codec="utf-8"), max_size=300)
_contents = st.one_of(_texts, st.lists(st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": _texts}),
    st.fixed_dictionaries({"type": st.just("image_url"), "image_url": st.fixed_dictionaries({"url": _texts})}),
    st.dictionaries(st.text(max_size=5), _texts, max_size=3)), max_size=4))
_messages = st.lists(st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "tool", "system"]), "content": _contents},
    optional={"name": _texts, "tool_calls": st.lists(st.fixed_dictionaries(
        {"id": _texts, "function": st.fixed_dictionaries({"name": _texts, "arguments": _texts})}), max_size=2)}),
    max_size=4)
_COUNTERS = (TokenCounter(), TokenCounter(use_tiktoken=False))


@settings(max_examples=150, deadline=None)
@given(sent=_messages, received=_messages, new=_messages, tools=st.lists(st.dictionaries(st.text(max_size=5), _texts)),
       measured=st.booleans())
def test_the_quick_upper_bound_is_never_below_the_estimate(sent, received, new, tools, measured):
    """Calls far below the threshold skip tokenising: that shortcut must never hide a request above it."""
    usage = {"prompt_tokens": 40, "completion_tokens": 7} if measured else None
    first = PathNode(id=uuid.uuid4(), parent_id=None, kind="turn", status="success", sent=sent, received=received,
                     usage=usage)
    second = PathNode(id=uuid.uuid4(), parent_id=first.id, kind="turn", status="success", sent=new, received=received)
    for counter in _COUNTERS:
        for path in ([], [first], [first, second]):
            exact = estimate_request(counter, path, new, tools)
            assert estimate_request(counter, path, new, tools, upper_bound=True) >= exact


@pytest.fixture
def counted_texts(monkeypatch):
    """Every text the token counter tokenises: (characters, whether it ran on an event loop's thread)."""
    seen = []
    count = TokenCounter.text

    def text(self, value):
        try:
            asyncio.get_running_loop()
            on_loop = True
        except RuntimeError:
            on_loop = False
        seen.append((len(value or ""), on_loop))
        return count(self, value)

    monkeypatch.setattr(TokenCounter, "text", text)
    return seen


def test_a_big_message_is_tokenised_off_the_event_loop(fresh_database_url, upstream_url, upstream, key, cid,
                                                         counted_texts):
    """A client may send megabytes: counting them must not hold every other request of the process."""
    roomy = {"models": {"tiny*": {"context_window": 60000, "max_output_tokens": 1000}}}
    with serve_proxy(make_settings(fresh_database_url, upstream_url, **roomy)) as p:
        client = p.openai(key)
        upstream.enqueue(Reply(content="first", usage=usage(300)))
        say(client, cid, user("hello"))
        assert counted_texts == []  # far below the threshold: nothing tokenised at all
        big = FILLER * 20  # ~23,000 characters, ~4,000 tokens: its bound (4 per character) is above hard
        upstream.enqueue(Reply(content="second"))
        say(client, cid, user(big))
        assert upstream.last.messages[-1]["content"] == big
        big_counts = [on_loop for n, on_loop in counted_texts if n >= len(big)]
        assert big_counts and not any(big_counts)
        assert not compaction_nodes(Db(fresh_database_url), cid)


def test_the_summariser_counts_a_long_transcript_off_the_event_loop(small, upstream, key, cid, counted_texts,
                                                                     monkeypatch):
    monkeypatch.setattr(tokens_module, "_OFF_LOOP_CHARS", 1000)  # this test's transcripts are a few KB
    grow(small, upstream, key, cid, 7)
    wait_for(lambda: compaction_nodes(small.db, cid), what="the background compaction")
    transcript_counts = [on_loop for n, on_loop in counted_texts if n >= 1000]
    assert transcript_counts and not any(transcript_counts)


def test_a_process_dying_mid_compaction_leaves_no_trace(fresh_database_url, upstream_url, upstream, key, cid, tmp_path):
    import os
    import signal

    import openai

    config = '[models."tiny*"]\ncontext_window = 4000\nmax_output_tokens = 1000\n[compaction]\nkeep_recent = 4\n'
    proc, url = spawn_proxy(fresh_database_url, upstream_url, tmp_path, config)
    db = Db(fresh_database_url)
    hold = threading.Event()
    upstream.enqueue_summary(Reply(content="never delivered", hold=hold))
    try:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
        for i in range(7):
            upstream.enqueue(Reply(content=f"answer {i}", usage=usage(300 + 300 * i)))
            _, h = say(client, cid, user(f"question {i}: {FILLER[:200]}"))
        wait_for(lambda: upstream.summariser_requests, what="the background summariser call")
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        hold.set()
    assert compaction_nodes(db, cid) == []
    assert db.head(cid) == h["x-node-id"]
    assert db.fetchval("SELECT count(*) FROM nodes WHERE conversation_id = $1 AND status = 'pending'", cid) == 0
    # a new process picks up from the stored tree; the next turn is uncompacted and triggers again
    with serve_proxy(make_settings(fresh_database_url, upstream_url, **LIMITS)) as p:
        upstream.enqueue(Reply(content="after restart", usage=usage(2500)))
        say(p.openai(key), cid, user("after the restart"))
        assert "question 0" in upstream.last.text()
        wait_for(lambda: compaction_nodes(db, cid), what="the compaction after restart")


def test_a_turn_during_background_compaction_wins_over_it_and_the_next_call_uses_the_summary(small, upstream, key, cid):
    """A turn that moves the head while its path is summarised wins: nothing is written then. The
    summary is not lost: the next call, whose path still holds the node it summarised, hangs under
    it -- the turn since kept raw -- and the summariser is not asked again (a fast agent's turns
    overtake every summary, and were never compacted before the hard threshold)."""
    hold = threading.Event()
    upstream.enqueue_summary(Reply(content="Facts: made while the conversation moved on.", hold=hold))
    grow(small, upstream, key, cid, 7)
    wait_for(lambda: upstream.summariser_requests, what="the summariser request")
    later = grow(small, upstream, key, cid, 1, start=7, prompt_step=0)  # the head moves on: a new turn
    hold.set()
    wait_for(lambda: 'branchpoint_compactions_total{mode="soft",result="moved"} 1.0' in httpx.get(f"{small.url}/metrics").text,
             what="the compaction to be left for the next call")
    assert compaction_nodes(small.db, cid) == []
    assert small.db.head(cid) == later[-1]
    _, h = say(small.openai(key), cid, user("next"))
    sent = upstream.last.messages
    assert sent[0]["content"].startswith(SUMMARY_PREFIX) and "made while the conversation moved on" in sent[0]["content"]
    assert "question 0" not in upstream.last.text() and "question 7" in upstream.last.text()  # (the turn since: raw)
    assert sent[-1] == user("next") and len(upstream.summariser_requests) == 1
    [node] = compaction_nodes(small.db, cid)
    assert h["x-parent-node-id"] == str(node["id"]) and str(small.db.head(cid)) == h["x-node-id"]


def test_a_call_above_hard_takes_over_the_background_summary(small, upstream, key, cid):
    hold = threading.Event()
    upstream.enqueue_summary(Reply(content="Facts: shared summary.", hold=hold))
    grow(small, upstream, key, cid, 7)
    wait_for(lambda: upstream.summariser_requests, what="the background summariser request")
    result = {}

    def big_turn():
        upstream.enqueue(Reply(content="big answer", usage=usage(1000)))
        result["headers"] = say(small.openai(key), cid, user("huge: " + FILLER * 5))[1]

    t = threading.Thread(target=big_turn)
    t.start()
    time.sleep(0.3)
    assert t.is_alive()  # it waits for the summary being written rather than asking again
    hold.set()
    t.join(10)
    node = compaction_nodes(small.db, cid)[0]
    assert result["headers"]["x-parent-node-id"] == str(node["id"])
    assert len(upstream.summariser_requests) == 1
    assert upstream.last.messages[0]["content"].endswith("Facts: shared summary.")
    wait_for(lambda: 'result="taken_over"} 1.0' in httpx.get(f"{small.url}/metrics").text, what="the metric")


def test_request_of_a_compaction_node_is_its_summariser_request(small, upstream, key, cid):
    grow(small, upstream, key, cid, 7)
    node = wait_for(lambda: compaction_nodes(small.db, cid), what="the compaction")[0]
    r = small.http(key).get(f"/admin/nodes/{node['id']}/request")
    assert r.status_code == 200 and r.headers["x-request-verified"] == "true"
    assert r.json() == upstream.summariser_requests[0].body


def test_a_conversation_compacted_before_a_call_exports_and_imports(fresh_database_url, upstream_url, upstream, key, cid):
    """A synchronous compaction moves the call's pending node under the summary it makes: the node
    is older than its parent, and the export (oldest first) lists it first. Its import was refused
    (its parent "not on an earlier line"); now the same tree and context come back."""
    settings = make_settings(fresh_database_url, upstream_url, models=LIMITS["models"],
                             compaction={"keep_recent": 2, "soft": 1.0, "hard": 0.9})
    with serve_proxy(settings) as p:
        db = Db(fresh_database_url)
        grow(p, upstream, key, cid, 5, prompt_step=500)
        _, h = say(p.openai(key), cid, user("a long pasted report: " + FILLER * 3))
        call = db.node(h["x-node-id"])
        summary = db.node(call["parent_id"])
        assert summary["kind"] == "compaction" and call["created_at"] < summary["created_at"]
        http = p.http(key)
        exported = http.get(f"/admin/conversations/{cid}/export").content
        r = http.post(f"/admin/conversations/{cid}-copy/import", content=exported)
        assert r.status_code == 201, r.text
        say(p.openai(key), f"{cid}-copy", user("and then?"))
        copied = upstream.last.messages
        say(p.openai(key), cid, user("and then?"))
        assert copied == upstream.last.messages  # the same context


def test_an_edit_compacted_before_its_call_moves_the_head_only_by_its_outcome(fresh_database_url, upstream_url,
                                                                               upstream, key, cid):
    """An edit of an older question, above the hard threshold: its parent's path is compacted
    first, but the head moves only as the call's outcome says -- a refused edit (400) leaves it
    where it was (it moved to the edit's summary, off the user's branch), a successful one takes
    it to the edit's node."""
    settings = make_settings(fresh_database_url, upstream_url, models=LIMITS["models"],
                             compaction={"keep_recent": 4, "soft": 1.0})
    with serve_proxy(settings) as p:
        db = Db(fresh_database_url)
        heads = grow(p, upstream, key, cid, 6, prompt_step=440)
        upstream.enqueue(Reply(kind="error", status=400, error={"message": "bad param", "type": "invalid_request_error",
                                                                "param": "temperature", "code": None}))
        with pytest.raises(openai.BadRequestError):
            say(p.openai(key), cid, user("edited: " + FILLER * 4), parent=heads[4])
        summary = compaction_nodes(db, cid)[-1]
        assert str(summary["compacted_from"]) == heads[4] and db.head(cid) == heads[5]
        _, h = say(p.openai(key), cid, user("edited again: " + FILLER * 4), parent=heads[4])
        assert db.node(h["x-node-id"])["parent_id"] is not None and db.head(cid) == h["x-node-id"]


def test_a_reasoning_models_thinking_does_not_count_towards_the_soft_threshold(small, upstream, key, cid):
    """A turn's reasoning tokens are not sent back: the context the next call carries is its
    prompt and its answer without them -- as the hard threshold's estimate counts it already.
    1,500 + 800 - 780 reasoning = 1,520, below soft (2,100): no background summary."""
    grow(small, upstream, key, cid, 4, prompt_step=100)
    upstream.enqueue(Reply(content="short", usage={"prompt_tokens": 1500, "completion_tokens": 800, "total_tokens": 2300,
                                                   "completion_tokens_details": {"reasoning_tokens": 780}}))
    say(small.openai(key), cid, user("think hard"))
    time.sleep(1.5)  # (a summary asked for comes at once: the fake summariser answers without delay)
    assert upstream.summariser_requests == [] and compaction_nodes(small.db, cid) == []
    upstream.enqueue(Reply(content="short", usage={"prompt_tokens": 1600, "completion_tokens": 800, "total_tokens": 2400}))
    _, h = say(small.openai(key), cid, user("and without"))  # (2,400 > soft: the summary comes)
    node = wait_for(lambda: compaction_nodes(small.db, cid), what="the background compaction")[0]
    assert str(node["compacted_from"]) == h["x-node-id"]


def test_an_upstream_that_reports_no_usage_is_compacted_in_the_background_by_the_estimate(small, upstream, key, cid):
    """Several OpenAI-compatible servers answer without usage: the soft threshold then goes by the
    path's estimate (a pair of these messages is ~190 tokens). A path under it asks the summariser
    nothing; one above it (~2,300 tokens: above soft, 2,100, below hard, 2,700) is summarised in
    the background -- before, only the hard threshold ever compacted such a conversation."""
    def history(pairs):
        out = []
        for i in range(pairs):
            out += [user(f"note {i}: {FILLER}"), {"role": "assistant", "content": "noted"}]
        return out

    upstream.enqueue(Reply(content="noted", no_usage=True))
    say(small.openai(key), f"{cid}-small", *history(3), user(f"last: {FILLER}"))
    time.sleep(1.0)  # (a summary asked for comes at once: the fake summariser answers without delay)
    assert upstream.summariser_requests == [] and compaction_nodes(small.db, f"{cid}-small") == []

    upstream.enqueue(Reply(content="noted", no_usage=True))
    _, h = say(small.openai(key), cid, *history(11), user(f"last: {FILLER}"))
    node = wait_for(lambda: compaction_nodes(small.db, cid), what="the background compaction")[0]
    assert str(node["compacted_from"]) == h["x-node-id"] and small.db.head(cid) == str(node["id"])
    assert "note 0" in upstream.summariser_requests[0].text()


def _pdf(pages: int, size: int) -> str:
    """A PDF's bytes as base64: ``pages`` page objects, then binary filler (its images) to ``size``."""
    body = b"%PDF-1.7\n" + b"".join(b"%d 0 obj << /Type /Page /Parent 1 0 R >> endobj\n" % (i + 2) for i in range(pages))
    body += b"1 0 obj << /Type /Pages /Count %d >> endobj\n" % pages
    return base64.b64encode(body + bytes(range(256)) * ((size - len(body)) // 256)).decode()


def test_an_attached_file_counts_by_its_pages_not_its_base64(fresh_database_url, upstream_url, upstream, key, cid):
    """A 1 MB PDF of three pages is ~7,500 tokens to a model, not the hundreds of thousands its
    base64 reads as text: a 200K-window model's conversation is not compacted for it, and the
    file reaches the model as it was sent."""
    pdf_file = {"file_data": "data:application/pdf;base64," + _pdf(3, 1 << 20)}
    assert tokens_module.file_tokens(pdf_file) == 3 * tokens_module.PDF_PAGE_TOKENS
    assert tokens_module.file_tokens(pdf_file, bound=True) >= 3 * tokens_module.PDF_PAGE_TOKENS  # (nothing decoded)
    assert tokens_module.file_tokens({"file_data": "data:text/plain;base64," + base64.b64encode(b"x" * 300).decode()}) == 100
    assert tokens_module.file_tokens({"file_id": "file-abc"}) == tokens_module.PDF_PAGE_TOKENS
    settings = make_settings(fresh_database_url, upstream_url,
                             models={"wide*": {"context_window": 200_000, "max_output_tokens": 8_000}})
    with serve_proxy(settings) as p:
        client = p.openai(key, conversation=cid)
        client.chat.completions.create(model="wide-1", messages=[user("hello")])
        pdf = {"type": "file", "file": {"filename": "report.pdf",
                                        "file_data": "data:application/pdf;base64," + _pdf(3, 1 << 20)}}
        client.chat.completions.create(model="wide-1", messages=[
            {"role": "user", "content": [{"type": "text", "text": "summarise"}, pdf]}])
        client.chat.completions.create(model="wide-1", messages=[user("and the second page?")])
        assert upstream.summariser_requests == [] and compaction_nodes(Db(fresh_database_url), cid) == []
        assert upstream.last.messages[2]["content"][1] == pdf
        # summarised, it is named in the transcript: its base64 is nothing a summary can use
        for i in range(4):
            client.chat.completions.create(model="wide-1", messages=[user(f"more {i}")])
        r = p.http(key).post(f"/admin/conversations/{cid}/compact")
        assert r.status_code == 200 and r.json()["compacted"] is True, r.text
        asked = "".join(r.raw.decode() for r in upstream.summariser_requests)
        assert "[file report.pdf]" in asked and _pdf(3, 1 << 20)[:4000] not in asked


def test_a_summariser_with_a_smaller_window_is_sent_no_more_than_it_takes(fresh_database_url, upstream_url,
                                                                          upstream, key, cid):
    """``[compaction] model`` may be a smaller model than the conversation's: its requests are held
    to its own input limit (the transcript chunked, a giant message cut to it) and its summary to
    what it can write -- not to the conversation model's, which it would refuse."""
    models = {"wide*": {"context_window": 40000, "max_output_tokens": 1000},
              "tiny-sum*": {"context_window": 4000, "max_output_tokens": 500}}
    settings = make_settings(fresh_database_url, upstream_url, models=models,
                             compaction={"keep_recent": 2, "model": "tiny-sum"})
    with serve_proxy(settings) as p:
        client = p.openai(key)
        for i in range(12):  # ~12 x 1,000 tokens of history
            upstream.enqueue(Reply(content=f"answer {i}", usage=usage(1000 * (i + 1))))
            _say(client, cid, user(f"question {i}: " + FILLER * 5), model="wide-1")
        assert p.http(key).post(f"/admin/conversations/{cid}/compact").status_code == 200
        counter = TokenCounter()
        sizes = [sum(counter.text(str(m.get("content"))) for m in s.messages) for s in upstream.summariser_requests]
        assert len(sizes) > 1 and max(sizes) <= 3500  # (tiny-sum's input limit: 3,500)
        compaction = p.http(key).get(f"/admin/conversations/{cid}/path").json()["data"][0]
        assert compaction["kind"] == "compaction" and compaction["params"]["summary_budget_tokens"] <= 500


def test_an_audio_clip_is_summarised_as_audio_and_counted_by_its_length(fresh_database_url, upstream_url,
                                                                        upstream, key, cid):
    """A question holding an audio clip (chat's ``input_audio``, base64): the summariser reads it as
    ``[audio]``, as it reads an image or a file -- not its base64 as text, which filled its request
    with noise -- and the token estimate counts it by its length, not its base64's characters."""
    import base64
    import os

    audio = base64.b64encode(os.urandom(30000)).decode()
    clip = {"type": "input_audio", "input_audio": {"data": audio, "format": "wav"}}
    assert TokenCounter().message({"role": "user", "content": [clip]}) < 200  # (30 kB: ~10 tokens, 50 at least)
    models = {"wide*": {"context_window": 200000, "max_output_tokens": 8000}}
    with serve_proxy(make_settings(fresh_database_url, upstream_url, models=models,
                                   compaction={"keep_recent": 2})) as p:
        client = p.openai(key)
        upstream.enqueue(Reply(content="heard it", usage=usage(300)))
        _say(client, cid, {"role": "user", "content": [{"type": "text", "text": "what is said here?"}, clip]},
             model="wide-1")
        for i in range(4):
            upstream.enqueue(Reply(content=f"answer {i}", usage=usage(400 + 100 * i)))
            _say(client, cid, user(f"question {i}"), model="wide-1")
        r = p.http(key).post(f"/admin/conversations/{cid}/compact")
        assert r.status_code == 200 and r.json()["compacted"], r.text
        asked = "".join(s.raw.decode() for s in upstream.summariser_requests)
        assert "what is said here?" in asked and "[audio]" in asked and audio[:200] not in asked


def test_a_full_history_turn_in_flight_as_a_summary_is_applied_is_compacted_by_the_next_call(small, upstream, key,
                                                                                              cid):
    """A full-history client holds no lease: a background summary is applied while its next turn is
    in flight, and that turn, finishing, hangs under the node the summary replaced (the head goes
    there). Its next call -- whose path holds that node again -- hangs under the summary made, the
    turn since kept raw: the summary is used, not paid for and left on a side line."""
    full = {"X-Context-Mode": "full"}
    client = small.openai(key)
    history: list = []

    def turn(i: int, reply: Reply) -> dict:
        upstream.enqueue(reply)
        history.append(user(f"question {i}: {FILLER[:200]}"))
        raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=list(history),
                                                               extra_headers={"X-Conversation-Id": cid, **full})
        history.append({"role": "assistant", "content": raw.parse().choices[0].message.content})
        return raw.headers

    summary_hold = threading.Event()
    upstream.enqueue_summary(Reply(content="Facts: the early questions.", hold=summary_hold))
    for i in range(7):  # the seventh reports 2,100+: above soft
        turn(i, Reply(content=f"answer {i}", usage=usage(300 + 300 * i)))
    wait_for(lambda: upstream.summariser_requests, what="the background summariser call")
    turn_hold = threading.Event()
    seventh = threading.Thread(target=turn, args=(7, Reply(content="answer 7", usage=usage(2400), hold=turn_hold)))
    seventh.start()
    wait_for(lambda: len(upstream.turn_requests) == 8, what="the eighth turn at the upstream")
    summary_hold.set()
    wait_for(lambda: compaction_nodes(small.db, cid), what="the summary applied while the turn is in flight")
    turn_hold.set()
    seventh.join(10)
    upstream.enqueue(Reply(content="now", usage=usage(500)))
    history.append(user("what now?"))
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=list(history),
                                                           extra_headers={"X-Conversation-Id": cid, **full})
    sent = upstream.last.messages
    assert sent[0]["content"].startswith(SUMMARY_PREFIX) and "the early questions" in sent[0]["content"]
    assert "question 0" not in upstream.last.text() and "question 7" in upstream.last.text()
    assert sent[-1] == user("what now?") and len(upstream.summariser_requests) == 1
    latest = compaction_nodes(small.db, cid)[-1]
    assert raw.headers["x-parent-node-id"] == str(latest["id"])


def test_a_background_summary_written_again_on_another_branch_is_counted_once(small, upstream, key, cid):
    """The summariser is called once for a background summary, however many compaction nodes it
    is written as: the head moved back to the node it summarised (an undo of the compaction), the
    next call there hangs under the same summary written again -- whose node names the first and
    holds no usage. Before, both nodes held the summariser's usage, and the usage report and the
    conversation's usage counted a call (and its 5,077 tokens) that was never made."""
    upstream.enqueue_summary(Reply(content="Facts: the summary.", usage={
        "prompt_tokens": 5000, "completion_tokens": 77, "total_tokens": 5077}))
    heads = grow(small, upstream, key, cid, 7)
    first = wait_for(lambda: compaction_nodes(small.db, cid), what="the background compaction")[0]
    http = small.http(key)
    before = http.get("/admin/usage").json()
    conversation = http.get(f"/admin/conversations/{cid}").json()["usage"]
    assert http.put(f"/admin/conversations/{cid}/head", json={"node_id": heads[-1]}).status_code == 200
    upstream.enqueue(Reply(content="next answer", usage=usage(400)))
    say(small.openai(key), cid, user("next"))
    assert upstream.last.messages[0]["content"].startswith(SUMMARY_PREFIX)  # (the summary is used again)
    assert len(upstream.summariser_requests) == 1
    again = compaction_nodes(small.db, cid)[-1]
    assert again["id"] != first["id"] and again["usage"] is None
    assert again["params"]["reused_summary"] == {"node_id": str(first["id"])}
    after = http.get("/admin/usage").json()
    assert (after["calls"] - before["calls"], after["prompt_tokens"] - before["prompt_tokens"],
            after["completion_tokens"] - before["completion_tokens"]) == (1, 400, 20)
    now = http.get(f"/admin/conversations/{cid}").json()["usage"]
    assert now["prompt_tokens"] - conversation["prompt_tokens"] == 400


def _overtaken_summary(small, upstream, key, cid, later_turns):
    """Seven turns (the seventh above soft by its reported usage) and a held background summary;
    ``later_turns`` overtake it (reporting little: no newer request); released, it is not applied
    -- the head moved -- and waits for the next call."""
    client = small.openai(key)
    hold = threading.Event()
    upstream.enqueue_summary(Reply(content="Facts: the ready summary.", hold=hold))
    for i in range(7):
        upstream.enqueue(Reply(content=f"answer {i}", usage=usage(300 + 300 * i)))
        say(client, cid, user(f"question {i}: " + (FILLER if i >= 5 else "short")))
    wait_for(lambda: upstream.summariser_requests, what="the summariser request")
    heads = []
    for j, text in enumerate(later_turns):
        upstream.enqueue(Reply(content=f"later answer {j}", usage=usage(300)))
        heads.append(say(client, cid, user(text))[1]["x-node-id"])
    hold.set()
    wait_for(lambda: 'branchpoint_compactions_total{mode="soft",result="moved"} 1.0' in
             httpx.get(f"{small.url}/metrics").text, what="the summary to wait")
    assert compaction_nodes(small.db, cid) == []
    return heads


def test_a_call_using_a_ready_summary_is_measured_against_the_hard_threshold_after_it(small, upstream, key, cid):
    """The summary waited while turns were added; the call that uses it brings its own items too:
    the request it makes is measured like any (2,560 tokens of question on top: summarised again
    to fit under hard, not sent above what the model takes)."""
    _overtaken_summary(small, upstream, key, cid, ["later: " + FILLER])
    upstream.enqueue(Reply(content="ok", usage=usage(500)))
    say(small.openai(key), cid, user("new: " + FILLER * 14))
    sent = upstream.last.messages
    assert sent[0]["content"].startswith(SUMMARY_PREFIX)
    assert TokenCounter().messages(sent) <= 2700 and len(upstream.summariser_requests) == 2


def test_a_ready_summary_is_not_used_by_a_call_with_its_own_threshold_nor_by_a_regeneration(small, upstream, key,
                                                                                            cid):
    """A call with its own compaction threshold is compacted only above it; a regeneration of the
    head's answer (its parent the head's parent) goes beside the original, with the original's
    context -- neither takes the waiting summary, which the next call from the head still finds."""
    heads = _overtaken_summary(small, upstream, key, cid, ["later: a small turn", "later: another"])
    client = small.openai(key)
    upstream.enqueue(Reply(content="ok", usage=usage(500)))
    answer = client.responses.create(model=MODEL, input="next", extra_headers={"X-Conversation-Id": f"{cid}"},
                                     context_management=[{"type": "compaction", "compact_threshold": 1_000_000}])
    assert "question 0" in upstream.last.text() and answer.output[0].type != "compaction"
    head = str(small.db.head(cid))
    parent = str(small.db.node(head)["parent_id"])
    upstream.enqueue(Reply(content="regenerated", usage=usage(500)))
    _, h = say(client, cid, user("next"), parent=parent)
    assert h["x-parent-node-id"] == parent and "question 0" in upstream.last.text()
    upstream.enqueue(Reply(content="ok", usage=usage(500)))
    _, h = say(client, cid, user("from the head"))
    assert upstream.last.messages[0]["content"].startswith(SUMMARY_PREFIX)
    assert h["x-parent-node-id"] == str(compaction_nodes(small.db, cid)[-1]["id"]) and heads
