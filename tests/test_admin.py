"""The admin API endpoints (docs/behaviour.md#admin-api), through HTTP, tenant-scoped."""

import datetime
import uuid

import pytest

from .fakes import Reply
from .helpers import MODEL, say, tool_call, user


def test_list_conversations_newest_first_with_cursor_pagination(proxy, upstream, key):
    client, http = proxy.openai(key), proxy.http(key)
    ids = [f"list-{i}-{uuid.uuid4().hex[:6]}" for i in range(5)]
    for cid in ids:
        say(client, cid, user("hi"))
    seen, cursor, pages = [], None, 0
    while True:
        r = http.get("/admin/conversations", params={"limit": 2, **({"cursor": cursor} if cursor else {})})
        assert r.status_code == 200
        body = r.json()
        assert body["object"] == "list" and len(body["data"]) <= 2
        seen += [c["id"] for c in body["data"]]
        pages += 1
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert seen == list(reversed(ids)) and pages == 3
    # another tenant sees none of them
    assert proxy.http("sk-other-tenant-" + uuid.uuid4().hex).get("/admin/conversations").json()["data"] == []
    assert http.get("/admin/conversations", params={"limit": 0}).status_code == 400
    assert http.get("/admin/conversations", params={"cursor": "garbage!"}).json()["error"]["code"] == "invalid_request"


def test_get_conversation_fields(proxy, upstream, key, cid):
    client, http = proxy.openai(key), proxy.http(key)
    _, h = say(client, cid, user("hi"))
    say(client, cid, user("again"))
    c = http.get(f"/admin/conversations/{cid}").json()
    assert {"id", "head_node_id", "node_count", "busy", "created_at", "updated_at"} <= set(c)
    assert c["id"] == cid and c["node_count"] == 2 and c["busy"] is False
    assert http.get("/admin/conversations/does-not-exist").json()["error"]["code"] == "conversation_not_found"
    assert http.get("/admin/conversations/bad%20id").json()["error"]["code"] == "invalid_conversation_id"
    assert proxy.http("sk-stranger").get(f"/admin/conversations/{cid}").status_code == 404


