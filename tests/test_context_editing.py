"""Context editing (docs/behaviour.md#context-editing) end to end: old tool results cleared before
anything is summarised, recorded as a compaction node of method ``clear_tool_results``, and every
request between two clearings a byte-for-byte extension of the one before -- asserted on what the
fake upstream received."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest

from proxy.compaction import SUMMARY_PREFIX
from proxy.compaction.clearing import PLACEHOLDER_PREFIX
from proxy.tokens import TokenCounter

from .conftest import Db, make_settings, proxy_with, serve_proxy, wait_for
from .fakes import Reply
from .helpers import assistant, prefix_extends, say, tool, tool_call, user

MODEL = "tiny-model"
# input limit 3000 tokens: clearing above 1500 when it frees >= 300, soft 2100, hard 2700;
# mid-model: 30,000 (clearing above 15,000 when it frees >= 3,000)
LIMITS = {"models": {"tiny*": {"context_window": 4000, "max_output_tokens": 1000},
                     "mid*": {"context_window": 40000, "max_output_tokens": 10000}}}
COUNTER = TokenCounter()
WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango", "uniform", "victor", "whiskey", "xray", "yankee", "zulu"]


def output(i: int, chars: int) -> str:
    """A tool's output of about ``chars`` characters, different for each ``i``."""
    words = [f"{WORDS[(i * 7 + j) % len(WORDS)]}{j % 10}" for j in range(chars // 7)]
    return f"output of step {i}: " + " ".join(words)


def clearing_nodes(db: Db, cid: str) -> list[Any]:
    return db.fetch("SELECT * FROM nodes WHERE conversation_id = $1 AND kind = 'compaction' "
                    "AND params ->> 'method' = 'clear_tool_results' ORDER BY created_at", cid)


def summary_nodes(db: Db, cid: str) -> list[Any]:
    return db.fetch("SELECT * FROM nodes WHERE conversation_id = $1 AND kind = 'compaction' "
                    "AND coalesce(params ->> 'method', 'summary') = 'summary' ORDER BY created_at", cid)


@pytest.fixture(autouse=True)
def counted(upstream: Any) -> None:
    """The fake upstream reports prompt tokens as a tokeniser counts them (not 4 characters of JSON)."""
    upstream.count_prompt = lambda messages: COUNTER.messages(messages) + 3


def agent_round(client: Any, upstream: Any, cid: str, i: int, chars: int, name: str = "read_file",
                model: str = MODEL) -> str:
    """One tool round of an agent in delta mode: a task, the model's tool call, the tool's output,
    the model's answer. Returns the node id of the call that sent the output."""
    upstream.enqueue(Reply(content=None, tool_calls=[tool_call(f"call_{i}", name, json.dumps({"path": f"f{i}.py"}))]))
    say(client, cid, user(f"task {i}"), model=model)
    upstream.enqueue(Reply(content=f"done {i}"))
    _, headers = say(client, cid, tool(f"call_{i}", output(i, chars)), model=model)
    return headers["x-node-id"]


def tool_messages(request: Any) -> list[dict[str, Any]]:
    return [m for m in request.messages if m.get("role") == "tool"]


def assert_paired(messages: list[dict[str, Any]]) -> None:
    """Every tool result right after the assistant message whose call it answers."""
    for i, m in enumerate(messages):
        if m.get("role") == "tool":
            j = i - 1
            while messages[j].get("role") == "tool":
                j -= 1
            assert m["tool_call_id"] in {c["id"] for c in messages[j].get("tool_calls") or ()}


@pytest.fixture
def tiny(fresh_database_url: str, upstream_url: str) -> Any:
    yield from proxy_with(fresh_database_url, upstream_url, **LIMITS)


def test_old_tool_results_are_cleared_before_the_call_that_crosses_the_threshold(tiny, upstream, key, cid):
    client = tiny.openai(key)
    senders = [agent_round(client, upstream, cid, i, 600) for i in range(10)]
    nodes = clearing_nodes(tiny.db, cid)
    assert nodes, "no clearing happened"
    first = nodes[0]
    # the request right after the clearing: every result but the 3 most recent is a placeholder
    cleared_request = next(r for r in upstream.turn_requests if PLACEHOLDER_PREFIX in r.text())
    results = tool_messages(cleared_request)
    assert all(m["content"].startswith(PLACEHOLDER_PREFIX) for m in results[:-3])
    assert not any(m["content"].startswith(PLACEHOLDER_PREFIX) for m in results[-3:])
    assert_paired(cleared_request.messages)
    # each placeholder names the tool, the size and the node that holds the original
    for m in results[:-3]:
        i = int(m["tool_call_id"].split("_")[1])
        text = m["content"]
        assert "`read_file`" in text and f"{len(output(i, 600)):,} characters" in text
        holder = re.search(r"in node ([0-9a-f-]{36})", text).group(1)
        assert holder == senders[i]
        original = tiny.http(key).get(f"/admin/nodes/{holder}").json()
        assert original["sent"][0]["content"] == output(i, 600)
    # recorded as a compaction node: no parent, compacted_from = the node it replaces, the call
    # hung under it; the admin API names its method
    assert first["parent_id"] is None and first["params"]["method"] == "clear_tool_results"
    shown = tiny.http(key).get(f"/admin/nodes/{first['id']}").json()
    assert shown["kind"] == "compaction" and shown["method"] == "clear_tool_results"
    assert shown["compacted_from"] == str(first["compacted_from"])
    child = tiny.db.fetch("SELECT id FROM nodes WHERE parent_id = $1", first["id"])
    assert len(child) == 1
    tree = tiny.http(key).get(f"/admin/conversations/{cid}/tree").json()["data"]
    assert {n["id"]: n["method"] for n in tree if n["kind"] == "compaction"}[str(first["id"])] == "clear_tool_results"
    # no summariser was asked: clearing is no model call
    assert upstream.summariser_requests == []
    assert summary_nodes(tiny.db, cid) == []
    metrics = httpx.get(f"{tiny.url}/metrics").text
    assert re.search(r"branchpoint_cleared_tool_results_total \d", metrics)


def test_nothing_is_cleared_when_it_would_free_too_little(tiny, upstream, key, cid):
    client = tiny.openai(key)
    # many small results: above the threshold, but clearing them frees less than 10 % of the limit
    upstream.enqueue(Reply(content="ok", usage={"prompt_tokens": 1900, "completion_tokens": 10, "total_tokens": 1910}))
    say(client, cid, user("a long brief " + output(99, 200)), model=MODEL)
    for i in range(6):
        agent_round(client, upstream, cid, i, 40)
    assert clearing_nodes(tiny.db, cid) == []
    assert PLACEHOLDER_PREFIX not in upstream.last.text()


def test_excluded_tools_and_the_most_recent_results_are_never_cleared(fresh_database_url, upstream_url, upstream,
                                                                      key, cid):
    settings = make_settings(fresh_database_url, upstream_url, **LIMITS,
                             context_editing={"exclude_tools": ["memory"], "keep_tool_results": 2})
    with serve_proxy(settings) as p:
        client = p.openai(key)
        for i in range(8):
            agent_round(client, upstream, cid, i, 600, name="memory" if i in (1, 4) else "read_file")
        assert clearing_nodes(Db(fresh_database_url), cid)
        results = tool_messages(upstream.last)
        for m in results:
            i = int(m["tool_call_id"].split("_")[1])
            if i in (1, 4):
                assert m["content"] == output(i, 600)  # an excluded tool's
        # the last request's new result and the one before it are whole; an older one cleared
        assert [m["content"].startswith(PLACEHOLDER_PREFIX) for m in results[-2:]] == [False, False]
        assert results[0]["content"].startswith(PLACEHOLDER_PREFIX)


def test_requests_between_clearings_extend_each_other_byte_for_byte(tiny, upstream, key, cid):
    """A long agent loop (tool outputs of ~2 % of the input limit each): each request begins with
    the one before, byte for byte, except right after a clearing; clearing alone keeps the
    conversation under the soft threshold (no summary)."""
    client = tiny.openai(key)
    for i in range(70):
        agent_round(client, upstream, cid, i, 2400, model="mid-model")
    turns = upstream.turn_requests
    breaks = [k for k in range(1, len(turns)) if not prefix_extends(turns[k - 1].raw, turns[k].raw)]
    clearings = clearing_nodes(tiny.db, cid)
    assert len(clearings) >= 2
    # every break is a clearing: the request right after one is the first under its node
    after_clearing = {str(n["id"]) for n in clearings}
    parents = [tiny.db.fetchval("SELECT parent_id::text FROM nodes WHERE request_hash = sha256($1::bytea)", r.raw)
               for r in turns]
    assert breaks == [k for k in range(1, len(turns)) if parents[k] in after_clearing]
    assert (len(turns) - 1 - len(breaks)) / (len(turns) - 1) >= 0.9
    # each clearing freed at least clear_at_least (10 % of 30,000 tokens)
    assert all(n["params"]["freed_tokens"] >= 3000 for n in clearings)
    assert upstream.summariser_requests == [] and summary_nodes(tiny.db, cid) == []
    limit = 30000
    assert max(COUNTER.messages(r.messages) for r in turns) < 0.7 * limit
    for r in turns:
        assert_paired(r.messages)


def test_still_above_the_hard_threshold_after_clearing_the_path_is_summarised(fresh_database_url, upstream_url,
                                                                             upstream, key, cid):
    settings = make_settings(fresh_database_url, upstream_url, **LIMITS, compaction={"keep_recent": 2})
    with serve_proxy(settings) as p:
        db = Db(fresh_database_url)
        client = p.openai(key)
        for i in range(5):
            agent_round(client, upstream, cid, i, 600)  # ~1,400 tokens: no clearing yet
        assert clearing_nodes(db, cid) == []
        # a long question on top (~2,000 tokens): clearing the 2 oldest results is not enough to
        # get under the hard threshold (2,700)
        _, headers = say(client, cid, user("and now this: " + output(50, 5100)), model=MODEL)
        clearing = clearing_nodes(db, cid)
        summary = summary_nodes(db, cid)
        # (a second summary may follow in the background: the answered question stays above soft)
        assert len(clearing) == 1 and len(summary) >= 1
        assert summary[0]["compacted_from"] == clearing[0]["id"]  # summarised after clearing
        assert headers["x-parent-node-id"] == str(summary[0]["id"])
        sent = upstream.last.messages
        assert sent[0]["content"].startswith(SUMMARY_PREFIX)
        assert len(upstream.summariser_requests) >= 1


def test_after_a_turn_above_soft_no_summary_when_clearing_will_do(fresh_database_url, upstream_url, upstream, key,
                                                                   cid):
    settings = make_settings(fresh_database_url, upstream_url, **LIMITS, context_editing={"clear_tool_results": 0.6})
    with serve_proxy(settings) as p:
        db = Db(fresh_database_url)
        client = p.openai(key)
        for i in range(6):
            agent_round(client, upstream, cid, i, 600)  # ~1,650 tokens: under 1,800, nothing cleared
        assert clearing_nodes(db, cid) == []
        # the upstream reports a context above soft (2,100); clearing the 3 oldest results before the
        # next call brings it under: no summary
        upstream.enqueue(Reply(content="noted", usage={"prompt_tokens": 2150, "completion_tokens": 10,
                                                       "total_tokens": 2160}))
        say(client, cid, user("summarise the files"), model=MODEL)
        wait_for(lambda: 'branchpoint_compactions_total{mode="soft",result="left_to_clearing"} 1.0'
                 in httpx.get(f"{p.url}/metrics").text, what="the background job to leave it to clearing")
        assert upstream.summariser_requests == [] and summary_nodes(db, cid) == []
        say(client, cid, user("next"), model=MODEL)
        assert len(clearing_nodes(db, cid)) == 1
        assert PLACEHOLDER_PREFIX in upstream.last.text()
        # where clearing cannot do it, the summary still comes
        upstream.enqueue(Reply(content="noted", usage={"prompt_tokens": 2600, "completion_tokens": 10,
                                                       "total_tokens": 2610}))
        say(client, cid, user("and the rest"), model=MODEL)
        wait_for(lambda: summary_nodes(db, cid), what="the background summary")


def test_clearing_off_leaves_tool_results_alone(fresh_database_url, upstream_url, upstream, key, cid):
    settings = make_settings(fresh_database_url, upstream_url, **LIMITS, context_editing={"clear_tool_results": 0})
    with serve_proxy(settings) as p:
        client = p.openai(key)
        for i in range(6):
            agent_round(client, upstream, cid, i, 600)
        assert clearing_nodes(Db(fresh_database_url), cid) == []
        assert PLACEHOLDER_PREFIX not in json.dumps([r.messages for r in upstream.turn_requests])


def test_the_admin_api_clears_on_demand(tiny, upstream, key, cid):
    client = tiny.openai(key)
    for i in range(5):
        agent_round(client, upstream, cid, i, 300)  # far below any threshold
    admin = tiny.http(key)
    r = admin.post(f"/admin/conversations/{cid}/compact", json={"method": "clear_tool_results"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["compacted"] is True and body["method"] == "clear_tool_results"
    assert body["cleared_results"] == 2  # 5 results, the 3 most recent kept
    assert tiny.db.head(cid) == body["node_id"]
    say(client, cid, user("go on"), model=MODEL)
    results = tool_messages(upstream.last)
    assert [m["content"].startswith(PLACEHOLDER_PREFIX) for m in results] == [True, True, False, False, False]
    # nothing left to clear: said so, nothing written
    again = admin.post(f"/admin/conversations/{cid}/compact", json={"method": "clear_tool_results"}).json()
    assert again == {"object": "compaction", "compacted": False, "method": "clear_tool_results",
                     "reason": "nothing_to_clear"}
    assert admin.post(f"/admin/conversations/{cid}/compact", json={"method": "shrink"}).status_code == 400


def test_a_cleared_path_keeps_its_history_for_full_history_clients(tiny, upstream, key, cid):
    """A client that resends its whole history (originals included) is matched through the
    clearing node; the upstream gets the placeholders, not the originals again."""
    history: list[dict[str, Any]] = []
    client = tiny.openai(key)
    full = {"X-Context-Mode": "full"}
    for i in range(8):
        call = tool_call(f"call_{i}", "read_file", json.dumps({"path": f"f{i}.py"}))
        upstream.enqueue(Reply(content=None, tool_calls=[call]))
        history.append(user(f"task {i}"))
        say(client, cid, *history, headers=full, model=MODEL)
        history += [assistant(None, tool_calls=[call]), tool(f"call_{i}", output(i, 600))]
        upstream.enqueue(Reply(content=f"done {i}"))
        _, headers = say(client, cid, *history, headers=full, model=MODEL)
        history.append(assistant(f"done {i}"))
        assert headers["x-context-matched"] == str(len(history) - 2)  # all but the new result matched
    assert clearing_nodes(tiny.db, cid)
    results = tool_messages(upstream.last)
    assert results[0]["content"].startswith(PLACEHOLDER_PREFIX)
    assert results[-1]["content"] == output(7, 600)


def test_cached_tokens_are_summed_in_the_conversation_and_on_metrics(tiny, upstream, key, cid):
    client = tiny.openai(key)
    upstream.enqueue(Reply(usage={"prompt_tokens": 100, "completion_tokens": 5, "total_tokens": 105,
                                  "prompt_tokens_details": {"cached_tokens": 80}}),
                     Reply(usage={"prompt_tokens": 150, "completion_tokens": 5, "total_tokens": 155,
                                  "prompt_tokens_details": {"cached_tokens": 96}}),
                     Reply(usage={"prompt_tokens": 160, "completion_tokens": 5, "total_tokens": 165}))
    for text in ("one", "two", "three"):
        say(client, cid, user(text), model=MODEL)
    usage = tiny.http(key).get(f"/admin/conversations/{cid}").json()["usage"]
    assert usage == {"prompt_tokens": 410, "completion_tokens": 15, "total_tokens": 425, "cached_tokens": 176}
    listed = next(c for c in tiny.http(key).get("/admin/conversations").json()["data"] if c["id"] == cid)
    assert listed["usage"]["cached_tokens"] == 176
    assert "branchpoint_cached_tokens_total 176.0" in httpx.get(f"{tiny.url}/metrics").text


def test_an_imported_copy_names_its_own_originals(tiny, upstream, key, cid):
    client = tiny.openai(key)
    for i in range(5):
        agent_round(client, upstream, cid, i, 300)
    admin = tiny.http(key)
    assert admin.post(f"/admin/conversations/{cid}/compact", json={"method": "clear_tool_results"}).json()["compacted"]
    export = admin.get(f"/admin/conversations/{cid}/export").content
    copy = f"{cid}-copy"
    assert admin.post(f"/admin/conversations/{copy}/import", content=export).status_code == 201
    path = admin.get(f"/admin/conversations/{copy}/path").json()["data"]
    clearing = path[0]
    assert clearing["method"] == "clear_tool_results"
    copied = {n["id"] for n in admin.get(f"/admin/conversations/{copy}/tree").json()["data"]}
    placeholders = [m["content"] for m in clearing["sent"] if m.get("role") == "tool" and m["content"].startswith(PLACEHOLDER_PREFIX)]
    assert len(placeholders) == 2
    for text, entry in zip(placeholders, clearing["params"]["cleared"]):
        holder = re.search(r"in node ([0-9a-f-]{36})", text).group(1)
        assert holder in copied and entry["node_id"] == holder  # a node of the copy, not of the source
        assert admin.get(f"/admin/nodes/{holder}").json()["sent"][0]["tool_call_id"] == entry["tool_call_id"]


def test_an_edit_before_a_clearing_is_not_refused(tiny, upstream, key, cid):
    """A clearing compacted no question away: a call whose parent lies before it (a regenerate, a
    ``previous_response_id`` of an earlier answer) is served on the original path -- not refused
    as an edit before a summary would be -- and sees nothing that came after its parent."""
    client = tiny.openai(key)
    senders = [agent_round(client, upstream, cid, i, 600) for i in range(10)]
    assert clearing_nodes(tiny.db, cid)
    upstream.enqueue(Reply(content="edited"))
    _, headers = say(client, cid, user("task 2, asked differently"), parent=senders[2], model=MODEL)
    assert headers["x-parent-node-id"] == senders[2]
    sent = upstream.last.text()
    assert "task 2, asked differently" in sent and "task 3" not in sent and "done 2" in sent
    assert tiny.db.head(cid) == headers["x-node-id"]
