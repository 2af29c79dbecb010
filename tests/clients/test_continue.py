"""Continue's CLI (npm ``@continuedev/cli``, binary ``cn``), unmodified, headless (``cn -p``, then
``cn -p --resume``), with a ``config.yaml`` naming one model of its ``openai`` provider -- or of its
``anthropic`` provider -- whose ``apiBase`` is ``/auto/v1``. A first turn with a tool round (its
``Read`` tool really reads a file) and a second turn that resumes the session are one conversation
found by content, three nodes in a line, each holding only what is new; the upstream gets each
history once, as Continue sent it. Continue sends no side calls (no title request).

Kept offline: headless mode checks for no update, ``CONTINUE_CLI_ENABLE_TELEMETRY=0`` and
``CONTINUE_METRICS_ENABLED=0`` turn its metrics off, and its hub (``CONTINUE_API_BASE``) is an
address nothing answers -- a local ``--config`` file needs no hub and no login."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ..anthropic_fake import AReply, FakeAnthropic
from ..conftest import make_settings, serve_proxy, tenant_of
from ..fakes import FakeUpstream, Reply, ServerThread
from ..helpers import tool_call
from .conftest import (
    anthropic_proxy,
    conversations_of,
    nodes_of,
    npm_bin,
    offline_env,
    run,
    tool_round_then_a_question,
)

pytestmark = pytest.mark.clients

OFFLINE = {"CONTINUE_CLI_ENABLE_TELEMETRY": "0", "CONTINUE_METRICS_ENABLED": "0",
           "CONTINUE_API_BASE": "http://127.0.0.1:9/"}


def _config(provider: str, model: str, proxy_url: str, key: str) -> str:
    return "\n".join([
        "name: branchpoint", "version: 1.0.0", "schema: v1", "models:",
        "  - name: branchpoint", f"    provider: {provider}", f"    model: {model}",
        f"    apiBase: {proxy_url}/auto/v1", f"    apiKey: {key}", "    roles: [chat, edit, apply]", ""])


def _session(provider: str, model: str, proxy_url: str, key: str, home: Path) -> tuple[str, str]:
    """Continue's two turns against the proxy: the first asks about a file (a ``Read`` round), the
    second resumes the session. Returns both outputs."""
    cn = npm_bin("cn")
    work = home / "project"
    work.mkdir()
    (work / "notes.txt").write_text("the secret word is pelican\n")
    config = home / "config.yaml"
    config.write_text(_config(provider, model, proxy_url, key))
    env = offline_env(home, CONTINUE_GLOBAL_DIR=str(home / ".continue"), **OFFLINE)
    first = run([cn, "-p", "What is the secret word in notes.txt?", "--config", config], cwd=work, env=env)
    second = run([cn, "-p", "--resume", "And the second question", "--config", config], cwd=work, env=env)
    return first.stdout, second.stdout


def _stored_session(db: Any, key: str, api: str) -> None:
    """One conversation of three nodes in a line, each only new items, the system prompt once."""
    tenant = tenant_of(key)
    conversations = conversations_of(db, tenant)
    assert len(conversations) == 1
    nodes = nodes_of(db, tenant, conversations[0]["id"])
    assert len(nodes) == 3 and [n["api"] for n in nodes] == [api] * 3
    assert nodes[0]["parent_id"] is None and nodes[1]["parent_id"] == nodes[0]["id"]
    assert nodes[2]["parent_id"] == nodes[1]["id"] and conversations[0]["head_node_id"] == nodes[2]["id"]
    assert [n["finish_reason"] for n in nodes] == ["tool_calls", "stop", "stop"]
    sent = [json.dumps(n["sent"]) for n in nodes]
    assert "What is the secret word" in sent[0] and "pelican" not in sent[0]
    assert "pelican" in sent[1] and "What is the secret word" not in sent[1]
    assert "And the second question" in sent[2] and "pelican" not in sent[2] and "What is the secret" not in sent[2]
    assert [m["role"] for n in nodes for m in n["sent"]].count("system") == 1 and nodes[0]["sent"][0]["role"] == "system"


def test_continue_openai_provider_two_turns_and_a_tool_round_are_one_conversation(database_url, db, key, client_home):
    upstream = FakeUpstream()
    with ServerThread(upstream) as server, serve_proxy(make_settings(database_url, server.url + "/v1")) as proxy:
        upstream.enqueue(
            Reply(content=None, tool_calls=[tool_call("call_c1", "Read", json.dumps({"filepath": "notes.txt"}))]),
            Reply(content="The word is pelican."),
            Reply(content="Second answer."),
        )
        first, second = _session("openai", "gpt-4o-mini", proxy.url, key, client_home)
    assert "The word is pelican." in first
    assert "Second answer." in second

    calls = upstream.turn_requests
    assert len(upstream.requests) == 3
    tool_round_then_a_question(calls, key, "call_c1", "And the second question")
    assert {t["function"]["name"] for t in calls[0].body["tools"]} >= {"Read", "List", "Bash"}

    _stored_session(db, key, "chat")


def test_continue_anthropic_provider_over_an_anthropic_upstream(database_url, db, key, client_home):
    claude = FakeAnthropic()
    with anthropic_proxy(database_url, claude) as proxy:
        claude.enqueue(
            AReply(content=[{"type": "text", "text": "Let me look."},
                            {"type": "tool_use", "id": "toolu_c1", "name": "Read", "input": {"filepath": "notes.txt"}}],
                   stop_reason="tool_use"),
            AReply(content=[{"type": "text", "text": "The word is pelican."}]),
            AReply(content=[{"type": "text", "text": "Second answer."}]),
        )
        first, second = _session("anthropic", "claude-sonnet-4-5", proxy.url, key, client_home)
    assert "The word is pelican." in first
    assert "Second answer." in second

    calls = claude.calls
    assert len(calls) == 3
    for call in calls:
        assert call.path.split("?")[0] == "/v1/messages" and call.headers["x-api-key"] == key
        assert call.body["stream"] is True and "Continue" in json.dumps(call.body["system"])
    # (Continue marks its newest user message for caching: the marker moves from call to call)
    msgs = [[{**m, "content": [{k: v for k, v in b.items() if k != "cache_control"} for b in m["content"]]}
             for m in c.body["messages"]] for c in calls]
    assert [m["role"] for m in msgs[2]] == ["user", "assistant", "user", "assistant", "user"]
    assert msgs[1][:1] == msgs[0] and msgs[2][:3] == msgs[1]
    assert msgs[1][1]["content"][-1] == {"type": "tool_use", "id": "toolu_c1", "name": "Read",
                                         "input": {"filepath": "notes.txt"}}
    result = msgs[1][2]["content"][0]
    assert result["type"] == "tool_result" and result["tool_use_id"] == "toolu_c1" and "pelican" in json.dumps(result)
    texts = json.dumps(msgs[2])
    assert texts.count("What is the secret word in notes.txt?") == 1 and texts.count("And the second question") == 1
    assert {t["name"] for t in calls[0].body["tools"]} >= {"Read", "List", "Bash"}

    _stored_session(db, key, "messages")
