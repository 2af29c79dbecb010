"""instructor (PyPI, in a venv of its own), unmodified, its client made from the official SDKs pointed
at ``/auto/v1`` (``/auto`` for Anthropic's): a structured answer that fails validation, then
instructor's retry. In its tools mode (OpenAI) and its Anthropic tools mode the retry resends the
rejected tool call and the validation error as its result: the retry hangs under the answer it
corrects, holding only the error. Its Anthropic JSON mode resends the question and the error without
the rejected answer (README: such a call matches nothing): a conversation of its own."""

from __future__ import annotations

import pytest

from ..anthropic_fake import AReply
from ..conftest import tenant_of
from ..fakes import Reply
from ..helpers import tool_call
from .conftest import conversations_of, nodes_of, offline_env, pypi_bin, run

pytestmark = pytest.mark.clients

DRIVER = """
import sys
import anthropic, instructor, openai
from pydantic import BaseModel, field_validator

class User(BaseModel):
    name: str
    age: int

    @field_validator("name")
    @classmethod
    def upper(cls, v):
        if v != v.upper():
            raise ValueError("name must be uppercase")
        return v

proxy, key, mode, model = sys.argv[1:5]
if mode.startswith("ANTHROPIC"):
    client = instructor.from_anthropic(anthropic.Anthropic(base_url=proxy + "/auto", api_key=key, max_retries=0),
                                       mode=getattr(instructor.Mode, mode))
    user = client.messages.create(model=model, response_model=User, max_retries=2, max_tokens=100, system="Extract.",
                                  messages=[{"role": "user", "content": "Jason is 25"}])
else:
    client = instructor.from_openai(openai.OpenAI(base_url=proxy + "/auto/v1", api_key=key, max_retries=0),
                                    mode=getattr(instructor.Mode, mode))
    user = client.chat.completions.create(model=model, response_model=User, max_retries=2, messages=[
        {"role": "system", "content": "Extract."}, {"role": "user", "content": "Jason is 25"}])
print(user.model_dump_json())
"""


def _extract(proxy_url: str, key: str, mode: str, model: str, home) -> None:
    python = pypi_bin("instructor")
    (home / "driver.py").write_text(DRIVER)
    result = run([python, home / "driver.py", proxy_url, key, mode, model], cwd=home, env=offline_env(home))
    assert result.stdout.strip() == '{"name":"JASON","age":25}'


def test_instructor_tools_retry_hangs_under_the_rejected_answer(proxy, upstream, key, db, client_home):
    upstream.enqueue(Reply(content=None, tool_calls=[tool_call("call_i1", "User", '{"name": "jason", "age": 25}')]),
                     Reply(content=None, tool_calls=[tool_call("call_i2", "User", '{"name": "JASON", "age": 25}')]))
    _extract(proxy.url, key, "TOOLS", "gpt-4o-mini", client_home)

    retry = upstream.turn_requests[1].messages
    assert [m["role"] for m in retry] == ["system", "user", "assistant", "tool"]
    assert retry[3]["tool_call_id"] == "call_i1" and "name must be uppercase" in retry[3]["content"]
    conversations = conversations_of(db, tenant_of(key))
    assert len(conversations) == 1
    nodes = nodes_of(db, tenant_of(key), conversations[0]["id"])
    assert len(nodes) == 2 and nodes[1]["parent_id"] == nodes[0]["id"]
    assert nodes[1]["sent"] == [retry[3]]  # only the validation error: the rejected answer is node 0's


@pytest.mark.parametrize("mode", ["ANTHROPIC_TOOLS", "ANTHROPIC_JSON"])
def test_instructor_anthropic_retries(mproxy, claude, key, client_home, mode):
    if mode == "ANTHROPIC_TOOLS":
        claude.enqueue(*(AReply(content=[{"type": "tool_use", "id": f"toolu_i{n}", "name": "User",
                                          "input": {"name": name, "age": 25}}], stop_reason="tool_use")
                         for n, name in ((1, "jason"), (2, "JASON"))))
    else:
        claude.enqueue(AReply(content=[{"type": "text", "text": '{"name": "jason", "age": 25}'}]),
                       AReply(content=[{"type": "text", "text": '{"name": "JASON", "age": 25}'}]))
    _extract(mproxy.url, key, mode, "claude-sonnet-4-5", client_home)

    retry = claude.calls[1].body["messages"]
    conversations = conversations_of(mproxy.db, tenant_of(key))
    nodes = nodes_of(mproxy.db, tenant_of(key))
    assert len(nodes) == 2
    if mode == "ANTHROPIC_TOOLS":  # the rejected call, then its error as the tool's result
        assert [m["role"] for m in retry] == ["user", "assistant", "user"]
        result = retry[2]["content"][0]
        assert result["type"] == "tool_result" and result["tool_use_id"] == "toolu_i1" and result["is_error"] is True
        assert len(conversations) == 1 and nodes[1]["parent_id"] == nodes[0]["id"]
        assert nodes[1]["sent"] == [retry[2]]
    else:  # the question and the error, the rejected answer left out: it continues nothing stored
        assert [m["role"] for m in retry] == ["user", "user"] and "name must be uppercase" in retry[1]["content"]
        assert len(conversations) == 2 and nodes[1]["parent_id"] is None
