"""A Responses client offering what Codex offers by default -- function tools, functions grouped
under a ``namespace`` tool, a hosted ``web_search`` -- over a chat-completions upstream
(docs/behaviour.md#the-responses-api): the functions translate (namespaced ones under a reversible
name), the hosted tool is dropped and the answer says so; with ``unsupported_tools = "refuse"`` the
call is refused before anything is stored. Assertions on what the fake upstream received."""

from __future__ import annotations

import json

import httpx
import pytest

from proxy.errors import InvalidRequest
from proxy.failures import Failure
from storage import Outcome

from .conftest import Db, make_settings, serve_proxy
from .fakes import Reply
from .helpers import MODEL

SHELL = {"type": "function", "name": "shell", "description": "Run a command.",
         "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}
AGENTS = {"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents.",
          "tools": [{"type": "function", "name": "spawn_agent", "description": "Start one.",
                     "parameters": {"type": "object", "properties": {"task": {"type": "string"}}}}]}
TOOLS = [SHELL, AGENTS, {"type": "web_search"}]


def _create(proxy, key, cid, **body):
    with httpx.Client(base_url=proxy.url, timeout=30) as http:
        return http.post("/v1/responses", headers={"Authorization": f"Bearer {key}", "X-Conversation-Id": cid},
                         json={"model": MODEL, "tools": TOOLS, "tool_choice": "auto", **body})


def test_codex_default_tools_translate_and_the_hosted_one_is_dropped(proxy, upstream, key, cid, db):
    upstream.enqueue(Reply(content=None, tool_calls=[{"id": "call_1", "type": "function", "function": {
        "name": "multi_agent_v1__spawn_agent", "arguments": '{"task": "read the repo"}'}}]))
    r = _create(proxy, key, cid, input="split the work")
    assert r.status_code == 200, r.text
    assert r.headers["x-branchpoint-dropped-tools"] == "web_search"
    sent = upstream.last.body
    assert [t["function"]["name"] for t in sent["tools"]] == ["shell", "multi_agent_v1__spawn_agent"]
    assert sent["tools"][1]["function"]["description"] == "Start one." and sent["tool_choice"] == "auto"
    call = r.json()["output"][-1]
    assert (call["type"], call["name"], call.get("namespace"), call["call_id"]) == \
        ("function_call", "spawn_agent", "multi_agent_v1", "call_1")
    node = db.node(r.headers["x-node-id"])
    assert node["params"]["_bp_dropped_tools"] == ["web_search"]
    assert node["received"][-1]["namespace"] == "multi_agent_v1"

    # the client sends the call back (as Codex does, with its namespace) and its result
    r2 = _create(proxy, key, cid, input=[{**call, "id": call["id"]},
                                         {"type": "function_call_output", "call_id": "call_1", "output": "done"}],
                 previous_response_id=r.json()["id"])
    assert r2.status_code == 200, r2.text
    messages = upstream.last.body["messages"]
    assert messages[-2]["tool_calls"][0]["function"]["name"] == "multi_agent_v1__spawn_agent"
    assert messages[-1] == {"role": "tool", "tool_call_id": "call_1", "content": "done"}
    replay = httpx.get(f"{proxy.url}/admin/nodes/{r2.headers['x-node-id']}/request",
                       headers={"Authorization": f"Bearer {key}"})
    assert replay.headers["x-request-verified"] == "true"


def test_a_streamed_call_names_the_namespace_of_the_function_called(proxy, upstream, key, cid):
    upstream.enqueue(Reply(kind="stream", content=None, tool_calls=[{"id": "call_9", "type": "function", "function": {
        "name": "multi_agent_v1__spawn_agent", "arguments": '{"task": "x"}'}}]))
    r = _create(proxy, key, cid, input="go", stream=True)
    assert r.status_code == 200 and r.headers["x-branchpoint-dropped-tools"] == "web_search"
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    done = [e["item"] for e in events if e.get("type") == "response.output_item.done" and e["item"]["type"] == "function_call"]
    assert [(i["name"], i.get("namespace")) for i in done] == [("spawn_agent", "multi_agent_v1")]
    completed = next(e for e in events if e.get("type") == "response.completed")
    assert completed["response"]["output"][-1]["namespace"] == "multi_agent_v1"


@pytest.fixture
def refusing(fresh_database_url, upstream_url):
    settings = make_settings(fresh_database_url, upstream_url, server={"unsupported_tools": "refuse"})
    with serve_proxy(settings) as p:
        p.db = Db(fresh_database_url)  # type: ignore[attr-defined]
        yield p


def test_refuse_mode_answers_400_and_stores_nothing_so_the_head_stays(refusing, upstream, key, cid):
    first = _create(refusing, key, cid, input="hi", tools=[SHELL])
    assert first.status_code == 200
    head = refusing.db.head(cid)
    before = len(upstream.requests)
    r = _create(refusing, key, cid, input="search the web")
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request"
    assert "web_search" in r.json()["error"]["message"] and "x-node-id" not in r.headers
    assert len(upstream.requests) == before  # nothing sent
    assert refusing.db.head(cid) == head
    assert refusing.db.fetchval("SELECT count(*) FROM nodes WHERE conversation_id = $1", cid) == 1


def test_a_refusal_of_our_own_is_an_invalid_outcome_never_context():
    # a refusal raised after a node was made (the builder's) fails it as invalid: the head rule
    # keeps the head off it, whatever the refused field was
    assert Failure.from_error(InvalidRequest("no equivalent", param="tools")).outcome is Outcome.INVALID


@pytest.mark.parametrize(("choice", "name"), [
    ({"type": "function", "name": "spawn_agent"}, "multi_agent_v1__spawn_agent"),  # its namespace found
    ({"type": "function", "name": "spawn_agent", "namespace": "multi_agent_v1"}, "multi_agent_v1__spawn_agent"),
    ({"type": "function", "name": "shell"}, "shell"),
])
def test_a_tool_choice_naming_a_grouped_function_names_it_as_offered(proxy, upstream, key, cid, choice, name):
    r = _create(proxy, key, cid, input="go", tool_choice=choice)
    assert r.status_code == 200, r.text
    sent = upstream.last.body
    assert sent["tool_choice"] == {"type": "function", "function": {"name": name}}
    assert name in [t["function"]["name"] for t in sent["tools"]]


def test_a_tool_choice_name_two_namespaces_share_is_left_as_named(proxy, upstream, key, cid):
    other = {**AGENTS, "name": "agents_v2"}
    r = _create(proxy, key, cid, input="go", tools=[SHELL, AGENTS, other],
                tool_choice={"type": "function", "name": "spawn_agent"})
    assert r.status_code == 200, r.text
    assert upstream.last.body["tool_choice"] == {"type": "function", "function": {"name": "spawn_agent"}}
