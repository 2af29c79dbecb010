"""Context editing in every API's own shape (docs/behaviour.md#context-editing): a Responses
client's ``function_call_output`` items reach a Responses upstream with the placeholder as their
``output``, an Anthropic client's ``tool_result`` blocks reach an Anthropic upstream with it as
their ``content`` (``is_error`` kept) -- asserted on what the fake upstreams received. (The viewer's
side: tests/test_ui.py::test_cleared_tool_results_and_their_originals.)"""

from __future__ import annotations

import json
from collections.abc import Iterator

import anthropic
import pytest

from proxy.compaction.clearing import PLACEHOLDER_PREFIX
from tests.anthropic_fake import AReply, FakeAnthropic
from tests.conftest import Db, Proxy, make_settings, serve_proxy
from tests.fakes import Reply, ServerThread
from tests.test_context_editing import clearing_nodes, output

LIMITS = {"native-tiny*": {"context_window": 4000, "max_output_tokens": 1000},
          "claude-tiny*": {"context_window": 4000, "max_output_tokens": 1000}}


@pytest.fixture(scope="module")
def claude_server() -> Iterator[tuple[FakeAnthropic, ServerThread]]:
    fake = FakeAnthropic()
    with ServerThread(fake) as server:
        yield fake, server


@pytest.fixture
def claude(claude_server: tuple[FakeAnthropic, ServerThread]) -> FakeAnthropic:
    claude_server[0].reset()
    return claude_server[0]


@pytest.fixture
def apis(fresh_database_url: str, upstream_url: str, claude_server: tuple[FakeAnthropic, ServerThread]) -> Iterator[Proxy]:
    settings = make_settings(fresh_database_url, upstream_url, models=LIMITS, upstreams=[
        {"name": "anthropic", "base_url": claude_server[1].url + "/v1", "models": ["claude-*"], "api": "anthropic"},
        {"name": "native", "base_url": upstream_url, "models": ["native-*"], "api": "responses"},
        {"name": "chatty", "base_url": upstream_url, "models": ["*"]},
    ])
    with serve_proxy(settings) as p:
        p.db = Db(fresh_database_url)
        yield p


def test_responses_function_call_outputs_are_cleared_natively(apis, upstream, key, cid):
    client = apis.openai(key)
    headers = {"X-Conversation-Id": cid}
    for i in range(7):
        call = {"id": f"call_{i}", "type": "function", "function": {"name": "shell", "arguments": json.dumps({"cmd": f"cat f{i}"})}}
        # the last tool call reports a context above the clearing threshold (1,500 of 3,000)
        big = {"input_tokens": 1600, "output_tokens": 10, "total_tokens": 1610} if i == 6 else None
        upstream.enqueue(Reply(content=None, tool_calls=[call], usage=big))
        client.responses.create(model="native-tiny", input=f"task {i}", extra_headers=headers)
        upstream.enqueue(Reply(content=f"done {i}"))
        client.responses.create(model="native-tiny", extra_headers=headers, input=[
            {"type": "function_call_output", "call_id": f"call_{i}", "output": output(i, 600)}])
    assert len(clearing_nodes(apis.db, cid)) == 1
    sent = upstream.responses_requests[-1].body["input"]
    outputs = [item for item in sent if item.get("type") == "function_call_output"]
    assert [o["call_id"] for o in outputs] == [f"call_{i}" for i in range(7)]
    assert all(o["output"].startswith(PLACEHOLDER_PREFIX) and "`shell`" in o["output"] for o in outputs[:4])
    assert [o["output"] for o in outputs[4:]] == [output(i, 600) for i in (4, 5, 6)]
    # the calls stay, each right before its output
    calls = [item["call_id"] for item in sent if item.get("type") == "function_call"]
    assert calls == [f"call_{i}" for i in range(7)]


def test_anthropic_tool_results_are_cleared_natively(apis, claude, key, cid):
    c = anthropic.Anthropic(base_url=f"{apis.url}/c/{cid}", api_key=key, max_retries=0)
    tools = [{"name": "Read", "description": "Read a file", "input_schema": {"type": "object"}}]
    for i in range(7):
        usage = {"input_tokens": 1600, "output_tokens": 10} if i == 6 else {"input_tokens": 11, "output_tokens": 5}
        claude.enqueue(AReply(content=[{"type": "tool_use", "id": f"toolu_{i}", "name": "Read",
                                        "input": {"path": f"f{i}.py"}}], stop_reason="tool_use", usage=usage))
        c.messages.create(model="claude-tiny", max_tokens=100, tools=tools,
                          messages=[{"role": "user", "content": f"task {i}"}])
        claude.enqueue(AReply(content=[{"type": "text", "text": f"done {i}"}]))
        c.messages.create(model="claude-tiny", max_tokens=100, tools=tools, messages=[{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": output(i, 600), "is_error": i == 1}]}])
    assert len(clearing_nodes(apis.db, cid)) == 1
    sent = claude.last.body["messages"]
    results = [b for m in sent if m["role"] == "user" and isinstance(m["content"], list)
               for b in m["content"] if b.get("type") == "tool_result"]
    assert [r["tool_use_id"] for r in results] == [f"toolu_{i}" for i in range(7)]
    assert all(r["content"].startswith(PLACEHOLDER_PREFIX) and "`Read`" in r["content"] for r in results[:4])
    assert results[1]["is_error"] is True
    assert [r["content"] for r in results[4:]] == [output(i, 600) for i in (4, 5, 6)]
    # each result's message follows the assistant message holding its tool_use
    for k, m in enumerate(sent):
        for b in m["content"] if isinstance(m["content"], list) else ():
            if b.get("type") == "tool_result":
                uses = [u["id"] for u in sent[k - 1]["content"] if u.get("type") == "tool_use"]
                assert b["tool_use_id"] in uses
