"""Edges of a Responses client's tools over a translating upstream (docs/behaviour.md#the-responses-api):
a tool search the client runs, the tools it loaded (through a compaction too), custom tools, and
hosted tools dropped over an Anthropic upstream. Assertions on what the fake upstream received."""

from __future__ import annotations

import json

import httpx
import pytest

from .anthropic_fake import AReply
from .conftest import proxy_with
from .fakes import Reply
from .helpers import MODEL, responses_answer, tool_call
from .test_codex_tools import AGENTS, APPLY_PATCH, PATCH, SEARCH, SHELL


def _search_output(call_id, tools):
    return {"type": "tool_search_output", "call_id": call_id, "execution": "client", "tools": tools}


def test_allowed_tools_naming_the_tool_search_keeps_it(proxy, upstream, key, cid):
    client = proxy.openai(key, conversation=cid)
    client.responses.create(model=MODEL, input="go", tools=[SHELL, SEARCH, APPLY_PATCH], tool_choice={
        "type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "shell"}, {"type": "tool_search"}]})
    assert [t["function"]["name"] for t in upstream.last.body["tools"]] == ["shell", "tool_search"]


@pytest.fixture
def compacting(fresh_database_url, upstream_url):
    yield from proxy_with(fresh_database_url, upstream_url, compaction={"keep_recent": 2})


def test_the_tools_a_search_loaded_are_still_offered_after_a_compaction(compacting, upstream, key, cid):
    """The summary replaces the search's output; the tools it loaded are carried on the summary."""
    client = compacting.openai(key, conversation=cid)
    tools = [SHELL, SEARCH]
    upstream.enqueue(Reply(content=None, tool_calls=[tool_call("call_s", "tool_search", '{"query": "agents"}')]))
    first = client.responses.create(model=MODEL, input="split the work", tools=tools)
    upstream.enqueue(Reply(content="Loaded."))
    prev = client.responses.create(model=MODEL, previous_response_id=first.id, tools=tools,
                                   input=[_search_output("call_s", [AGENTS])]).id
    for i in range(3):
        upstream.enqueue(Reply(content=f"answer {i}"))
        prev = client.responses.create(model=MODEL, previous_response_id=prev, tools=tools, input=f"q {i}").id
    r = compacting.http(key).post(f"/admin/conversations/{cid}/compact")
    assert r.status_code == 200 and r.json()["compacted"] is True, r.text

    upstream.enqueue(Reply(content=None, tool_calls=[tool_call("call_b", "multi_agent_v1__spawn_agent", '{"task": "y"}')]))
    last = client.responses.create(model=MODEL, previous_response_id=prev, tools=tools, input="spawn another")
    assert (last.output[-1].name, last.output[-1].namespace) == ("spawn_agent", "multi_agent_v1")
    sent = upstream.last.body
    assert [t["function"]["name"] for t in sent["tools"]] == ["shell", "tool_search", "multi_agent_v1__spawn_agent"]
    summary = next(m for m in sent["messages"] if "Summary of the earlier part" in str(m.get("content")))
    assert set(summary) == {"role", "content"}  # (what it carries is the proxy's, never sent)
    assert "tool_search_output" not in json.dumps(sent["messages"])  # (the search itself was summarised)


def _native_answer(output):
    return json.dumps(responses_answer(output)).encode()


def test_a_responses_upstreams_search_call_gets_our_id_so_a_guide_order_resend_matches(mproxy, upstream, key, cid, db):
    """A native answer of a search call and a function call, sent back each followed by its
    result (OpenAI's function-calling guide): one answer, matched -- not the history again."""
    client = mproxy.openai(key, conversation=cid)
    upstream.enqueue(Reply(kind="raw", body=_native_answer([
        {"id": "tsc_upstream1", "type": "tool_search_call", "status": "completed", "call_id": "call_s",
         "execution": "client", "arguments": {"query": "agents"}},
        {"id": "fc_upstream2", "type": "function_call", "status": "completed", "call_id": "call_f",
         "name": "shell", "arguments": '{"command": "ls"}'}])))
    first = client.responses.create(model="native-1", input="go", tools=[SHELL, SEARCH])
    out = [o.model_dump(exclude_none=True) for o in first.output]
    assert [o["id"] for o in out] == [f"tsc_{first.id[5:]}_0", f"fc_{first.id[5:]}_1"]
    upstream.enqueue(Reply(kind="raw", body=_native_answer([
        {"id": "msg_up", "type": "message", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "text": "ok", "annotations": []}]}])))
    client.responses.create(model="native-1", tools=[SHELL, SEARCH], input=[
        {"role": "user", "content": "go"}, out[0], _search_output("call_s", [AGENTS]),
        out[1], {"type": "function_call_output", "call_id": "call_f", "output": "a.txt"}])
    nodes = db.fetch("SELECT id, parent_id, sent FROM nodes WHERE conversation_id = $1 ORDER BY created_at", cid)
    assert nodes[1]["parent_id"] == nodes[0]["id"]
    assert [i.get("type", "message") for i in nodes[1]["sent"]] == ["tool_search_output", "function_call_output"]


