"""Simon Willison's ``llm`` (PyPI, in a venv of its own), unmodified: a model of
``extra-openai-models.yaml`` pointed at ``/auto/v1`` -- the README's "Use it with" snippet --, a
question answered through one of its built-in tools (``-T llm_version``), then ``llm -c``. One
conversation found by content, each node holding only what is new, each history reaching the
upstream once."""

import pytest

from ..conftest import tenant_of
from ..fakes import Reply
from ..helpers import tool_call
from .conftest import conversations_of, each_history_once, nodes_of, offline_env, pypi_bin, run

pytestmark = pytest.mark.clients

# the README's snippet ($LLM_USER_PATH/extra-openai-models.yaml), with the proxy's address filled in
LLM_MODELS = """\
- model_id: branchpoint
  model_name: gpt-4o-mini
  api_base: "http://127.0.0.1:8080/auto/v1"
  api_key_name: branchpoint
  supports_tools: true
"""


def test_llm_two_turns_and_a_tool_round_are_one_conversation(proxy, upstream, key, db, client_home):
    llm = pypi_bin("llm")
    user_path = client_home / "llm"
    user_path.mkdir()
    (user_path / "extra-openai-models.yaml").write_text(LLM_MODELS.replace("http://127.0.0.1:8080", proxy.url))
    env = offline_env(client_home, LLM_USER_PATH=str(user_path))
    run([llm, "keys", "set", "branchpoint", "--value", key], cwd=client_home, env=env)
    upstream.enqueue(Reply(content=None, tool_calls=[tool_call("call_l1", "llm_version", "{}")]),
                     Reply(content="It is version 0.36."), Reply(content="Second answer."))
    first = run([llm, "-m", "branchpoint", "-T", "llm_version", "Which llm version is this?"], cwd=client_home, env=env)
    assert "It is version 0.36." in first.stdout
    second = run([llm, "-c", "And the second question?"], cwd=client_home, env=env)
    assert "Second answer." in second.stdout

    calls = upstream.turn_requests
    assert len(calls) == 3
    each_history_once(calls)
    assert calls[1].messages[-1] == {"role": "tool", "content": "0.36", "tool_call_id": "call_l1"}  # the tool ran
    assert [m["role"] for m in calls[2].messages] == ["user", "assistant", "tool", "assistant", "user"]
    assert calls[2].messages[-1]["content"] == "And the second question?"

    tenant = tenant_of(key)
    conversations = conversations_of(db, tenant)
    assert len(conversations) == 1
    nodes = nodes_of(db, tenant, conversations[0]["id"])
    assert [n["sent"] for n in nodes] == [[{"role": "user", "content": "Which llm version is this?"}],
                                          [{"role": "tool", "content": "0.36", "tool_call_id": "call_l1"}],
                                          [{"role": "user", "content": "And the second question?"}]]
    assert nodes[1]["parent_id"] == nodes[0]["id"] and nodes[2]["parent_id"] == nodes[1]["id"]
    assert nodes[0]["received"][0]["tool_calls"][0]["function"]["name"] == "llm_version"
