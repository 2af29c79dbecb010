"""aider (PyPI ``aider-chat``, in a venv of its own: it pins ``openai`` and ``pydantic``),
unmodified, two turns piped into its prompt, pointed at ``/auto/v1`` with ``--openai-api-base``
-- the README's "Use it with" line. Its session is one conversation found by content: the first
node holds its system prompts, few-shot examples and the first question, the second only the
second question; the upstream gets each history once, aider's trailing reminder last as aider put it. (aider offers no function
tools -- its edits are text -- so there is no tool round.)"""

import json

import pytest

from ..conftest import tenant_of
from ..fakes import Reply
from .conftest import conversations_of, each_history_once, nodes_of, offline_env, pypi_bin, run

pytestmark = pytest.mark.clients

# the README's line, with the proxy's address filled in; the switches after it keep aider offline
AIDER_ARGS = ["--model", "openai/gpt-4o-mini", "--openai-api-base", "http://127.0.0.1:8080/auto/v1"]
OFFLINE = ["--no-check-update", "--analytics-disable", "--no-show-model-warnings", "--no-git", "--yes-always",
           "--no-pretty", "--no-stream", "--edit-format", "diff"]
# aider downloads litellm's model prices unless its cache holds some
PRICES = {"gpt-4o-mini": {"max_input_tokens": 128000, "max_output_tokens": 16384, "input_cost_per_token": 1.5e-07,
                          "output_cost_per_token": 6e-07, "litellm_provider": "openai", "mode": "chat"}}


def test_aider_two_turns_are_one_conversation(proxy, upstream, key, db, client_home):
    aider = pypi_bin("aider")
    (client_home / ".aider" / "caches").mkdir(parents=True)
    (client_home / ".aider" / "caches" / "model_prices_and_context_window.json").write_text(json.dumps(PRICES))
    work = client_home / "project"
    work.mkdir()
    args = [a.replace("http://127.0.0.1:8080", proxy.url) for a in AIDER_ARGS]
    upstream.enqueue(Reply(content="A closure captures variables."), Reply(content="A generator yields values."))
    result = run([aider, *args, "--openai-api-key", key, *OFFLINE], cwd=work, env=offline_env(client_home),
                 stdin="What is a closure?\nAnd a generator?\n")
    assert "A closure captures variables." in result.stdout and "A generator yields values." in result.stdout
    assert "raw.githubusercontent.com" not in result.stdout + result.stderr  # offline: no price download tried

    calls = upstream.turn_requests
    assert len(calls) == 2
    each_history_once(calls)
    conversation = [m for m in calls[1].messages if m["role"] != "system"]
    assert [m["content"] for m in conversation[-3:]] == ["What is a closure?", "A closure captures variables.",
                                                         "And a generator?"]
    # system messages where aider put them (docs/behaviour.md#full-history-mode: the client's order): its prompt first, its
    # SEARCH/REPLACE rules as a reminder after the last question, on every call
    for call in calls:
        assert call.messages[0]["role"] == "system" and call.messages[-1]["role"] == "system"
        assert "SEARCH/REPLACE" in call.messages[-1]["content"]
        assert [m["role"] for m in call.messages[1:-1]].count("system") == 0

    tenant = tenant_of(key)
    conversations = conversations_of(db, tenant)
    assert len(conversations) == 1
    nodes = nodes_of(db, tenant, conversations[0]["id"])
    assert len(nodes) == 2 and nodes[1]["parent_id"] == nodes[0]["id"]
    assert len(nodes[0]["sent"]) == len(calls[0].messages)  # the first call whole: prompts, examples, question
    assert nodes[1]["sent"] == [{"role": "user", "content": "And a generator?"}]
