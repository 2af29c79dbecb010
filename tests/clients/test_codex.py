"""OpenAI's Codex CLI (npm ``@openai/codex``), unmodified, headless (``codex exec``, then ``codex
exec resume --last``), with its default tools, pointed at ``/auto/v1`` by a custom model provider
in its config -- the README's "Use it with" snippet. Its session is one conversation (named by its
``session-id`` header), each node holds only what is new, and the fake upstream gets each history
once. ``codex exec fork`` -- a new session resending the old one's history -- is a fork of it."""

import json

import pytest

from ..anthropic_fake import AReply, FakeAnthropic
from ..conftest import tenant_of
from ..fakes import Reply
from ..helpers import tool_call
from .conftest import anthropic_proxy, conversations_of, each_history_once, nodes_of, npm_bin, offline_env, run

pytestmark = pytest.mark.clients

# the README's snippet, with the proxy's address filled in ({base_url})
CODEX_CONFIG = """\
model = "gpt-5-codex"
model_provider = "branchpoint"
check_for_update_on_startup = false

[analytics]
enabled = false

[model_providers.branchpoint]
name = "Branchpoint"
base_url = "{base_url}"
env_key = "BRANCHPOINT_API_KEY"
wire_api = "responses"
"""


def codex_setup(home, proxy, key):
    codex_home = home / ".codex"
    codex_home.mkdir()
    (codex_home / "config.toml").write_text(CODEX_CONFIG.format(base_url=f"{proxy.url}/auto/v1"))
    work = home / "project"
    work.mkdir()
    return work, offline_env(home, CODEX_HOME=str(codex_home), BRANCHPOINT_API_KEY=key)


def session_id(output: str) -> str:
    return next(line.split(":", 1)[1].strip() for line in output.splitlines() if line.startswith("session id:"))


