"""Claude Code (npm ``@anthropic-ai/claude-code``), unmodified, headless: ``claude -p "…"`` then
``claude -p --continue "…"``, with ``ANTHROPIC_BASE_URL`` at ``<proxy>/auto`` and its telemetry,
auto-update, error reporting and non-essential traffic switched off by its own environment
variables. A first turn with one tool round (its Bash tool really runs ``echo``) and a second turn
land as one conversation -- named by its ``X-Claude-Code-Session-Id`` -- whose nodes hold only what
is new; over a chat upstream (translated both ways) and over an Anthropic one (native)."""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ..anthropic_fake import AReply, FakeAnthropic
from ..conftest import make_settings, new_key, serve_proxy, tenant_of
from ..fakes import FakeUpstream, Reply, ServerThread
from ..helpers import tool_call
from .conftest import anthropic_proxy, conversations_of, each_history_once, nodes_of, offline_env, run

pytestmark = pytest.mark.clients

HERE = Path(__file__).resolve().parent / "claude"
# what keeps it offline and quiet: every request it makes goes to the base URL
OFFLINE = {"DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
           "DISABLE_ERROR_REPORTING": "1"}


def claude_bin() -> Path:
    """The ``claude`` binary of tests/clients/claude (``npm ci`` from its lock when missing)."""
    import os

    binary = HERE / "node_modules" / ".bin" / "claude"
    if not binary.exists():
        problem = None
        if not (shutil.which("node") and shutil.which("npm")):
            problem = "Node.js (node and npm) is not installed"
        else:
            result = subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=HERE, capture_output=True, text=True,
                                    timeout=900)
            if result.returncode != 0 or not binary.exists():
                problem = f"npm ci in tests/clients/claude failed: {result.stderr[-1500:]}"
        if problem:
            if os.environ.get("BRANCHPOINT_CLIENTS_REQUIRED") == "1":
                pytest.fail(f"claude: {problem}")
            pytest.skip(f"claude: {problem}")
    return binary


def _env(home: Path, proxy_url: str, key: str) -> dict[str, str]:
    return offline_env(home, ANTHROPIC_BASE_URL=f"{proxy_url}/auto", ANTHROPIC_API_KEY=key, **OFFLINE)


def _session(claude: Path, work: Path, env: dict[str, str]) -> tuple[str, str]:
    first = run([claude, "-p", "Run echo branchpoint-ok with Bash, then tell me what it printed.",
                 "--allowedTools", "Bash(echo:*)"], cwd=work, env=env)
    second = run([claude, "-p", "--continue", "Thank you. What did I ask first?"], cwd=work, env=env)
    return first.stdout, second.stdout


def _stored(db: Any, key: str) -> tuple[list[Any], list[Any]]:
    tenant = tenant_of(key)
    return conversations_of(db, tenant), nodes_of(db, tenant)


def _texts(sent: list[dict[str, Any]]) -> str:
    return json.dumps(sent)


def _scripted_session(database_url: str, client_home: Path, key: str, call_id: str, api: str) -> FakeUpstream:
    """Claude Code's session (``_session``) in front of a fake OpenAI upstream speaking ``api``
    (chat or responses), scripted: a Bash call (``call_id``), its answer, the second answer --
    which reach Claude Code. Returns the upstream, with what it received."""
    claude = claude_bin()
    upstream = FakeUpstream()
    with ServerThread(upstream) as server:
        settings = make_settings(database_url, server.url + "/v1", upstreams=[
            {"name": "openai", "base_url": server.url + "/v1", "models": ["*"], "api": api}])
        with serve_proxy(settings) as proxy:
            work = client_home / "project"
            work.mkdir()
            upstream.enqueue(
                Reply(content="Running it.", tool_calls=[tool_call(call_id, "Bash", json.dumps(
                    {"command": "echo branchpoint-ok", "description": "print a word"}))]),
                Reply(content="It printed branchpoint-ok."),
                Reply(content="You asked me to run echo."),
            )
            first, second = _session(claude, work, _env(client_home, proxy.url, key))
    assert "It printed branchpoint-ok." in first
    assert "You asked me to run echo." in second
    return upstream


def test_claude_code_over_a_chat_upstream(database_url: str, db: Any, client_home: Path) -> None:
    key = f"sk-ant-{new_key()}"
    upstream = _scripted_session(database_url, client_home, key, "call_cc1", "chat")

    calls = upstream.turn_requests
    assert len(calls) == 3, [c.messages[-1] for c in calls]
    # the tool really ran, and its output came back as a tool result of the call
    results = [m for m in calls[1].messages if m.get("role") == "tool"]
    assert results and results[-1]["tool_call_id"] == "call_cc1" and "branchpoint-ok" in json.dumps(results[-1])
    assert {t["function"]["name"] for t in calls[0].body["tools"]} >= {"Bash", "Read", "Edit"}
    each_history_once([c for c in calls])

    conversations, nodes = _stored(db, key)
    assert len(conversations) == 1  # the session: one conversation, named by its session id
    assert [n["api"] for n in nodes] == ["messages"] * 3
    assert nodes[0]["parent_id"] is None and nodes[1]["parent_id"] == nodes[0]["id"]
    assert nodes[2]["parent_id"] == nodes[1]["id"]
    # each node only what is new: the tool result (not the question again), then the next question
    assert "branchpoint-ok" in _texts(nodes[1]["sent"]) and "Run echo" not in _texts(nodes[1]["sent"])
    assert "What did I ask first" in _texts(nodes[2]["sent"]) and "Run echo" not in _texts(nodes[2]["sent"])
    assert "branchpoint-ok" not in _texts(nodes[2]["sent"])