def test_a_conversation_counts_the_tokens_of_all_its_calls(proxy, upstream, key, cid):
    """usage: what the upstreams reported for every call -- turns, side calls, a failed call that
    reported some, a Responses call (input/output tokens); an odd report counts as none."""
    client, http = proxy.openai(key), proxy.http(key)
    upstream.enqueue(Reply(usage={"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}),
                     Reply(usage={"prompt_tokens": 130, "completion_tokens": 5, "total_tokens": 135}),
                     Reply(usage={"prompt_tokens": "many", "completion_tokens": None}))
    say(client, cid, user("hi"))
    say(client, cid, user("a title?"), kind="transform")
    say(client, cid, user("again"))
    upstream.enqueue(Reply(kind="stream", pieces=["par", "tial"], cut_after=2))
    with pytest.raises(Exception):  # noqa: B017 -- the cut stream
        list(client.chat.completions.create(model=MODEL, messages=[user("streamed")], stream=True,
                                            extra_headers={"X-Conversation-Id": cid}))
    upstream.enqueue(Reply(usage={"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}))  # a chat upstream
    client.responses.create(model=MODEL, input="and in the other API", extra_headers={"X-Conversation-Id": cid})
    assert http.get(f"/admin/conversations/{cid}/tree").json()["data"][-1]["usage"]["output_tokens"] == 3  # stored so
    c = http.get(f"/admin/conversations/{cid}").json()
    assert c["node_count"] == 5
    assert c["usage"] == {"prompt_tokens": 237, "completion_tokens": 28, "total_tokens": 265, "cached_tokens": 0}
    listed = next(x for x in http.get("/admin/conversations").json()["data"] if x["id"] == cid)
    assert listed["usage"] == c["usage"]


def test_the_usage_report_sums_tokens_by_model_over_a_time_range(proxy, upstream, key, db):
    client, http = proxy.openai(key), proxy.http(key)
    a, b = f"usage-a-{uuid.uuid4().hex[:6]}", f"usage-b-{uuid.uuid4().hex[:6]}"
    upstream.enqueue(Reply(usage={"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11}),
                     Reply(usage={"prompt_tokens": 20, "completion_tokens": 2, "total_tokens": 22}),
                     Reply(usage={"prompt_tokens": 40, "completion_tokens": 4, "total_tokens": 44}),
                     Reply(usage={"prompt_tokens": 80, "completion_tokens": 8, "total_tokens": 88}))
    say(client, a, user("one"))
    say(client, a, user("two"), model="gpt-4.1-mini")
    say(client, b, user("three"))
    say(client, b, user("four"))
    # the last call was made 40 days ago
    last = db.fetchrow("SELECT tree_id, id, created_at FROM nodes WHERE conversation_id = $1"
                       " ORDER BY created_at DESC LIMIT 1", b)
    db.fetch("UPDATE nodes SET created_at = $3 WHERE tree_id = $1 AND id = $2",  # (by its key, a value: as Citus updates)
             last["tree_id"], last["id"], last["created_at"] - datetime.timedelta(days=40))
    report = http.get("/admin/usage").json()  # the last 30 days
    assert report["object"] == "usage_report"
    assert report["data"] == [
        {"model": "gpt-4.1-mini", "calls": 1, "prompt_tokens": 20, "completion_tokens": 2, "total_tokens": 22},
        {"model": MODEL, "calls": 2, "prompt_tokens": 50, "completion_tokens": 5, "total_tokens": 55},
    ]
    assert (report["calls"], report["total_tokens"]) == (3, 77)
    older = http.get("/admin/usage", params={"since": "2000-01-01T00:00:00Z"}).json()
    assert (older["calls"], older["prompt_tokens"]) == (4, 150)
    assert http.get("/admin/usage", params={"since": "2030-01-01", "until": "2029-01-01"}).status_code == 400
    by_date = http.get("/admin/usage", params={"since": "2000-01-01", "until": "2100-01-01"})  # dates alone: midnights
    assert by_date.status_code == 200, by_date.text
    assert (by_date.json()["calls"], by_date.json()["since"]) == (4, "2000-01-01T00:00:00Z")
    assert http.get("/admin/usage", params={"until": "2000-01-01"}).json()["calls"] == 0
    for bad in ("yesterday", "2026-13-01", ""):
        r = http.get("/admin/usage", params={"since": bad})
        assert r.status_code == 400 and r.json()["error"]["param"] == "since", (bad, r.text)
    assert http.get("/admin/usage", params={"until": "0001-01-02T00:00:00"}).status_code == 400
    assert proxy.http(f"sk-other-{uuid.uuid4().hex}").get("/admin/usage").json()["data"] == []  # tenants apart


def test_the_usage_report_counts_the_model_calls_made(proxy, upstream, key, cid):
    """Items a Conversations API client added and a clearing of old tool results call no model:
    they are no calls of the report (each counted as one); a summary's call to the summariser is."""
    from .test_context_editing import agent_round

    http = proxy.http(key)
    r = http.post("/v1/conversations", json={"items": [{"type": "message", "role": "user", "content": "hello"}]})
    assert r.status_code == 200, r.text
    assert http.post(f"/v1/conversations/{r.json()['id']}/items", json={"items": [
        {"type": "message", "role": "user", "content": "more"}]}).status_code == 200
    assert http.get("/admin/usage").json()["calls"] == 0
    for i in range(5):
        agent_round(proxy.openai(key), upstream, cid, i, 3000)
    assert http.post(f"/admin/conversations/{cid}/compact", json={"method": "clear_tool_results"}).json()["compacted"]
    assert http.get("/admin/usage").json()["calls"] == 10
    assert http.post(f"/admin/conversations/{cid}/compact").json()["compacted"]
    assert http.get("/admin/usage").json()["calls"] == 11


def test_only_whole_token_counts_in_range_are_counted(proxy, upstream, key, cid):
    """An upstream's (or an import's) odd usage -- negative, fractional (3.0 too: an integer is
    written as one), absurd, a string -- counts as none, in the conversation's usage and the
    report alike, as /metrics counts it."""
    client, http = proxy.openai(key), proxy.http(key)
    upstream.enqueue(Reply(usage={"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11}),
                     Reply(usage={"prompt_tokens": 10**15, "completion_tokens": -5, "total_tokens": "x"}),
                     Reply(usage={"prompt_tokens": 2.5, "completion_tokens": 3.0, "total_tokens": 5}))
    for q in ("one", "two", "three"):
        say(client, cid, user(q))
    assert http.get(f"/admin/conversations/{cid}").json()["usage"] == {
        "prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11, "cached_tokens": 0}
    report = http.get("/admin/usage").json()
    assert (report["prompt_tokens"], report["completion_tokens"], report["total_tokens"]) == (10, 1, 11)


def test_the_tree_previews_a_tool_call_answer_with_empty_content_by_its_call(proxy, upstream, key, cid):
    upstream.enqueue(Reply(content="", tool_calls=[tool_call("c1", "lookup")]))
    say(proxy.openai(key), cid, user("find it"))
    assert [n["preview"] for n in proxy.http(key).get(f"/admin/conversations/{cid}/tree").json()["data"]] == ["lookup(…)"]


def test_node_children_tree_and_path(proxy, upstream, key, cid):
    client, http = proxy.openai(key), proxy.http(key)
    _, a = say(client, cid, user("root question"), temperature=0.5)
    _, b1 = say(client, cid, user("first follow-up"))
    _, b2 = say(client, cid, user("second follow-up"), parent=a["x-node-id"])
    node = http.get(f"/admin/nodes/{a['x-node-id']}").json()
    for field in ("id", "conversation_id", "parent_id", "kind", "status", "sent", "received", "model", "provider",
                  "params", "usage", "finish_reason", "error", "compacted_from", "depth", "created_at", "finished_at"):
        assert field in node, field
    assert node["params"]["temperature"] == 0.5 and node["sent"] == [user("root question")]
    children = http.get(f"/admin/nodes/{a['x-node-id']}/children").json()
    assert children["object"] == "list"
    assert [c["id"] for c in children["data"]] == [b1["x-node-id"], b2["x-node-id"]]  # oldest first
    tree = http.get(f"/admin/conversations/{cid}/tree").json()
    assert {n["id"] for n in tree["data"]} == {a["x-node-id"], b1["x-node-id"], b2["x-node-id"]}
    assert tree["head_node_id"] == b2["x-node-id"]
    by_id = {n["id"]: n for n in tree["data"]}
    assert by_id[b1["x-node-id"]]["parent_id"] == a["x-node-id"]
    assert by_id[b1["x-node-id"]]["preview"] == "echo: first follow-up"
    assert {"kind", "status", "model", "usage", "created_at"} <= set(by_id[a["x-node-id"]])
    path = http.get(f"/admin/conversations/{cid}/path").json()["data"]
    assert [(n["id"], n["sibling_index"], n["sibling_count"]) for n in path] == [
        (a["x-node-id"], 1, 1), (b2["x-node-id"], 2, 2)]
    # unknown / foreign / malformed node ids
    assert http.get(f"/admin/nodes/{uuid.uuid4()}").json()["error"]["code"] == "node_not_found"
    assert proxy.http("sk-stranger").get(f"/admin/nodes/{a['x-node-id']}").status_code == 404
    assert proxy.http("sk-stranger").get(f"/admin/nodes/{a['x-node-id']}/children").status_code == 404
    assert http.get("/admin/nodes/not-a-uuid").status_code == 400


def test_request_of_a_node_is_exactly_what_the_upstream_received(proxy, upstream, key, cid):
    client, http = proxy.openai(key), proxy.http(key)
    system = {"role": "system", "content": "be exact"}
    say(client, cid, system, user("one"), extra_body={"custom": {"b": 1, "a": [1.5, 2]}})
    upstream.enqueue(Reply(content=None, tool_calls=[{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]))
    say(client, cid, user("two"), temperature=0.2)
    _, h = say(client, cid, {"role": "tool", "tool_call_id": "c1", "content": "result"}, max_tokens=50)
    received = upstream.last.body
    r = http.get(f"/admin/nodes/{h['x-node-id']}/request")
    assert r.status_code == 200
    assert r.json() == received
    assert r.headers["x-request-verified"] == "true"
    # streamed calls too (the stream_options we add are part of what was sent)
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=[user("s")], stream=True,
                                                           extra_headers={"X-Conversation-Id": cid})
    list(raw.parse())
    r = http.get(f"/admin/nodes/{raw.headers['x-node-id']}/request")
    assert r.json() == upstream.last.body and r.headers["x-request-verified"] == "true"


def test_request_replay_of_an_old_node_ignores_later_answers(proxy, upstream, key, cid):
    client, http = proxy.openai(key), proxy.http(key)
    _, a = say(client, cid, user("first"))
    first_request = upstream.last.body
    say(client, cid, user("second"))
    r = http.get(f"/admin/nodes/{a['x-node-id']}/request")
    assert r.json() == first_request and r.headers["x-request-verified"] == "true"


def test_admin_needs_a_key(proxy):
    import httpx

    r = httpx.get(f"{proxy.url}/admin/conversations")
    assert r.status_code == 401 and set(r.json()["error"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("method, path, body", [
    ("put", "/admin/conversations/{cid}/head", {"node": "x"}),
    ("put", "/admin/conversations/{cid}/head", {"node_id": "not-a-uuid"}),
    ("post", "/admin/conversations/{cid}/switch", {}),
    ("post", "/admin/conversations/{cid}/fork", {"conversation_id": "bad id with spaces"}),
])
def test_invalid_admin_bodies_are_400(proxy, upstream, key, cid, method, path, body):
    client, http = proxy.openai(key), proxy.http(key)
    say(client, cid, user("x"))
    r = getattr(http, method)(path.format(cid=cid), json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] in ("invalid_request", "invalid_conversation_id")


def test_a_validation_error_says_what_is_wrong_and_where(proxy, upstream, key, cid):
    http = proxy.http(key)
    err = http.get("/admin/conversations", params={"limit": 0}).json()["error"]
    assert err["param"] == "limit" and err["message"].startswith("limit: Expected `int` >= 1")
    say(proxy.openai(key), cid, user("x"))
    err = http.put(f"/admin/conversations/{cid}/head", json={"node_id": 5}).json()["error"]
    assert err["param"] == "node_id" and "got `int`" in err["message"]
    err = http.put(f"/admin/conversations/{cid}/head", json={}).json()["error"]
    assert err["param"] is None and "missing required field `node_id`" in err["message"]


def test_head_and_switch_errors(proxy, upstream, key, cid):
    client, http = proxy.openai(key), proxy.http(key)
    say(client, cid, user("x"))
    _, other = say(client, cid + "-2", user("y"))
    r = http.put(f"/admin/conversations/{cid}/head", json={"node_id": other["x-node-id"]})
    assert r.status_code == 404 and r.json()["error"]["code"] == "node_not_found"
    r = http.put(f"/admin/conversations/{cid}-missing/head", json={"node_id": None})
    assert r.status_code == 404 and r.json()["error"]["code"] == "conversation_not_found"
    r = http.post(f"/admin/conversations/{cid}/switch", json={"node_id": other["x-node-id"]})
    assert r.status_code == 404


@pytest.mark.parametrize("method, path", [
    ("put", "/admin/conversations/c/head"),
    ("post", "/admin/conversations/c/switch"),
    ("post", "/admin/conversations/c/fork"),
])
@pytest.mark.parametrize("auth", [{}, {"authorization": "Basic eDp5"}])
def test_a_caller_without_a_key_is_refused_before_its_body_is_read(proxy, method, path, auth):
    """A malformed body of a route whose body Litestar decodes: 401, not the 400 of the decoder
    (which would tell an anonymous caller what it made the proxy parse)."""
    import httpx

    r = httpx.request(method, proxy.url + path, content=b"{not json", headers={"content-type": "application/json", **auth})
    assert r.status_code == 401, r.text
    assert r.json()["error"]["type"] == "authentication_error"
