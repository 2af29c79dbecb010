"""opencode (npm ``opencode-ai``), unmodified, headless, on its Anthropic side: a provider of
``@ai-sdk/anthropic`` (bundled in opencode's binary, as ``@ai-sdk/openai-compatible`` is -- its
table of bundled providers imports them from the binary's own chunks, so nothing is installed or
fetched, and the test's OFFLINE switches, npm's among them, hold) with ``options.baseURL`` at ``/auto/v1`` -- so it calls ``/auto/v1/messages``. A first turn
with a tool round (its ``read`` tool really reads a file) and a second turn (``--continue``) are one
conversation found by content, each node holding only what is new; over an Anthropic upstream
(native) and over a chat upstream (translated both ways). Its title request (no tools) is a side
call: a one-node conversation of its own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ..anthropic_fake import AReply, FakeAnthropic
from ..conftest import make_settings, serve_proxy, tenant_of
from ..fakes import FakeUpstream, Reply, ServerThread
from ..helpers import tool_call, unmarked
from .conftest import SideCalls, anthropic_proxy, conversations_of, each_history_once, nodes_of, npm_bin, run
from .test_opencode import project

pytestmark = pytest.mark.clients

MODEL = "claude-sonnet-4-5"
# an Anthropic provider ($XDG_CONFIG_HOME/opencode/opencode.json), with the proxy's address filled in
OPENCODE_CONFIG = {
    "$schema": "https://opencode.ai/config.json",
    "provider": {
        "branchpoint": {
            "npm": "@ai-sdk/anthropic",
            "name": "Branchpoint",
            "options": {"baseURL": "http://127.0.0.1:8080/auto/v1", "apiKey": "{env:BRANCHPOINT_API_KEY}"},
            "models": {MODEL: {"name": MODEL}},
        }
    },
    "model": f"branchpoint/{MODEL}",
    "autoupdate": False,
    "share": "disabled",
}


def _session(proxy_url: str, key: str, home: Path) -> tuple[str, str, Path]:
    """opencode's two turns against the proxy: the first asks about a file (a ``read`` round), the
    second continues the session. Returns both outputs and the file."""
    opencode = npm_bin("opencode")
    work, env = project(OPENCODE_CONFIG, proxy_url, key, home)
    first = run([opencode, "run", "What is the secret word in notes.txt?"], cwd=work, env=env)
    second = run([opencode, "run", "--continue", "And the second question"], cwd=work, env=env)
    return first.stdout, second.stdout, work / "notes.txt"


def _stored_session(db: Any, key: str) -> list[Any]:
    """The stored tree: the agent's session one conversation of three nodes in a line, each only new
    items; the title request one node of a conversation of its own. Returns the agent's nodes."""
    tenant = tenant_of(key)
    conversations = conversations_of(db, tenant)
    assert len(conversations) == 2
    title, agent = sorted((nodes_of(db, tenant, c["id"]) for c in conversations), key=len)
    assert len(title) == 1 and len(agent) == 3
    assert [n["api"] for n in agent] == ["messages"] * 3
    assert agent[0]["parent_id"] is None and agent[1]["parent_id"] == agent[0]["id"]
    assert agent[2]["parent_id"] == agent[1]["id"]
    sent = [json.dumps(n["sent"]) for n in agent]
    assert "What is the secret word" in sent[0] and "pelican" not in sent[0]
    assert "pelican" in sent[1] and "What is the secret word" not in sent[1]
    assert "And the second question" in sent[2] and "pelican" not in sent[2] and "What is the secret" not in sent[2]
    assert sum(m["role"] == "system" for n in agent for m in n["sent"]) == 1  # the system prompt once, first
    assert agent[0]["sent"][0]["role"] == "system"
    return agent


def test_opencode_anthropic_provider_over_an_anthropic_upstream(database_url, db, key, client_home):
    main, side = FakeAnthropic(), FakeAnthropic()
    with anthropic_proxy(database_url, SideCalls(main, side)) as proxy:
        main.enqueue(
            AReply(content=[{"type": "tool_use", "id": "toolu_o1", "name": "read",
                             "input": {"filePath": str(client_home / "project" / "notes.txt")}}],
                   stop_reason="tool_use"),
            AReply(content=[{"type": "text", "text": "The word is pelican."}]),
            AReply(content=[{"type": "text", "text": "Second answer."}]),
        )
        side.enqueue(AReply(content=[{"type": "text", "text": "Secret word"}]))
        first, second, _ = _session(proxy.url, key, client_home)
    assert "The word is pelican." in first
    assert "Second answer." in second

    # the upstream: three agent calls, each extending the one before as sent, the file's real
    # content fed back as the call's tool_result right after its tool_use; the system prompt once,
    # in ``system``
    calls = main.calls
    assert len(calls) == 3
    for call in calls:
        assert call.path.split("?")[0] == "/v1/messages"
        assert call.headers["x-api-key"] == key
        assert call.body["system"] and all(m["role"] in ("user", "assistant") for m in call.body["messages"])
        assert json.dumps(call.body["system"]).count("opencode") >= 1
        assert 1 <= json.dumps(call.body).count('"cache_control"') <= 4
    msgs = [unmarked(c.body["messages"]) for c in calls]  # (opencode marks its newest messages)
    assert [m["role"] for m in msgs[2]] == ["user", "assistant", "user", "assistant", "user"]
    assert msgs[1][:1] == msgs[0] and msgs[2][:3] == msgs[1]
    assert msgs[1][1]["content"][-1]["type"] == "tool_use" and msgs[1][1]["content"][-1]["id"] == "toolu_o1"
    result = msgs[1][2]["content"][0]
    assert result["type"] == "tool_result" and result["tool_use_id"] == "toolu_o1" and "pelican" in json.dumps(result)
    texts = json.dumps(msgs[2])
    assert texts.count("What is the secret word in notes.txt?") == 1 and texts.count("And the second question") == 1
    assert {t["name"] for t in calls[0].body["tools"]} >= {"bash", "read", "edit"}
    assert len(side.calls) == 1 and "title" in json.dumps(side.calls[0].body["system"])

    _stored_session(db, key)


def test_opencode_anthropic_provider_over_a_chat_upstream(database_url, db, key, client_home):
    main, side = FakeUpstream(), FakeUpstream()
    with ServerThread(SideCalls(main, side)) as server:
        with serve_proxy(make_settings(database_url, server.url + "/v1")) as proxy:
            main.enqueue(
                Reply(content=None, tool_calls=[tool_call("call_o1", "read", json.dumps(
                    {"filePath": str(client_home / "project" / "notes.txt")}))]),
                Reply(content="The word is pelican."),
                Reply(content="Second answer."),
            )
            first, second, _ = _session(proxy.url, key, client_home)
    assert "The word is pelican." in first
    assert "Second answer." in second

    calls = main.turn_requests
    assert len(calls) == 3
    each_history_once(calls)
    assert [m["role"] for m in calls[2].messages] == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert calls[1].messages[-1]["tool_call_id"] == "call_o1" and "pelican" in calls[1].messages[-1]["content"]
    assert "And the second question" in json.dumps(calls[2].messages[-1]["content"])
    assert {t["function"]["name"] for t in calls[0].body["tools"]} >= {"bash", "read", "edit"}
    assert len(side.requests) == 1

    _stored_session(db, key)
