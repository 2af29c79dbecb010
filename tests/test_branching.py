"""Edits, regenerations, branch switches, transforms and forks -- all by choosing a parent and
moving a pointer (docs/behaviour.md), checked on what the upstream received."""

import json
import threading

import openai
import pytest

from .conftest import wait_for
from .fakes import Reply
from .helpers import say, user

SQL_DOMESTIC = "SELECT customer, sum(amount) FROM sales_domestic WHERE month = '2026-10' GROUP BY 1 ORDER BY 2 DESC LIMIT 10"
SQL_GLOBAL = "SELECT customer, sum(amount) FROM sales_all_entities WHERE month = '2026-10' GROUP BY 1 ORDER BY 2 DESC LIMIT 10"
TOOLS = [{"type": "function", "function": {"name": "run_sql", "parameters": {"type": "object", "properties": {"sql": {"type": "string"}}}}}]


def sql_call(id_, sql):
    return {"id": id_, "type": "function", "function": {"name": "run_sql", "arguments": json.dumps({"sql": sql})}}


def test_the_seed_sales_example_edit_never_sees_the_old_answer(proxy, upstream, key, cid):
    client = proxy.openai(key)
    http = proxy.http(key)
    _, hi = say(client, cid, user("Hi, I need sales figures."))

    # the question, answered with a tool call over a domestic-only table, its result, the answer
    upstream.enqueue(Reply(content=None, tool_calls=[sql_call("call_dom", SQL_DOMESTIC)]))
    _, q1 = say(client, cid, user("Top 10 customers by sales last month?"), tools=TOOLS)
    upstream.enqueue(Reply(content="Top customers: Hanbit 912,000,000; Daewon 455,000,000."))
    _, a1 = say(client, cid, {"role": "tool", "tool_call_id": "call_dom", "content": "Hanbit|912000000\nDaewon|455000000"}, tools=TOOLS)

    # the user edits the question: it hangs where the old one hung, under the greeting turn
    upstream.enqueue(Reply(content=None, tool_calls=[sql_call("call_all", SQL_GLOBAL)]))
    _, q2 = say(client, cid, user("Top 10 customers by sales last month, including foreign subsidiaries?"),
                parent=hi["x-node-id"], tools=TOOLS)
    assert q2["x-parent-node-id"] == hi["x-node-id"]
    sent = upstream.last.text()
    for old in ("sales_domestic", "call_dom", "Hanbit", "912000000", "Top customers", "Top 10 customers by sales last month?"):
        assert old not in sent, old
    assert [m["role"] for m in upstream.last.messages] == ["user", "assistant", "user"]
    upstream.enqueue(Reply(content="Including subsidiaries: Hanbit Japan leads."))
    _, a2 = say(client, cid, {"role": "tool", "tool_call_id": "call_all", "content": "Hanbit Japan|1200000000"}, tools=TOOLS)
    assert "sales_domestic" not in upstream.last.text()

    # the old branch is still there: 1/2 and 2/2 on the question
    assert http.get(f"/admin/nodes/{q1['x-node-id']}").json()["status"] == "success"
    path = http.get(f"/admin/conversations/{cid}/path").json()["data"]
    assert [n["id"] for n in path] == [hi["x-node-id"], q2["x-node-id"], a2["x-node-id"]]
    assert (path[1]["sibling_index"], path[1]["sibling_count"]) == (2, 2)
    assert (path[0]["sibling_index"], path[0]["sibling_count"]) == (1, 1)

    # switching back makes the old branch the context again
    r = http.post(f"/admin/conversations/{cid}/switch", json={"node_id": q1["x-node-id"]})
    assert r.status_code == 200 and r.json()["head_node_id"] == a1["x-node-id"]
    path = http.get(f"/admin/conversations/{cid}/path").json()["data"]
    assert (path[1]["id"], path[1]["sibling_index"], path[1]["sibling_count"]) == (q1["x-node-id"], 1, 2)
    say(client, cid, user("Thanks. And the month before?"))
    assert "sales_domestic" in upstream.last.text() and "Hanbit Japan" not in upstream.last.text()


def test_regenerate_is_the_same_parent_and_question_again(proxy, upstream, key, cid):
    client, http = proxy.openai(key), proxy.http(key)
    _, a = say(client, cid, user("one"))
    upstream.enqueue(Reply(content="first draft"))
    _, b = say(client, cid, user("two"))
    upstream.enqueue(Reply(content="second draft"))
    _, b2 = say(client, cid, user("two"), parent=a["x-node-id"])
    assert upstream.last.messages == [user("one"), {"role": "assistant", "content": "echo: one"}, user("two")]
    path = http.get(f"/admin/conversations/{cid}/path").json()["data"]
    assert path[-1]["id"] == b2["x-node-id"] and (path[-1]["sibling_index"], path[-1]["sibling_count"]) == (2, 2)
    say(client, cid, user("three"))
    assert "second draft" in upstream.last.text() and "first draft" not in upstream.last.text()