def test_claude_code_over_an_anthropic_upstream(database_url: str, db: Any, client_home: Path) -> None:
    claude = claude_bin()
    fake = FakeAnthropic()
    key = f"sk-ant-{new_key()}"
    with anthropic_proxy(database_url, fake) as proxy:
        work = client_home / "project"
        work.mkdir()
        fake.enqueue(
            AReply(content=[{"type": "thinking", "thinking": "I should run it.", "signature": "sig-cc-1"},
                            {"type": "tool_use", "id": "toolu_cc1", "name": "Bash",
                             "input": {"command": "echo branchpoint-ok", "description": "print a word"}}],
                   stop_reason="tool_use"),
            AReply(content=[{"type": "text", "text": "It printed branchpoint-ok."}]),
            AReply(content=[{"type": "text", "text": "You asked me to run echo."}]),
        )
        first, second = _session(claude, work, _env(client_home, proxy.url, key))
    assert "It printed branchpoint-ok." in first
    assert "You asked me to run echo." in second

    calls = fake.calls
    assert len(calls) == 3
    for before, after in itertools.pairwise(calls):  # each call extends the one before, as sent
        assert after.body["messages"][:len(before.body["messages"]) - 1] == before.body["messages"][:-1]
    for call in calls:  # what Claude Code sent reached Anthropic as it was: path, headers, markers
        assert call.path == "/v1/messages?beta=true"
        assert "claude-code-20250219" in call.headers["anthropic-beta"]
        assert call.headers["x-api-key"] == key
        markers = json.dumps(call.body).count('"cache_control"')
        assert 1 <= markers <= 4
    # its environment message (a system message after the question) stays where Claude Code put it
    assert [m["role"] for m in calls[0].body["messages"]] == ["user", "system"]
    assert calls[0].body["messages"][1]["content"][0]["text"].startswith("# Environment")
    # the signed thinking went back to the provider that made it, with the tool result
    assistant = calls[1].body["messages"][-2]
    assert assistant["content"][0] == {"type": "thinking", "thinking": "I should run it.", "signature": "sig-cc-1"}
    result = calls[1].body["messages"][-1]["content"][0]
    assert result["type"] == "tool_result" and result["tool_use_id"] == "toolu_cc1"
    assert "branchpoint-ok" in json.dumps(result)

    conversations, nodes = _stored(db, key)
    assert len(conversations) == 1
    assert [n["parent_id"] for n in nodes[1:]] == [nodes[0]["id"], nodes[1]["id"]]
    assert "Run echo" not in _texts(nodes[1]["sent"]) and "Run echo" not in _texts(nodes[2]["sent"])


def test_claude_code_over_a_responses_upstream(database_url: str, db: Any, client_home: Path) -> None:
    """Claude Code in front of a model only the Responses API serves (OpenAI's newest): its
    Messages requests through chat to Responses items and back, the tool round included."""
    key = f"sk-ant-{new_key()}"
    upstream = _scripted_session(database_url, client_home, key, "call_cr1", "responses")

    calls = upstream.responses_requests
    assert len(calls) == 3
    assert {t["name"] for t in calls[0].body["tools"]} >= {"Bash", "Read", "Edit"}
    assert all(c.body["store"] is False and "previous_response_id" not in c.body for c in calls)
    # the tool really ran: its output went back as the call's function_call_output, after the call
    items = calls[1].input
    call = next(i for i in items if i.get("type") == "function_call")
    result = next(i for i in items if i.get("type") == "function_call_output")
    assert call["call_id"] == result["call_id"] == "call_cr1" and items.index(result) > items.index(call)
    assert "branchpoint-ok" in json.dumps(result["output"])
    # each call sends the one before it again, and one thing more: nothing doubled
    for before, after in itertools.pairwise(calls):
        assert len(after.input) > len(before.input)
    texts = [json.dumps(i) for i in calls[2].input]
    assert sum("Run echo branchpoint-ok" in t for t in texts) == 1

    conversations, nodes = _stored(db, key)
    assert len(conversations) == 1 and [n["api"] for n in nodes] == ["messages"] * 3
    assert nodes[1]["parent_id"] == nodes[0]["id"] and nodes[2]["parent_id"] == nodes[1]["id"]
