"""A Responses client offering what Codex offers by default -- function tools, functions grouped
under a ``namespace`` tool, a hosted ``web_search`` -- over a chat-completions upstream
(docs/behaviour.md#the-responses-api): the functions translate (namespaced ones under a reversible
name), the hosted tool is dropped and the answer says so; with ``unsupported_tools = "refuse"`` the
call is refused before anything is stored. And a custom tool (free-form input: Codex's
``apply_patch`` for its newer models) as a function of one string, its call coming back custom.
Assertions on what the fake upstream received."""

from __future__ import annotations

import json

import httpx
import pytest

from proxy.errors import InvalidRequest
from proxy.failures import Failure
from storage import Outcome

from .anthropic_fake import AReply
from .conftest import proxy_with
from .fakes import Reply
from .helpers import MODEL, tool_call

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
    yield from proxy_with(fresh_database_url, upstream_url, server={"unsupported_tools": "refuse"})


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


# -- custom tools (free-form input, as Codex offers apply_patch to its newer models) -----------------

PATCH_GRAMMAR = 'start: "*** Begin Patch" LF hunk+ "*** End Patch" LF?\nhunk: /[^\\n]*/ LF'
APPLY_PATCH = {"type": "custom", "name": "apply_patch",
               "description": "Edit files. This is a FREEFORM tool, so do not wrap the patch in JSON.",
               "format": {"type": "grammar", "syntax": "lark", "definition": PATCH_GRAMMAR}}
PATCH = '*** Begin Patch\n*** Add File: hello.txt\n+hi "there"\n*** End Patch\n'