def test_edit_of_the_very_first_question_is_a_new_root(proxy, upstream, key, cid):
    client, http = proxy.openai(key), proxy.http(key)
    say(client, cid, user("first version"))
    say(client, cid, user("follow-up"))
    _, h = say(client, cid, user("second version"), parent="root")
    assert h["x-parent-node-id"] == "root"
    assert upstream.last.messages == [user("second version")]
    path = http.get(f"/admin/conversations/{cid}/path").json()["data"]
    assert len(path) == 1 and (path[0]["sibling_index"], path[0]["sibling_count"]) == (2, 2)


def test_parent_must_belong_to_the_conversation_and_tenant(proxy, upstream, key, cid):
    client = proxy.openai(key)
    _, mine = say(client, cid, user("mine"))
    _, other_conv = say(client, cid + "-other", user("other conversation"))
    _, foreign = say(proxy.openai(), cid, user("another tenant"))
    for parent in (other_conv["x-node-id"], foreign["x-node-id"], "01a22aa9-0000-7000-8000-000000000000"):
        with pytest.raises(openai.NotFoundError) as e:
            say(client, cid, user("x"), parent=parent)
        assert e.value.body["code"] == "node_not_found"
    # a given parent in a conversation that does not exist yet: 404, and nothing is created
    with pytest.raises(openai.NotFoundError):
        say(client, cid + "-new", user("x"), parent=mine["x-node-id"])
    assert proxy.http(key).get(f"/admin/conversations/{cid}-new").status_code == 404


def test_transform_calls_see_the_context_never_move_the_head_and_chain_retries(proxy, upstream, key, cid, db):
    client, http = proxy.openai(key), proxy.http(key)
    say(client, cid, user("we discussed a deployment checklist"))
    _, t = say(client, cid, user("turn this conversation into a JSON playbook"), kind="transform")
    head = db.head(cid)
    assert t["x-parent-node-id"] == head and db.node(t["x-node-id"])["kind"] == "transform"
    assert "deployment checklist" in upstream.last.text()
    assert http.get(f"/admin/conversations/{cid}").json()["head_node_id"] == head  # unmoved
    # the validation failed: retry under the previous transform node, seeing the earlier attempt
    upstream.enqueue(Reply(content='{"steps": ["fixed"]}'))
    _, t2 = say(client, cid, user("validation error: steps[0] must be an object"), kind="transform", parent=t["x-node-id"])
    assert t2["x-parent-node-id"] == t["x-node-id"]
    msgs = upstream.last.messages
    assert msgs[-3:] == [user("turn this conversation into a JSON playbook"),
                         {"role": "assistant", "content": "echo: turn this conversation into a JSON playbook"},
                         user("validation error: steps[0] must be an object")]
    # neither the draft nor the validation error enters the next turn's context
    say(client, cid, user("next question"))
    assert "playbook" not in upstream.last.text() and "validation error" not in upstream.last.text()
    # a failed transform does not move the head either
    upstream.enqueue(Reply(kind="error", status=500))
    with pytest.raises(openai.InternalServerError):
        say(client, cid, user("again"), kind="transform")
    assert db.head(cid) != db.fetchval("SELECT id::text FROM nodes WHERE conversation_id = $1 ORDER BY created_at DESC LIMIT 1", cid)