def test_codex_two_turns_a_tool_round_and_a_fork(proxy, upstream, key, db, client_home):
    codex = npm_bin("codex")
    work, env = codex_setup(client_home, proxy, key)
    upstream.enqueue(
        Reply(content=None, tool_calls=[tool_call("call_c1", "exec_command", json.dumps({"cmd": "echo tool-output-42"}))]),
        Reply(content="The command printed tool-output-42."),
        Reply(content="Second answer."),
    )
    first = run([codex, "exec", "--skip-git-repo-check", "Run echo tool-output-42"], cwd=work, env=env)
    assert "The command printed tool-output-42." in first.stdout
    second = run([codex, "exec", "--skip-git-repo-check", "resume", "--last", "And now the second question"],
                 cwd=work, env=env)
    assert "Second answer." in second.stdout
    session = session_id(first.stderr + first.stdout)
    assert session_id(second.stderr + second.stdout) == session

    # what the upstream received: three calls (the tool round, its answer, the second turn), each
    # history once, the tool's real output fed back, Codex's default tools offered
    calls = upstream.turn_requests
    assert len(calls) == 3
    each_history_once(calls)
    assert [m["role"] for m in calls[2].messages[-4:]] == ["assistant", "tool", "assistant", "user"]
    assert "tool-output-42" in calls[1].messages[-1]["content"] and calls[1].messages[-1]["tool_call_id"] == "call_c1"
    assert calls[2].messages[-1]["content"] == "And now the second question"
    assert all(c.headers.get("session-id") == session for c in calls)
    tools = {t["function"]["name"] for t in calls[0].body["tools"]}
    assert "exec_command" in tools  # its shell tool
    assert any(name.startswith("multi_agent_v1__") for name in tools)  # its namespace tool, flattened
    # system/developer messages where Codex put them: its instructions first
    assert [m["role"] for m in calls[0].messages[:2]] == ["developer", "developer"]

    # what was stored: one conversation, the session's id; three nodes in a line, each only new items
    tenant = tenant_of(key)
    assert [c["id"] for c in conversations_of(db, tenant)] == [session]
    nodes = nodes_of(db, tenant, session)
    assert len(nodes) == 3
    assert nodes[0]["parent_id"] is None and nodes[1]["parent_id"] == nodes[0]["id"] and nodes[2]["parent_id"] == nodes[1]["id"]
    assert [n["api"] for n in nodes] == ["responses"] * 3
    user_texts = [json.dumps(i) for i in nodes[0]["sent"] if i.get("role") == "user"]
    assert len(user_texts) == 2 and "environment_context" in user_texts[0] and "Run echo tool-output-42" in user_texts[1]
    assert [i["type"] for i in nodes[1]["sent"]] == ["function_call_output"]
    assert "tool-output-42" in nodes[1]["sent"][0]["output"]
    assert len(nodes[2]["sent"]) == 1 and "And now the second question" in json.dumps(nodes[2]["sent"])
    assert nodes[0]["received"][0]["type"] == "function_call" and nodes[0]["received"][0]["name"] == "exec_command"
    assert db.head(session) == str(nodes[2]["id"])
    # the hosted tool a chat upstream cannot run was left out, and the node says so
    assert "web_search" in nodes[0]["params"]["_bp_dropped_tools"]

    # codex exec fork: a new session (a new session id) that resends this one's history -- a fork
    # of this conversation at its last node, holding only the new question
    upstream.reset()
    upstream.enqueue(Reply(content="An answer in the fork."))
    forked = run([codex, "exec", "--skip-git-repo-check", "fork", session, "A question in the fork"], cwd=work, env=env)
    assert "An answer in the fork." in forked.stdout
    fork_session = session_id(forked.stderr + forked.stdout)
    assert fork_session != session
    (call,) = upstream.turn_requests
    assert call.headers["session-id"] == fork_session
    assert len(call.messages) == len(calls[2].messages) + 2  # the whole history once, the answer, the new question
    each_history_once([calls[2], call])
    assert call.messages[-1]["content"] == "A question in the fork"
    fork = {c["id"]: c for c in conversations_of(db, tenant)}[fork_session]
    assert fork["forked_from"] == session
    (own,) = nodes_of(db, tenant, fork_session)
    assert own["parent_id"] == nodes[2]["id"] and len(own["sent"]) == 1 and "A question in the fork" in json.dumps(own["sent"])
    assert len(nodes_of(db, tenant, session)) == 3 and db.head(session) == str(nodes[2]["id"])  # the original as it was


def test_codex_edits_a_file_with_its_freeform_apply_patch_over_a_chat_upstream(proxy, upstream, key, db, client_home):
    # a model Codex knows (gpt-5.5) gets apply_patch as a custom (free-form, grammar) tool: the chat
    # upstream is offered a function of one string, the model's call reaches Codex as a custom tool
    # call, Codex applies the patch in the workspace, and its result goes back as the tool message
    codex = npm_bin("codex")
    work, env = codex_setup(client_home, proxy, key)
    patch = "*** Begin Patch\n*** Add File: hello.txt\n+hello from the patch\n*** End Patch\n"
    upstream.enqueue(Reply(content=None, tool_calls=[tool_call("call_p1", "apply_patch", json.dumps({"input": patch}))]),
                     Reply(content="Added hello.txt."))
    result = run([codex, "exec", "--skip-git-repo-check", "-m", "gpt-5.5", "-s", "workspace-write", "Add hello.txt"],
                 cwd=work, env=env)
    assert "Added hello.txt." in result.stdout
    assert (work / "hello.txt").read_text() == "hello from the patch\n"

    first, second = upstream.turn_requests
    offered = {t["function"]["name"]: t["function"] for t in first.body["tools"]}
    assert offered["apply_patch"]["parameters"]["required"] == ["input"]
    assert "*** Begin Patch" in offered["apply_patch"]["description"]  # its grammar, told
    call, result_message = second.messages[-2:]
    assert json.loads(call["tool_calls"][0]["function"]["arguments"]) == {"input": patch}
    assert result_message["role"] == "tool" and result_message["tool_call_id"] == "call_p1"
    assert "hello.txt" in result_message["content"]
    each_history_once([first, second])
    nodes = nodes_of(db, tenant_of(key))
    assert len(nodes) == 2 and nodes[1]["parent_id"] == nodes[0]["id"]
    assert nodes[0]["received"][-1]["type"] == "custom_tool_call"
    assert [i["type"] for i in nodes[1]["sent"]] == ["custom_tool_call_output"]
    assert "custom" not in nodes[0]["params"].get("_bp_dropped_tools", [])


