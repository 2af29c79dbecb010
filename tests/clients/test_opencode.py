"""opencode (npm ``opencode-ai``), unmodified, headless (``opencode run``, then ``opencode run
--continue``), with a provider of ``@ai-sdk/openai-compatible`` pointed at ``/auto/v1`` -- the
README's "Use it with" snippet. Its session's turns are one conversation found by content, each
node holding only what is new, and the upstream gets each history once. Its title request (no
tools, beside the first turn) is a side call: a one-node conversation of its own (opencode's
``x-session-id`` header -- ``ses_...`` -- is not a valid conversation id, so it names nothing)."""

import json
from pathlib import Path
from typing import Any

import pytest

from ..conftest import tenant_of
from ..fakes import Reply
from ..helpers import tool_call
from .conftest import conversations_of, each_history_once, nodes_of, npm_bin, offline_env, run

pytestmark = pytest.mark.clients

# the README's snippet ($XDG_CONFIG_HOME/opencode/opencode.json), with the proxy's address filled in
OPENCODE_CONFIG = {
    "$schema": "https://opencode.ai/config.json",
    "provider": {
        "branchpoint": {
            "npm": "@ai-sdk/openai-compatible",
            "name": "Branchpoint",
            "options": {"baseURL": "http://127.0.0.1:8080/auto/v1", "apiKey": "{env:BRANCHPOINT_API_KEY}"},
            "models": {"gpt-4o-mini": {"name": "gpt-4o-mini"}},
        }
    },
    "model": "branchpoint/gpt-4o-mini",
    "autoupdate": False,
    "share": "disabled",
}
# what keeps it offline (no update check, no models.dev fetch, no LSP or plugin downloads)
OFFLINE = {"OPENCODE_DISABLE_AUTOUPDATE": "1", "OPENCODE_DISABLE_MODELS_FETCH": "1", "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
           "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1", "OPENCODE_DISABLE_SHARE": "1", "OPENCODE_DISABLE_CLAUDE_CODE": "1",
           "OPENCODE_DISABLE_EXTERNAL_SKILLS": "1", "npm_config_offline": "true"}


def project(config: dict[str, Any], proxy_url: str, key: str, home: Path) -> tuple[Path, dict[str, str]]:
    """opencode's ``config`` in ``home`` with the proxy's address filled in, a project folder
    holding ``notes.txt`` (what its ``read`` round reads), and the offline environment to run it in."""
    config = json.loads(json.dumps(config).replace("http://127.0.0.1:8080", proxy_url))
    (home / ".config" / "opencode").mkdir(parents=True)
    (home / ".config" / "opencode" / "opencode.json").write_text(json.dumps(config))
    work = home / "project"
    work.mkdir()
    (work / "notes.txt").write_text("the secret word is pelican\n")
    return work, offline_env(home, BRANCHPOINT_API_KEY=key, **OFFLINE)


def test_opencode_two_turns_and_a_tool_round_are_one_conversation(split_upstream, key, db, client_home):
    opencode = npm_bin("opencode")
    proxy, upstream, side = split_upstream
    work, env = project(OPENCODE_CONFIG, proxy.url, key, client_home)
    upstream.enqueue(
        Reply(content=None, tool_calls=[tool_call("call_o1", "read", json.dumps({"filePath": str(work / "notes.txt")}))]),
        Reply(content="The word is pelican."),
        Reply(content="Second answer."),
    )
    first = run([opencode, "run", "What is the secret word in notes.txt?"], cwd=work, env=env)
    assert "The word is pelican." in first.stdout
    second = run([opencode, "run", "--continue", "And the second question"], cwd=work, env=env)
    assert "Second answer." in second.stdout

    # the upstream: three agent calls (the tool round, its answer, the second turn), each history once,
    # the file's real content fed back; the system prompt first, where opencode put it
    calls = upstream.turn_requests
    assert len(calls) == 3
    each_history_once(calls)
    assert [m["role"] for m in calls[2].messages] == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert "pelican" in calls[1].messages[-1]["content"] and calls[1].messages[-1]["tool_call_id"] == "call_o1"
    assert "And the second question" in calls[2].messages[-1]["content"]
    assert {t["function"]["name"] for t in calls[0].body["tools"]} >= {"bash", "read", "edit"}
    assert len(side.requests) == 1 and "title" in side.requests[0].messages[0]["content"]

    # stored: the agent's session is one conversation of three nodes in a line, each only new items;
    # the title request one node of a conversation of its own
    tenant = tenant_of(key)
    conversations = conversations_of(db, tenant)
    assert len(conversations) == 2
    by_size = sorted(([n for n in nodes_of(db, tenant, c["id"])] for c in conversations), key=len)
    title, agent = by_size
    assert len(title) == 1 and len(agent) == 3
    assert agent[0]["parent_id"] is None and agent[1]["parent_id"] == agent[0]["id"] and agent[2]["parent_id"] == agent[1]["id"]
    assert [m["role"] for m in agent[0]["sent"]] == ["system", "user"]
    assert [m["role"] for m in agent[1]["sent"]] == ["tool"] and "pelican" in agent[1]["sent"][0]["content"]
    assert [m["role"] for m in agent[2]["sent"]] == ["user"] and "And the second question" in agent[2]["sent"][0]["content"]
    assert agent[0]["received"][0]["tool_calls"][0]["function"]["name"] == "read"