def test_a_custom_tool_is_a_function_of_one_string_and_its_call_comes_back_custom(proxy, upstream, key, cid, db):
    client = proxy.openai(key, conversation=cid)
    upstream.enqueue(Reply(content=None, tool_calls=[tool_call("call_p", "apply_patch", json.dumps({"input": PATCH}))]),
                     Reply(content="Patched."))
    raw = client.responses.with_raw_response.create(model=MODEL, input="add hello.txt", tools=[SHELL, APPLY_PATCH])
    first = raw.parse()
    assert "x-branchpoint-dropped-tools" not in raw.headers  # offered, not dropped
    offered = upstream.last.body["tools"][1]
    assert offered["type"] == "function" and offered["function"]["name"] == "apply_patch"
    assert offered["function"]["parameters"] == {"type": "object", "properties": {"input": {"type": "string"}},
                                                 "required": ["input"], "additionalProperties": False}
    description = offered["function"]["description"]
    assert description.startswith(APPLY_PATCH["description"]) and PATCH_GRAMMAR in description and "`input`" in description
    call = first.output[-1]
    assert (call.type, call.name, call.call_id, call.input) == ("custom_tool_call", "apply_patch", "call_p", PATCH)
    assert call.id.startswith("ctc_")

    # the client runs it and sends the call and its output back, the whole history (as Codex does)
    second = client.responses.create(model=MODEL, tools=[SHELL, APPLY_PATCH], input=[
        {"role": "user", "content": "add hello.txt"},
        {"type": "custom_tool_call", "call_id": "call_p", "name": "apply_patch", "input": PATCH},
        {"type": "custom_tool_call_output", "call_id": "call_p", "output": "Done: A hello.txt"},
    ])
    assert second.output_text == "Patched."
    messages = upstream.last.body["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert messages[1]["tool_calls"][0]["function"]["name"] == "apply_patch"
    assert json.loads(messages[1]["tool_calls"][0]["function"]["arguments"]) == {"input": PATCH}
    assert messages[2] == {"role": "tool", "tool_call_id": "call_p", "content": "Done: A hello.txt"}
    # the resent history matched what was stored: the new node holds only the result, under the first
    nodes = db.fetch("SELECT id, parent_id, sent FROM nodes WHERE conversation_id = $1 ORDER BY created_at", cid)
    assert len(nodes) == 2 and nodes[1]["parent_id"] == nodes[0]["id"]
    assert [i["type"] for i in nodes[1]["sent"]] == ["custom_tool_call_output"]


def test_a_streamed_custom_tool_call_gives_its_input_events(proxy, upstream, key, cid):
    client = proxy.openai(key, conversation=cid)
    upstream.enqueue(Reply(kind="stream", content="Let me patch it.",
                           tool_calls=[tool_call("call_s", "apply_patch", json.dumps({"input": PATCH}))]))
    with client.responses.stream(model=MODEL, input="add hello.txt", tools=[APPLY_PATCH]) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert "response.function_call_arguments.delta" not in kinds
    deltas = "".join(e.delta for e in events if e.type == "response.custom_tool_call_input.delta")
    done = [e for e in events if e.type == "response.custom_tool_call_input.done"]
    assert deltas == PATCH and [e.input for e in done] == [PATCH]
    added = next(e.item for e in events if e.type == "response.output_item.added" and e.item.type == "custom_tool_call")
    assert (added.name, added.call_id, added.input) == ("apply_patch", "call_s", "")
    item = next(e.item for e in events if e.type == "response.output_item.done" and e.item.type == "custom_tool_call")
    assert (item.id, item.input) == (added.id, PATCH) and done[0].item_id == item.id
    assert [(o.type, getattr(o, "input", None)) for o in final.output][-1] == ("custom_tool_call", PATCH)
    assert final.output_text == "Let me patch it."


def test_a_custom_tool_in_a_namespace_and_a_tool_choice_naming_one(proxy, upstream, key, cid):
    tools = [{"type": "namespace", "name": "editor", "description": "Edit.", "tools": [{**APPLY_PATCH, "format": {"type": "text"}}]},
             APPLY_PATCH]
    # a model that wrote its patch without the one argument: the client gets what it wrote
    upstream.enqueue(Reply(content=None, tool_calls=[tool_call("call_n", "editor__apply_patch", "not json at all")]))
    r = _create(proxy, key, cid, input="go", tools=tools, tool_choice={"type": "custom", "name": "apply_patch"})
    assert r.status_code == 200, r.text
    sent = upstream.last.body
    assert [t["function"]["name"] for t in sent["tools"]] == ["editor__apply_patch", "apply_patch"]
    assert sent["tool_choice"] == {"type": "function", "function": {"name": "apply_patch"}}
    assert "grammar" not in sent["tools"][0]["function"]["description"]  # (a text format says nothing more)
    call = r.json()["output"][-1]
    assert (call["type"], call["name"], call["namespace"], call["input"]) == \
        ("custom_tool_call", "apply_patch", "editor", "not json at all")



def test_a_custom_tool_over_an_anthropic_upstream(mproxy, claude, key, cid):
    # the same function of one string reaches Claude as a tool, and its tool_use comes back custom
    claude.enqueue(AReply(content=[{"type": "tool_use", "id": "toolu_1", "name": "apply_patch", "input": {"input": PATCH}}],
                          stop_reason="tool_use"))
    first = mproxy.openai(key, conversation=cid).responses.create(model="claude-test", input="add hello.txt",
                                                                  tools=[APPLY_PATCH])
    (tool,) = claude.last.body["tools"]
    assert tool["name"] == "apply_patch" and tool["input_schema"]["required"] == ["input"]
    call = first.output[-1]
    assert (call.type, call.name, call.call_id, call.input) == ("custom_tool_call", "apply_patch", "toolu_1", PATCH)
    claude.enqueue(AReply(content=[{"type": "text", "text": "Patched."}]))
    second = mproxy.openai(key, conversation=cid).responses.create(
        model="claude-test", tools=[APPLY_PATCH], previous_response_id=first.id,
        input=[{"type": "custom_tool_call_output", "call_id": "toolu_1", "output": "Done"}])
    assert second.output_text == "Patched."
    use, result = claude.last.body["messages"][-2:]
    assert use["content"][-1] == {"type": "tool_use", "id": "toolu_1", "name": "apply_patch", "input": {"input": PATCH}}
    assert result["content"][0]["type"] == "tool_result" and result["content"][0]["tool_use_id"] == "toolu_1"


# -- a tool search the client runs (Codex's deferred tools: its sub-agents, MCP tools) ------------

SEARCH = {"type": "tool_search", "execution": "client", "description": "Search deferred tools.",
          "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}


def test_a_client_tool_search_and_the_tools_it_loaded_over_chat(proxy, upstream, key, cid, db):
    client = proxy.openai(key, conversation=cid)
    upstream.enqueue(Reply(content=None, tool_calls=[tool_call("call_s", "tool_search", '{"query": "agents"}')]))
    raw = client.responses.with_raw_response.create(model=MODEL, input="split the work", tools=[SHELL, SEARCH])
    first = raw.parse()
    assert "x-branchpoint-dropped-tools" not in raw.headers
    offered = {t["function"]["name"]: t["function"] for t in upstream.last.body["tools"]}
    assert list(offered) == ["shell", "tool_search"]
    assert offered["tool_search"]["parameters"] == SEARCH["parameters"]
    assert offered["tool_search"]["description"] == "Search deferred tools."
    call = first.output[-1]
    assert (call.type, call.call_id, call.execution, call.arguments) == \
        ("tool_search_call", "call_s", "client", {"query": "agents"})

    # the client searched and sends the whole history back with what it loaded (as Codex does)
    history = [{"role": "user", "content": "split the work"},
               {"type": "tool_search_call", "call_id": "call_s", "execution": "client", "arguments": {"query": "agents"}},
               {"type": "tool_search_output", "call_id": "call_s", "execution": "client", "tools": [AGENTS]}]
    upstream.enqueue(Reply(content=None, tool_calls=[tool_call("call_a", "multi_agent_v1__spawn_agent", '{"task": "x"}')]))
    second = client.responses.create(model=MODEL, input=history, tools=[SHELL, SEARCH])
    sent = upstream.last.body
    assert [t["function"]["name"] for t in sent["tools"]] == ["shell", "tool_search", "multi_agent_v1__spawn_agent"]
    assert json.loads(sent["messages"][1]["tool_calls"][0]["function"]["arguments"]) == {"query": "agents"}
    assert sent["messages"][2] == {"role": "tool", "tool_call_id": "call_s",
                                   "content": "Tools loaded: multi_agent_v1__spawn_agent."}
    spawned = second.output[-1]
    assert (spawned.type, spawned.name, spawned.namespace) == ("function_call", "spawn_agent", "multi_agent_v1")

    # later calls still have them (they are in the conversation's history, not in the request)
    upstream.enqueue(Reply(content="Spawned."))
    third = client.responses.create(model=MODEL, previous_response_id=second.id, tools=[SHELL, SEARCH],
                                    input=[{"type": "function_call_output", "call_id": "call_a", "output": "ok"}])
    assert third.output_text == "Spawned."
    assert "multi_agent_v1__spawn_agent" in [t["function"]["name"] for t in upstream.last.body["tools"]]
    nodes = db.fetch("SELECT id, parent_id FROM nodes WHERE conversation_id = $1 ORDER BY created_at", cid)
    assert len(nodes) == 3 and nodes[1]["parent_id"] == nodes[0]["id"]  # the resent history matched
    for response in (second, third):  # what was sent is rebuilt from the tree alike
        replay = httpx.get(f"{proxy.url}/admin/nodes/{response.id[5:]}/request", headers={"Authorization": f"Bearer {key}"})
        assert replay.headers["x-request-verified"] == "true", response.id


def test_a_streamed_tool_search_call(proxy, upstream, key, cid):
    upstream.enqueue(Reply(kind="stream", content=None, tool_calls=[tool_call("call_s", "tool_search", '{"query": "mcp"}')]))
    with proxy.openai(key, conversation=cid).responses.stream(model=MODEL, input="go", tools=[SEARCH]) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert not [e for e in events if "arguments" in e.type]
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [(i.type, i.arguments) for i in done] == [("tool_search_call", {"query": "mcp"})]
    assert final.output[-1].call_id == "call_s"