def test_codex_searches_its_deferred_tools_over_a_chat_upstream(proxy, upstream, key, db, client_home):
    # a model Codex knows (gpt-5.5) gets its sub-agent tools deferred behind a tool search that
    # Codex runs itself: the chat upstream is offered tool_search, the model's call reaches Codex
    # as a tool_search_call, and the tools Codex loaded are offered with the next call
    codex = npm_bin("codex")
    work, env = codex_setup(client_home, proxy, key)
    upstream.enqueue(Reply(content=None, tool_calls=[tool_call("call_s1", "tool_search",
                                                               json.dumps({"query": "spawn a sub-agent"}))]),
                     Reply(content="Found the agent tools."))
    result = run([codex, "exec", "--skip-git-repo-check", "-m", "gpt-5.5", "Find a tool to spawn a sub-agent"],
                 cwd=work, env=env)
    assert "Found the agent tools." in result.stdout
    first, second = upstream.turn_requests
    before = {t["function"]["name"] for t in first.body["tools"]}
    after = {t["function"]["name"] for t in second.body["tools"]}
    assert "tool_search" in before
    loaded = after - before
    assert loaded and all(name.startswith("multi_agent_v1__") for name in loaded), loaded
    call, found = second.messages[-2:]
    assert call["tool_calls"][0]["function"]["name"] == "tool_search" and found["role"] == "tool"
    assert found["tool_call_id"] == "call_s1" and "multi_agent_v1__spawn_agent" in found["content"]
    each_history_once([first, second])
    nodes = nodes_of(db, tenant_of(key))
    assert len(nodes) == 2 and nodes[1]["parent_id"] == nodes[0]["id"]
    assert [i["type"] for i in nodes[1]["sent"]] == ["tool_search_output"]


def test_codex_edits_a_file_through_an_anthropic_upstream(database_url, db, key, client_home):
    # Codex (its Responses API, gpt-5.5's tools: apply_patch free-form, a tool search) in front of a
    # Claude model: translated through chat both ways; the patch comes as Claude's tool_use
    codex = npm_bin("codex")
    fake = FakeAnthropic()
    patch = "*** Begin Patch\n*** Add File: notes.md\n+from claude\n*** End Patch\n"
    fake.enqueue(AReply(content=[{"type": "text", "text": "I'll add it."},
                                 {"type": "tool_use", "id": "toolu_p1", "name": "apply_patch", "input": {"input": patch}}],
                        stop_reason="tool_use"),
                 AReply(content=[{"type": "text", "text": "Added notes.md."}]))
    with anthropic_proxy(database_url, fake) as proxy:
        work, env = codex_setup(client_home, proxy, key)
        result = run([codex, "exec", "--skip-git-repo-check", "-m", "gpt-5.5", "-s", "workspace-write", "Add notes.md"],
                     cwd=work, env=env)
    assert "Added notes.md." in result.stdout
    assert (work / "notes.md").read_text() == "from claude\n"
    first, second = fake.calls
    offered = {t["name"]: t for t in first.body["tools"]}
    assert offered["apply_patch"]["input_schema"]["required"] == ["input"] and "tool_search" in offered
    use, answer = second.body["messages"][-2:]
    assert use["content"][-1] == {"type": "tool_use", "id": "toolu_p1", "name": "apply_patch", "input": {"input": patch}}
    assert answer["content"][0]["type"] == "tool_result" and answer["content"][0]["tool_use_id"] == "toolu_p1"
    nodes = nodes_of(db, tenant_of(key))
    assert len(nodes) == 2 and nodes[1]["parent_id"] == nodes[0]["id"]
