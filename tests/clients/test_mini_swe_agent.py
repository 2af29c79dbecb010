"""mini-swe-agent (PyPI ``mini-swe-agent``, its own venv), unmodified: ``mini`` headless (``-y
--exit-immediately``), its model called through LiteLLM with the ``api_base`` the README gives --
``<proxy>/auto/v1`` for an OpenAI model, ``<proxy>/auto`` for a Claude one (LiteLLM adds
``/v1/messages``) -- its ``bash`` tool run for real (``echo hello``), then its submit command.
The second call resends the first with the tool's output: one conversation found by content, the
second node under the first holding only the tool result, the upstream receiving each history once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ..anthropic_fake import AReply
from ..conftest import tenant_of
from ..fakes import Reply
from ..helpers import tool_call, unmarked
from .conftest import conversations_of, each_history_once, nodes_of, offline_env, pypi_bin, run

pytestmark = pytest.mark.clients

SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def _mini(model: str, api_base: str, key: str, home: Path) -> None:
    mini = pypi_bin("mini-swe-agent")
    work = home / "work"
    work.mkdir()
    config = ["-c", "mini.yaml", "-c", f"model.model_kwargs.api_base={api_base}", "-c", f"model.model_kwargs.api_key={key}"]
    env = offline_env(home, MSWEA_CONFIGURED="true", MSWEA_COST_TRACKING="ignore_errors",
                      LITELLM_LOCAL_MODEL_COST_MAP="True")  # (no set-up wizard, no price download)
    run([mini, "-m", model, "-t", "Say hello.", "-y", "--exit-immediately", "-l", "0", "-o", home / "trajectory.json",
         *config], cwd=work, env=env, stdin="")


def _one_line_of_two(db: Any, key: str) -> list[Any]:
    conversations = conversations_of(db, tenant_of(key))
    assert len(conversations) == 1
    nodes = nodes_of(db, tenant_of(key), conversations[0]["id"])
    assert len(nodes) == 2 and nodes[1]["parent_id"] == nodes[0]["id"]
    assert str(conversations[0]["head_node_id"]) == str(nodes[1]["id"])
    return nodes


def test_mini_swe_agent_openai_model(proxy, upstream, key, db, client_home):
    upstream.enqueue(Reply(content="Let me say it.", tool_calls=[tool_call("call_m1", "bash", '{"command": "echo hello"}')]),
                     Reply(content="Done.", tool_calls=[tool_call("call_m2", "bash", f'{{"command": "{SUBMIT}"}}')]))
    _mini("openai/gpt-4o-mini", f"{proxy.url}/auto/v1", key, client_home)

    calls = upstream.turn_requests
    assert len(calls) == 2
    each_history_once(calls)
    result = calls[1].messages[-1]
    assert result["role"] == "tool" and result["tool_call_id"] == "call_m1" and "hello" in result["content"]  # it ran
    nodes = _one_line_of_two(db, key)
    assert [m["role"] for m in nodes[0]["sent"]] == ["system", "user"]
    assert nodes[1]["sent"] == [result]


def test_mini_swe_agent_claude_model(mproxy, claude, key, client_home):
    claude.enqueue(AReply(content=[{"type": "text", "text": "Let me say it."}, {
        "type": "tool_use", "id": "toolu_m1", "name": "bash", "input": {"command": "echo hello"}}], stop_reason="tool_use"),
                   AReply(content=[{"type": "text", "text": "Done."}, {
                       "type": "tool_use", "id": "toolu_m2", "name": "bash", "input": {"command": SUBMIT}}],
                          stop_reason="tool_use"))
    _mini("anthropic/claude-sonnet-4-5", f"{mproxy.url}/auto", key, client_home)

    assert [c.path for c in claude.calls] == ["/v1/messages", "/v1/messages"]  # (not .../v1/v1/messages: passed through)
    first, second = (unmarked(c.body["messages"]) for c in claude.calls)  # (LiteLLM marks the last message)
    assert second[:len(first)] == first and [m["role"] for m in second] == ["user", "assistant", "user"]
    result = second[-1]["content"][0]
    assert result["type"] == "tool_result" and result["tool_use_id"] == "toolu_m1" and "hello" in str(result["content"])
    nodes = _one_line_of_two(mproxy.db, key)
    assert [[b["type"] for b in m["content"]] for m in nodes[1]["sent"]] == [["tool_result"]]