@pytest.mark.parametrize("hosted", [{"type": "web_search"}, {"type": "tool_search"}])
def test_codex_tools_with_a_hosted_one_over_anthropic_drop_it(mproxy, claude, key, cid, hosted):
    """Dropped by default over any translating upstream: an Anthropic one refused the call 400."""
    claude.enqueue(AReply(content=[{"type": "text", "text": "hi"}]))
    r = httpx.post(f"{mproxy.url}/v1/responses", headers={"Authorization": f"Bearer {key}", "X-Conversation-Id": cid},
                   json={"model": "claude-test", "input": "go", "tools": [SHELL, AGENTS, hosted, SEARCH, APPLY_PATCH]},
                   timeout=30)
    assert r.status_code == 200, r.text
    assert r.headers["x-branchpoint-dropped-tools"] == hosted["type"]
    assert [t["name"] for t in claude.last.body["tools"]] == ["shell", "multi_agent_v1__spawn_agent", "tool_search",
                                                               "apply_patch"]


def test_a_tool_choice_naming_a_function_two_searches_loaded(proxy, upstream, key, cid):
    client = proxy.openai(key, conversation=cid)
    upstream.enqueue(Reply(content=None, tool_calls=[tool_call("call_1", "tool_search", '{"query": "agents"}')]))
    first = client.responses.create(model=MODEL, input="go", tools=[SHELL, SEARCH])
    upstream.enqueue(Reply(content=None, tool_calls=[tool_call("call_2", "tool_search", '{"query": "spawn"}')]))
    second = client.responses.create(model=MODEL, previous_response_id=first.id, tools=[SHELL, SEARCH],
                                     input=[_search_output("call_1", [AGENTS])])
    upstream.enqueue(Reply(content="ok"))
    client.responses.create(model=MODEL, previous_response_id=second.id, tools=[SHELL, SEARCH],
                            tool_choice={"type": "function", "name": "spawn_agent"}, input=[_search_output("call_2", [AGENTS])])
    sent = upstream.last.body
    assert [t["function"]["name"] for t in sent["tools"]] == ["shell", "tool_search", "multi_agent_v1__spawn_agent"]
    assert sent["tool_choice"] == {"type": "function", "function": {"name": "multi_agent_v1__spawn_agent"}}


def test_conversation_items_with_a_tool_search_and_a_custom_tool(proxy, upstream, key):
    client = proxy.openai(key)
    conv = client.conversations.create()
    upstream.enqueue(Reply(content=None, tool_calls=[tool_call("call_s", "tool_search", '{"query": "agents"}'),
                                                     tool_call("call_p", "apply_patch", json.dumps({"input": PATCH}))]))
    client.responses.create(model=MODEL, conversation=conv.id, input="go", tools=[SEARCH, APPLY_PATCH])
    client.conversations.items.create(conv.id, items=[
        _search_output("call_s", [AGENTS]), {"type": "custom_tool_call_output", "call_id": "call_p", "output": "Done"}])
    listed = [i.model_dump() for i in client.conversations.items.list(conv.id, order="asc").data]
    assert [(i["type"], i.get("status")) for i in listed] == [
        ("message", "completed"), ("tool_search_call", "completed"), ("custom_tool_call", "completed"),
        ("tool_search_output", "completed"), ("custom_tool_call_output", "completed")]


def test_search_arguments_a_bare_string_are_a_query_object(proxy, upstream, key, cid):
    client = proxy.openai(key, conversation=cid)
    upstream.enqueue(Reply(content=None, tool_calls=[tool_call("call_s", "tool_search", '"agents"')]))
    first = client.responses.create(model=MODEL, input="go", tools=[SEARCH])
    assert first.output[-1].arguments == {"query": "agents"}
    upstream.enqueue(Reply(content="ok"))
    client.responses.create(model=MODEL, previous_response_id=first.id, tools=[SEARCH],
                            input=[_search_output("call_s", [AGENTS])])
    args = upstream.last.body["messages"][-2]["tool_calls"][0]["function"]["arguments"]
    assert json.loads(args) == {"query": "agents"}


def test_a_malformed_loaded_namespace_is_left_out_not_a_500(proxy, upstream, key, cid):
    def post(**body):
        return httpx.post(f"{proxy.url}/v1/responses", headers={"Authorization": f"Bearer {key}", "X-Conversation-Id": cid},
                          json={"model": MODEL, "tools": [SHELL, SEARCH], **body}, timeout=30)
    upstream.enqueue(Reply(content=None, tool_calls=[tool_call("call_s", "tool_search", '{"query": "x"}')]))
    first = post(input="go")
    assert first.status_code == 200
    upstream.enqueue(Reply(content="ok"))
    r = post(previous_response_id=first.json()["id"],
             input=[_search_output("call_s", [{"type": "namespace", "name": "x", "tools": 5}])])
    assert r.status_code == 200, r.text
    assert [t["function"]["name"] for t in upstream.last.body["tools"]] == ["shell", "tool_search"]