def test_two_simultaneous_turn_calls_exactly_one_proceeds(proxy, upstream, key, cid):
    client = proxy.openai(key)
    say(client, cid, user("setup"))
    upstream.enqueue(Reply(content="slow", delay=0.8), Reply(content="slow", delay=0.8))
    barrier = threading.Barrier(2)
    results = []

    def call(text):
        barrier.wait()
        try:
            say(client, cid, user(text))
            results.append("ok")
        except openai.ConflictError as e:
            results.append(e.body["code"])

    threads = [threading.Thread(target=call, args=(f"t{i}",)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ["conversation_busy", "ok"]
    assert len(upstream.chat_requests) == 2  # setup + the one that proceeded


def test_transforms_do_not_take_the_lease(proxy, upstream, key, cid):
    client = proxy.openai(key)
    say(client, cid, user("setup"))
    upstream.enqueue(Reply(content="slow turn", delay=1.0))
    t = threading.Thread(target=lambda: say(client, cid, user("long turn")))
    t.start()
    upstream.wait_for(2)
    _, h = say(client, cid, user("side task"), kind="transform")  # no 409
    assert h["x-node-id"]
    t.join()


def test_head_moves_are_refused_while_a_turn_is_in_flight(proxy, upstream, key, cid):
    client, http = proxy.openai(key), proxy.http(key)
    _, first = say(client, cid, user("setup"))
    upstream.enqueue(Reply(content="slow", delay=1.0))
    t = threading.Thread(target=lambda: say(client, cid, user("long turn")))
    t.start()
    upstream.wait_for(2)
    r = http.put(f"/admin/conversations/{cid}/head", json={"node_id": first["x-node-id"]})
    assert r.status_code == 409 and r.json()["error"]["code"] == "conversation_busy"
    r = http.post(f"/admin/conversations/{cid}/switch", json={"node_id": first["x-node-id"]})
    assert r.status_code == 409
    assert http.get(f"/admin/conversations/{cid}").json()["busy"] is True
    r = http.delete(f"/admin/conversations/{cid}")
    assert r.status_code == 409
    t.join()
    assert http.get(f"/admin/conversations/{cid}").json()["busy"] is False
    assert http.put(f"/admin/conversations/{cid}/head", json={"node_id": first["x-node-id"]}).status_code == 200


def test_a_fork_never_starts_on_a_call_in_flight(proxy, upstream, key, cid, db):
    """As a head move to it is refused, so is a fork whose head would be a node still in flight."""
    client, http = proxy.openai(key), proxy.http(key)
    say(client, cid, user("setup"))
    hold = threading.Event()
    upstream.enqueue(Reply(content="side answer", hold=hold))
    t = threading.Thread(target=lambda: say(client, cid, user("side task"), kind="transform"))
    t.start()
    try:
        pending = wait_for(lambda: db.fetchval("SELECT id FROM nodes WHERE conversation_id = $1 AND outcome IS NULL", cid),
                           what="the side call in flight")
        r = http.post(f"/admin/conversations/{cid}/fork", json={"conversation_id": f"{cid}-f", "node_id": str(pending)})
        assert r.status_code == 409 and r.json()["error"]["code"] == "node_pending"
        assert "x-should-retry" not in r.headers  # (the call in flight ends: asking again may go through)
        assert http.get(f"/admin/conversations/{cid}-f").status_code == 404  # nothing made
    finally:
        hold.set()
        t.join()
    r = http.post(f"/admin/conversations/{cid}/fork", json={"conversation_id": f"{cid}-f", "node_id": str(pending)})
    assert r.status_code == 200 and r.json()["head_node_id"] == str(pending)


def test_between_rounds_a_head_move_abandons_the_turn(proxy, upstream, key, cid):
    client, http = proxy.openai(key), proxy.http(key)
    _, first = say(client, cid, user("hello"))
    upstream.enqueue(Reply(content=None, tool_calls=[sql_call("call_1", "select 1")]))
    say(client, cid, user("query something"), tools=TOOLS)
    # while the client would run its tool, the user moves the head back: allowed (nothing in flight)
    assert http.put(f"/admin/conversations/{cid}/head", json={"node_id": first["x-node-id"]}).status_code == 200
    say(client, cid, user("something else"))
    assert "call_1" not in upstream.last.text()


def test_clearing_the_head_starts_a_new_root_and_deletes_nothing(proxy, upstream, key, cid, db):
    client, http = proxy.openai(key), proxy.http(key)
    say(client, cid, user("remember the code word: tangerine"))
    r = http.put(f"/admin/conversations/{cid}/head", json={"node_id": None})
    assert r.status_code == 200 and r.json()["head_node_id"] is None
    _, h = say(client, cid, user("what was the code word?"))
    assert h["x-parent-node-id"] == "root" and "tangerine" not in upstream.last.text()
    assert http.get(f"/admin/conversations/{cid}").json()["node_count"] == 2


def test_fork_isolation_both_ways(proxy, upstream, key, cid):
    client, http = proxy.openai(key), proxy.http(key)
    say(client, cid, user("shared one"))
    _, shared2 = say(client, cid, user("shared two"))
    r = http.post(f"/admin/conversations/{cid}/fork", json={"conversation_id": f"{cid}-b"})
    assert r.status_code == 200 and r.json()["head_node_id"] == shared2["x-node-id"] and r.json()["forked_from"] == cid
    fork = f"{cid}-b"
    say(client, cid, user("only in A"))
    say(client, fork, user("only in B"))
    assert "shared one" in upstream.last.text() and "shared two" in upstream.last.text()
    assert "only in A" not in upstream.last.text()
    say(client, cid, user("A again"))
    assert "only in B" not in upstream.last.text() and "only in A" in upstream.last.text()
    say(client, fork, user("B again"))
    assert "only in A" not in upstream.last.text() and "only in B" in upstream.last.text()
    # the fork's path reaches back into the source; siblings count only what the fork can see
    path = http.get(f"/admin/conversations/{fork}/path").json()["data"]
    assert [n["conversation_id"] for n in path] == [cid, cid, fork, fork]
    assert all(n["sibling_count"] == 1 for n in path)
    # an edit inside the fork may hang under a shared node; A's own later nodes stay out of reach
    a_nodes = http.get(f"/admin/conversations/{cid}/tree").json()["data"]
    only_a = next(n for n in a_nodes if n["preview"] == "echo: only in A")
    with pytest.raises(openai.NotFoundError):
        say(client, fork, user("x"), parent=only_a["id"])
    _, edit = say(client, fork, user("B edit"), parent=shared2["x-node-id"])
    assert upstream.last.messages[-1] == user("B edit") and "only in A" not in upstream.last.text()
    # switching inside the fork never walks onto A's branch
    r = http.post(f"/admin/conversations/{fork}/switch", json={"node_id": shared2["x-node-id"]})
    assert r.json()["head_node_id"] == edit["x-node-id"]


def test_a_fork_without_a_body_forks_the_head_under_a_new_id(proxy, upstream, key, cid):
    client, http = proxy.openai(key), proxy.http(key)
    _, head = say(client, cid, user("one"))
    r = http.post(f"/admin/conversations/{cid}/fork")  # both fields are optional: so is the body
    assert r.status_code == 200, r.text
    fork = r.json()
    assert fork["forked_from"] == cid and fork["head_node_id"] == head["x-node-id"] and fork["id"] != cid
    # where a body is required, its absence is said so (not Litestar's KeyError text)
    err = http.post(f"/admin/conversations/{cid}/switch").json()["error"]
    assert err["code"] == "invalid_request" and err["message"] == "this endpoint takes a JSON body"


def test_fork_from_a_given_node_and_errors(proxy, upstream, key, cid):
    client, http = proxy.openai(key), proxy.http(key)
    _, first = say(client, cid, user("first"))
    say(client, cid, user("second"))
    r = http.post(f"/admin/conversations/{cid}/fork", json={"node_id": first["x-node-id"]})
    assert r.status_code == 200
    fork = r.json()["id"]
    assert r.json()["head_node_id"] == first["x-node-id"]
    say(client, fork, user("from the first"))
    assert upstream.last.messages == [user("first"), {"role": "assistant", "content": "echo: first"}, user("from the first")]
    taken = http.post(f"/admin/conversations/{cid}/fork", json={"conversation_id": fork})
    assert taken.json()["error"]["code"] == "conversation_exists" and taken.headers["x-should-retry"] == "false"
    assert http.post(f"/admin/conversations/{cid}-nope/fork", json={}).status_code == 404
    assert http.post(f"/admin/conversations/{cid}/fork", json={"node_id": "01a22aa9-0000-7000-8000-000000000000"}).json()["error"]["code"] == "node_not_found"
    assert http.post(f"/admin/conversations/{cid}/fork", json={"bogus": 1}).status_code == 400
    # another tenant cannot fork it
    assert proxy.http("sk-someone-else").post(f"/admin/conversations/{cid}/fork", json={}).status_code == 404


def test_delete_keeps_what_a_fork_still_reaches(proxy, upstream, key, cid, db):
    client, http = proxy.openai(key), proxy.http(key)
    say(client, cid, user("shared"))
    http.post(f"/admin/conversations/{cid}/fork", json={"conversation_id": f"{cid}-f"})
    say(client, cid, user("A only"))
    r = http.delete(f"/admin/conversations/{cid}")
    assert r.status_code == 200 and r.json() == {"id": cid, "deleted": True, "nodes_deleted": 1, "nodes_kept": 1,
                                                 "object": "conversation.deleted"}
    assert http.get(f"/admin/conversations/{cid}").status_code == 404
    say(client, f"{cid}-f", user("fork continues"))
    assert "shared" in upstream.last.text() and "A only" not in upstream.last.text()
    r = http.delete(f"/admin/conversations/{cid}-f")
    assert r.json()["nodes_deleted"] == 2  # its own node and the source node nothing reaches now
    assert db.fetchval("SELECT count(*) FROM nodes WHERE conversation_id IN ($1, $2)", cid, f"{cid}-f") == 0
    # a new conversation with the old id starts clean
    say(client, cid, user("fresh"))
    assert upstream.last.messages == [user("fresh")]
    assert http.delete(f"/admin/conversations/{cid}-never").status_code == 404
