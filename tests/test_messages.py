"""Anthropic's Messages API on the tree, through the official ``anthropic`` SDK: natively over a
fake Anthropic upstream (which records what it received), translated over a chat and a Responses
upstream, and chat clients over the Anthropic upstream (docs/behaviour.md#the-messages-api)."""

from __future__ import annotations

import json
import threading
import uuid
from typing import Any

import anthropic
import httpx
import openai
import pytest

from proxy.dialects import crossing
from proxy.errors import InvalidRequest
from tests.anthropic_fake import AReply, FakeAnthropic
from tests.conftest import Db, Proxy, make_settings, new_key, serve_proxy, wait_for
from tests.fakes import FakeUpstream, Reply, ServerThread, free_port


def client(proxy: Proxy, key: str, prefix: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=f"{proxy.url}{prefix}", api_key=key, max_retries=0)


def admin(proxy: Proxy, key: str, path: str) -> Any:
    r = httpx.get(f"{proxy.url}{path}", headers={"x-api-key": key}, timeout=30)
    assert r.status_code == 200, r.text
    return r


def node(proxy: Proxy, key: str, node_id: str) -> dict[str, Any]:
    return admin(proxy, key, f"/admin/nodes/{node_id}").json()


def replay_verified(proxy: Proxy, key: str, node_id: str) -> str:
    return admin(proxy, key, f"/admin/nodes/{node_id}/request").headers["x-request-verified"]


# -- natively, over an Anthropic upstream ----------------------------------------------------------


def test_native_turns_store_only_what_is_new(mproxy: Proxy, claude: FakeAnthropic, key: str, cid: str) -> None:
    c = client(mproxy, key, f"/c/{cid}")
    r1 = c.messages.with_raw_response.create(model="claude-x", max_tokens=100, system="Be brief.",
                                             messages=[{"role": "user", "content": "hello"}])
    m1 = r1.parse()
    assert m1.content[0].text == "echo: hello"
    assert r1.headers["x-conversation-id"] == cid
    first = claude.last
    assert first.headers["x-api-key"] == key  # passthrough: the client's key, as Anthropic takes it
    assert first.headers["anthropic-version"]  # (the SDK's own, forwarded)
    assert "authorization" not in first.headers
    assert first.body["system"] == "Be brief."
    assert first.body["messages"] == [{"role": "user", "content": "hello"}]

    r2 = c.messages.with_raw_response.create(model="claude-x", max_tokens=100,
                                             messages=[{"role": "user", "content": "again"}])
    sent = claude.last.body
    assert sent["system"] == "Be brief."  # the system rule: the last one sent applies
    assert sent["messages"] == [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": [{"type": "text", "text": "echo: hello"}]},
        {"role": "user", "content": "again"},
    ]
    n2 = node(mproxy, key, r2.headers["x-node-id"])
    assert n2["api"] == "messages"
    assert n2["sent"] == [{"role": "user", "content": "again"}]
    assert n2["received"] == [{"role": "assistant", "content": [{"type": "text", "text": "echo: again"}]}]
    assert n2["parent_id"] == r1.headers["x-node-id"]
    assert replay_verified(mproxy, key, r2.headers["x-node-id"]) == "true"


def test_an_oauth_token_goes_to_anthropic_as_a_bearer_token(mproxy: Proxy, claude: FakeAnthropic, cid: str) -> None:
    """Claude Code signed in with a subscription sends an OAuth access token as a bearer token
    (with ``anthropic-beta: oauth-...``); Anthropic takes such a token only so -- as ``x-api-key``
    every call failed 401. The same token is the same tenant, call after call."""
    token = f"sk-ant-oat01-{uuid.uuid4().hex}"
    c = anthropic.Anthropic(base_url=f"{mproxy.url}/c/{cid}", auth_token=token, api_key=None, max_retries=0,
                            default_headers={"anthropic-beta": "oauth-2025-04-20"})
    nodes = []
    for text in ("hi", "again"):
        r = c.messages.with_raw_response.create(model="claude-x", max_tokens=10, messages=[{"role": "user", "content": text}])
        sent = claude.last.headers
        assert sent["authorization"] == f"Bearer {token}" and "x-api-key" not in sent
        assert sent["anthropic-beta"] == "oauth-2025-04-20"
        nodes.append((r.headers["x-node-id"], r.headers.get("x-parent-node-id")))
    assert nodes[1][1] == nodes[0][0]  # (the token's tenant, its conversation going on)
    c.messages.count_tokens(model="claude-x", messages=[{"role": "user", "content": "count"}])
    assert claude.requests[-1].headers["authorization"] == f"Bearer {token}"


def test_native_stream_relayed_and_reassembled(mproxy: Proxy, claude: FakeAnthropic, key: str, cid: str) -> None:
    c = client(mproxy, key, f"/c/{cid}")
    claude.enqueue(AReply(content=[
        {"type": "thinking", "thinking": "let me think", "signature": "sig-abc"},
        {"type": "text", "text": "I will list files."},
        {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls -la"}},
    ], stop_reason="tool_use"))
    with c.messages.stream(model="claude-x", max_tokens=100, messages=[{"role": "user", "content": "list"}],
                           tools=[{"name": "Bash", "description": "run", "input_schema": {"type": "object"}}]) as s:
        events = [e.type for e in s]
        final = s.get_final_message()
        node_id = s.response.headers["x-node-id"]
    assert "message_start" in events and "message_stop" in events
    assert final.stop_reason == "tool_use"
    assert [b.type for b in final.content] == ["thinking", "text", "tool_use"]
    assert final.content[2].input == {"command": "ls -la"}
    assert claude.last.body["stream"] is True
    stored = node(mproxy, key, node_id)
    assert stored["received"] == [{"role": "assistant", "content": [
        {"type": "thinking", "thinking": "let me think", "signature": "sig-abc"},
        {"type": "text", "text": "I will list files."},
        {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls -la"}},
    ]}]
    assert stored["usage"]["output_tokens"] == 5
    assert stored["finish_reason"] == "tool_calls"

    # the tool round: the thinking block goes back to the provider that produced it, signed
    c.messages.create(model="claude-x", max_tokens=100, messages=[{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt"}]}])
    sent = claude.last.body["messages"]
    assert sent[1]["content"][0] == {"type": "thinking", "thinking": "let me think", "signature": "sig-abc"}
    assert sent[2] == {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt"}]}


_COMPACTED = {"type": "compaction", "content": "SUMMARY: the user likes blue.", "encrypted_content": "ENC-123"}


@pytest.mark.parametrize("client_api", ["messages", "chat"])
def test_a_streamed_compaction_block_is_stored_and_sent_back_whole(mproxy: Proxy, claude: FakeAnthropic, key: str,
                                                                   cid: str, client_api: str) -> None:
    """Server-side compaction (``compact_20260112``) streams its block empty and its summary in a
    ``compaction_delta``: the block is stored whole and the next call sends it back whole -- it was
    stored ``content: null``, which Anthropic reads as no compaction, so every later call carried
    the whole uncompacted history again. A chat client's answer keeps it too (beside its text, as
    signed thinking is kept), for Claude's next call."""
    claude.enqueue(AReply(content=[_COMPACTED, {"type": "text", "text": "Blue it is."}]))
    question = [{"role": "user", "content": "long chat..."}]
    beta = {"anthropic-beta": "compact-2026-01-12"}
    if client_api == "messages":
        c = client(mproxy, key, f"/c/{cid}")
        with c.beta.messages.stream(model="claude-x", max_tokens=100, messages=question, extra_headers=beta,
                                    extra_body={"context_management": {"edits": [{"type": "compact_20260112"}]}}) as s:
            final = s.get_final_message()
            node_id = s.response.headers["x-node-id"]
        assert final.content[0].content == _COMPACTED["content"]  # (the client had it: the SDK's own accumulator)
        assert node(mproxy, key, node_id)["received"][0]["content"][0] == _COMPACTED
        c.messages.create(model="claude-x", max_tokens=100, messages=[{"role": "user", "content": "next"}])
    else:
        oc = mproxy.openai(key, conversation=cid)
        chunks = list(oc.chat.completions.create(model="claude-x", messages=question, stream=True, extra_headers=beta))
        assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == "Blue it is."
        oc.chat.completions.create(model="claude-x", messages=[{"role": "user", "content": "next"}])
    assert claude.last.body["messages"][1] == {"role": "assistant",
                                               "content": [_COMPACTED, {"type": "text", "text": "Blue it is."}]}


def test_a_delta_of_a_type_not_known_lands_on_its_block() -> None:
    """A block type Anthropic adds after this proxy was written streams its content in a delta of
    its own: the reassembled message keeps that content (text pieces joined, other fields set), as
    it is stored and sent back -- it was dropped, the block stored empty."""
    from proxy.dialects.messages.reassembly import Message

    acc = Message()
    for event in [{"type": "content_block_start", "index": 0, "content_block": {"type": "novel", "body": "", "n": 0}},
                  {"type": "content_block_delta", "index": 0, "delta": {"type": "novel_delta", "body": "ab", "n": 1}},
                  {"type": "content_block_delta", "index": 0, "delta": {"type": "novel_delta", "body": "cd", "n": 2}},
                  {"type": "content_block_stop", "index": 0}]:
        acc.feed(event)
    assert acc.content() == [{"type": "novel", "body": "abcd", "n": 2}]


def test_a_client_that_leaves_at_the_stop_reason_gets_its_answer_stored(mproxy: Proxy, claude: FakeAnthropic, key: str,
                                                                         cid: str, db: Db) -> None:
    """A client that stops reading at ``message_delta`` (its stop_reason and usage: the answer is
    whole; only ``message_stop`` is left) had its whole answer: the node is a success, with the
    usage that event brought, and the answer is the next call's context -- it was stored as
    client_disconnected, its answer lost to the model."""
    gate = threading.Event()
    claude.enqueue(AReply(content=[{"type": "text", "text": "The capital is Paris."}], gate=gate))
    c = client(mproxy, key, f"/c/{cid}")
    try:
        raw = c.messages.with_raw_response.create(model="claude-x", max_tokens=100, stream=True,
                                                  messages=[{"role": "user", "content": "capital of France?"}])
        node_id = raw.headers["x-node-id"]
        stream = raw.parse()
        for event in stream:
            if event.type == "message_delta" and event.delta.stop_reason:
                break
        stream.close()
        stored = wait_for(lambda: (row := db.node(node_id))["status"] != "pending" and row, 10, "the node stored")
        assert stored["status"] == "success" and stored["error"] is None, stored["error"]
        assert stored["usage"] == {"input_tokens": 11, "output_tokens": 5} and stored["finish_reason"] == "stop"
        c.messages.create(model="claude-x", max_tokens=100, messages=[{"role": "user", "content": "and of Italy?"}])
        assert claude.last.body["messages"] == [
            {"role": "user", "content": "capital of France?"},
            {"role": "assistant", "content": [{"type": "text", "text": "The capital is Paris."}]},
            {"role": "user", "content": "and of Italy?"}]
    finally:
        gate.set()


def test_query_string_and_beta_headers_forwarded(mproxy: Proxy, claude: FakeAnthropic, key: str, cid: str) -> None:
    r = httpx.post(f"{mproxy.url}/c/{cid}/v1/messages?beta=true", timeout=30, headers={
        "x-api-key": key, "anthropic-version": "2023-06-01", "anthropic-beta": "claude-code-20250219"},
        json={"model": "claude-x", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}],
              "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}})
    assert r.status_code == 200, r.text
    assert claude.last.path == "/v1/messages?beta=true"
    assert claude.last.headers["anthropic-beta"] == "claude-code-20250219"
    assert claude.last.body["context_management"] == {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}


def test_cache_control_markers_are_the_calls_own(mproxy: Proxy, claude: FakeAnthropic, key: str, cid: str) -> None:
    """Each turn marks its newest block (as Claude Code does): the upstream gets this call's
    markers only -- an older turn's marker is not sent again (Anthropic allows four)."""
    c = client(mproxy, key, f"/c/{cid}")
    system = [{"type": "text", "text": "You are a coder.", "cache_control": {"type": "ephemeral"}}]
    for i in range(5):
        c.messages.create(model="claude-x", max_tokens=10, system=system, messages=[{"role": "user", "content": [
            {"type": "text", "text": f"turn {i}", "cache_control": {"type": "ephemeral"}}]}])
    body = claude.last.body
    marked = [(i, j) for i, m in enumerate(body["messages"]) if isinstance(m["content"], list)
              for j, b in enumerate(m["content"]) if "cache_control" in b]
    assert marked == [(len(body["messages"]) - 1, 0)]
    assert body["system"] == system


def test_a_system_prompt_sent_once_keeps_its_markers(mproxy: Proxy, claude: FakeAnthropic, key: str, cid: str) -> None:
    """A delta client may send its system prompt with the first call only (the system rule): the
    later calls go on with it -- and with the markers its client put on it, or a client that
    caches its long system prompt would have it cached on the first call only. Beside the call's
    own markers, as many as Anthropic's limit of four leaves room for (the last ones)."""
    c = client(mproxy, key, f"/c/{cid}")
    system = [{"type": "text", "text": "You are a coder.", "cache_control": {"type": "ephemeral"}},
              {"type": "text", "text": "Long rules.", "cache_control": {"type": "ephemeral", "ttl": "1h"}}]
    c.messages.create(model="claude-x", max_tokens=10, system=system, messages=[{"role": "user", "content": "one"}])
    c.messages.create(model="claude-x", max_tokens=10, messages=[{"role": "user", "content": "two"}])
    assert claude.last.body["system"] == system
    marked = {"type": "text", "text": "x", "cache_control": {"type": "ephemeral"}}
    tools = [{"name": "T", "description": "d", "input_schema": {"type": "object"}, "cache_control": {"type": "ephemeral"}}]
    c.messages.create(model="claude-x", max_tokens=10, tools=tools, messages=[{"role": "user", "content": [marked, marked]}])
    assert claude.last.body["system"] == [{"type": "text", "text": "You are a coder."}, system[1]]  # (4 in all)
    c.messages.create(model="claude-x", max_tokens=10, tools=tools, messages=[{"role": "user", "content": [marked] * 3}])
    assert claude.last.body["system"] == [{"type": "text", "text": "You are a coder."}, {"type": "text", "text": "Long rules."}]
    # a call that sends its system field has exactly its own markers, as before
    c.messages.create(model="claude-x", max_tokens=10, system=[{"type": "text", "text": "You are a coder."}],
                      messages=[{"role": "user", "content": "three"}])
    assert claude.last.body["system"] == [{"type": "text", "text": "You are a coder."}]


def _marker_paths(value: Any, at: str = "") -> list[str]:
    """Where ``cache_control`` markers are in a JSON value, as dotted paths."""
    if isinstance(value, dict):
        return [at] * ("cache_control" in value) + [
            p for k, v in value.items() if k != "cache_control" for p in _marker_paths(v, f"{at}.{k}")]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _marker_paths(v, f"{at}.{i}")]
    return []


def test_markers_inside_blocks_are_the_calls_own_too(mproxy: Proxy, claude: FakeAnthropic, key: str,
                                                     cid: str) -> None:
    """A client that marks the text inside its newest tool result each turn (the SDK's MCP helper,
    ``mcp_content(..., cache_control=...)``), or a block of a document's ``content`` source: the
    upstream gets this call's markers only, where the client put them -- before, an earlier call's
    marker inside an old block was sent again, and past four Anthropic refused every marked call,
    so the tool loop could not go on. A call with no marker sends none; ``/request`` rebuilds the
    body with the inner positions."""
    c = client(mproxy, key, f"/c/{cid}")
    tools = [{"name": "Bash", "input_schema": {"type": "object"}}]
    claude.enqueue(AReply(content=[{"type": "tool_use", "id": "toolu_0", "name": "Bash", "input": {}}],
                          stop_reason="tool_use"))
    c.messages.create(model="claude-x", max_tokens=10, tools=tools, messages=[{"role": "user", "content": "go"}])
    for i in range(6):
        claude.enqueue(AReply(content=[{"type": "tool_use", "id": f"toolu_{i + 1}", "name": "Bash", "input": {}}],
                              stop_reason="tool_use"))
        r = c.messages.with_raw_response.create(model="claude-x", max_tokens=10, tools=tools, messages=[
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": [
                {"type": "text", "text": f"out {i}", "cache_control": {"type": "ephemeral"}}]}]}])
        body = claude.last.body
        last = len(body["messages"]) - 1
        assert _marker_paths(body["messages"]) == [f".{last}.content.0.content.0"]
        assert body["messages"][-1]["content"][0]["content"][0] == {"type": "text", "text": f"out {i}",
                                                                    "cache_control": {"type": "ephemeral"}}
    assert replay_verified(mproxy, key, r.headers["x-node-id"]) == "true"

    document = {"type": "document", "source": {"type": "content", "content": [
        {"type": "text", "text": "page 1"}, {"type": "text", "text": "page 2", "cache_control": {"type": "ephemeral"}}]}}
    c.messages.create(model="claude-x", max_tokens=10, tools=tools, messages=[{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_6", "content": "done"}, document]}])
    last = len(claude.last.body["messages"]) - 1
    assert _marker_paths(claude.last.body["messages"]) == [f".{last}.content.1.source.content.1"]

    c.messages.create(model="claude-x", max_tokens=10, tools=tools, messages=[{"role": "user", "content": "thanks"}])
    assert _marker_paths(claude.last.body) == []


def _a_session_at_a_tool_call(mproxy: Proxy, claude: FakeAnthropic, question: str, tool: str,
                              tool_id: str) -> tuple[Any, dict[str, str], list[dict[str, Any]], list[dict[str, Any]]]:
    """A full-history session (Claude Code's shape, under /auto) whose first answer calls
    ``tool``: (the client, its session header, the tools, the question and the call)."""
    c = client(mproxy, new_key(), "/auto")
    session = {"X-Claude-Code-Session-Id": f"s-{uuid.uuid4().hex[:8]}"}
    tools = [{"name": tool, "input_schema": {"type": "object"}}]
    base = [{"role": "user", "content": question},
            {"role": "assistant", "content": [{"type": "tool_use", "id": tool_id, "name": tool, "input": {}}]}]
    claude.enqueue(AReply(content=base[1]["content"], stop_reason="tool_use"))
    c.messages.create(model="claude-x", max_tokens=10, tools=tools, messages=base[:1], extra_headers=session)
    return c, session, tools, base


def test_full_history_an_old_marker_inside_a_block_is_not_sent_again(mproxy: Proxy, claude: FakeAnthropic) -> None:
    """Full history: the stored copy of a tool result keeps the marker inside it that the client
    sent then; a later call that resends the block without it (its marker moved on) gets the
    block as it sends it now -- the stored marker matched nothing and is not sent."""
    c, session, tools, base = _a_session_at_a_tool_call(mproxy, claude, "go", "Bash", "toolu_0")

    def result(**marker: Any) -> dict[str, Any]:
        return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_0",
                                             "content": [{"type": "text", "text": "out", **marker}]}]}
    marked = [*base, result(cache_control={"type": "ephemeral"})]
    claude.enqueue(AReply(content=[{"type": "text", "text": "done"}]))
    c.messages.create(model="claude-x", max_tokens=10, tools=tools, messages=marked, extra_headers=session)
    assert claude.last.body["messages"] == marked

    later = [*base, result(), {"role": "assistant", "content": [{"type": "text", "text": "done"}]},
             {"role": "user", "content": "next"}]
    r = c.messages.with_raw_response.create(model="claude-x", max_tokens=10, tools=tools, messages=later,
                                            extra_headers=session)
    assert r.headers["x-context-matched"] == "4"
    assert claude.last.body["messages"] == later


@pytest.mark.parametrize("kind, source", [("document", {"type": "url", "url": "https://example.com/%s.pdf"}),
                                          ("document", {"type": "file", "file_id": "file_%s"}),
                                          ("image", {"type": "file", "file_id": "file_%s"})],
                         ids=["document-url", "document-file-id", "image-file-id"])
def test_full_history_another_attachment_by_url_or_file_id_is_not_matched(mproxy: Proxy, claude: FakeAnthropic,
                                                                         kind: str, source: dict[str, str]) -> None:
    """Full history: a resent history whose attachment by URL or by file id is another one is
    another history -- before, the line such a block reads as for chat (what matching compares)
    said only "(url)" or "(file)", so any two matched, and Anthropic got the first call's
    attachment in place of the one the client sent. The line names the URL or the file id now."""
    def attached(name: str) -> dict[str, Any]:
        return {"type": kind, "source": {k: v % name if k in ("url", "file_id") else v for k, v in source.items()}}
    c = client(mproxy, new_key(), "/auto")
    session = {"X-Claude-Code-Session-Id": f"s-{uuid.uuid4().hex[:8]}"}
    first = c.messages.create(model="claude-x", max_tokens=10, extra_headers=session, messages=[
        {"role": "user", "content": [attached("A"), {"type": "text", "text": "summarise"}]}])
    history = [{"role": "user", "content": [attached("B"), {"type": "text", "text": "summarise"}]},
               {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
               {"role": "user", "content": "and the conclusion?"}]
    r = c.messages.with_raw_response.create(model="claude-x", max_tokens=10, extra_headers=session, messages=history)
    assert r.headers["x-context-matched"] == "0"
    assert claude.last.body["messages"] == history


def test_full_history_another_screenshot_in_a_tool_result_is_not_matched(mproxy: Proxy, claude: FakeAnthropic) -> None:
    """Full history: a tool result's image (Claude Code's screenshot, base64) reads for chat as a
    line, and matching compares that line -- it named only the media type, so a resent history
    with another screenshot for the same tool call matched the stored one and Anthropic got the
    stored screenshot, not the client's. The line names a digest of the image's bytes."""
    c, session, tools, base = _a_session_at_a_tool_call(mproxy, claude, "look at the screen", "Screenshot", "toolu_s")

    def shot(fill: str) -> dict[str, Any]:
        return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_s", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": fill * 40}}]}]}
    claude.enqueue(AReply(content=[{"type": "text", "text": "a login form"}]))
    c.messages.create(model="claude-x", max_tokens=10, tools=tools, messages=[*base, shot("A")], extra_headers=session)
    history = [*base, shot("B"), {"role": "assistant", "content": [{"type": "text", "text": "a login form"}]},
               {"role": "user", "content": "what now?"}]
    r = c.messages.with_raw_response.create(model="claude-x", max_tokens=10, tools=tools, messages=history,
                                            extra_headers=session)
    assert r.headers["x-context-matched"] == "2"  # (the question and the call: the same)
    assert claude.last.body["messages"] == history


def test_count_tokens(mproxy: Proxy, claude: FakeAnthropic, key: str) -> None:
    c = client(mproxy, key, "")
    assert c.messages.count_tokens(model="claude-x", messages=[{"role": "user", "content": "hi"}]).input_tokens == 42
    assert claude.requests[-1].path == "/v1/messages/count_tokens"
    estimated = c.messages.count_tokens(model="gpt-x", messages=[{"role": "user", "content": "hello " * 50}])
    assert 40 <= estimated.input_tokens <= 80


def test_count_tokens_of_a_delta_conversation_counts_what_the_call_would_send(
        mproxy: Proxy, claude: FakeAnthropic, key: str, cid: str) -> None:
    """A delta client sends only what is new, so its count must be of the request the call would
    make -- the stored context, then its messages: counted as it came, a tool result alone is an
    orphan Anthropic refuses, and any count is of a fraction of the input."""
    c = client(mproxy, key, f"/c/{cid}")
    tools = [{"name": "Bash", "description": "run", "input_schema": {"type": "object"}}]
    claude.enqueue(AReply(content=[{"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"c": "ls"}}],
                          stop_reason="tool_use"))
    c.messages.create(model="claude-x", max_tokens=10, system="Be brief.", tools=tools,
                      messages=[{"role": "user", "content": "list files"}])
    new = [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt"}]}]
    assert c.messages.count_tokens(model="claude-x", tools=tools, messages=new).input_tokens == 42
    counted = claude.requests[-1]
    assert counted.path == "/v1/messages/count_tokens"
    c.messages.create(model="claude-x", max_tokens=10, tools=tools, messages=new)
    sent = claude.last.body
    assert counted.body["messages"] == sent["messages"] and counted.body["system"] == sent["system"] == "Be brief."
    assert "max_tokens" not in counted.body  # (the count's own fields: nothing of the call's added)
    # over a chat upstream, the estimate grows with the stored context too
    g = client(mproxy, key, f"/c/{cid}-chat")
    ask = [{"role": "user", "content": "hello " * 50}]
    before = g.messages.count_tokens(model="gpt-x", messages=ask).input_tokens
    g.messages.create(model="gpt-x", max_tokens=10, messages=ask)
    assert g.messages.count_tokens(model="gpt-x", messages=ask).input_tokens > 2 * before - 10


def test_without_a_conversation_passes_through(mproxy: Proxy, claude: FakeAnthropic, key: str) -> None:
    r = client(mproxy, key, "").messages.with_raw_response.create(
        model="claude-x", max_tokens=10, messages=[{"role": "user", "content": "plain"}])
    assert r.parse().id == f"msg_fake{claude.counter}"  # the upstream's answer, untouched
    assert "x-node-id" not in r.headers


def test_without_a_conversation_over_chat_is_translated_and_not_stored(mproxy: Proxy, upstream: FakeUpstream,
                                                                        key: str) -> None:
    """No conversation named, an upstream of another API: translated both ways, answers and streams
    and failures alike, and nothing stored -- the headers of a stored call are not even read."""
    c = client(mproxy, key, "")
    history = [{"role": "user", "content": "first"}, {"role": "assistant", "content": "one"},
               {"role": "user", "content": [{"type": "text", "text": "second", "cache_control": {"type": "ephemeral"}}]}]
    r = c.messages.with_raw_response.create(model="gpt-x", max_tokens=20, system="Sys.", messages=history,
                                            extra_headers={"X-Parent-Node-Id": "not-a-node", "X-Context-Mode": "bogus"})
    m = r.parse()
    assert m.content[0].text == "echo: second" and m.id.startswith("msg_")
    assert not any(h in r.headers for h in ("x-node-id", "x-conversation-id", "x-parent-node-id"))
    assert upstream.last.body["messages"] == [  # exactly the client's messages, translated
        {"role": "system", "content": "Sys."}, {"role": "user", "content": "first"},
        {"role": "assistant", "content": "one"}, {"role": "user", "content": "second"}]

    with c.messages.stream(model="gpt-x", max_tokens=20, messages=[{"role": "user", "content": "streamed"}]) as s:
        assert "".join(s.text_stream) == "echo: streamed"
        assert "x-node-id" not in s.response.headers
    assert upstream.last.body["messages"] == [{"role": "user", "content": "streamed"}]

    upstream.enqueue(Reply(kind="error", status=429))
    with pytest.raises(anthropic.RateLimitError) as limited:
        c.messages.create(model="gpt-x", max_tokens=20, messages=[{"role": "user", "content": "again"}])
    assert limited.value.body["type"] == "error" and "x-node-id" not in limited.value.response.headers

    listed = admin(mproxy, key, "/admin/conversations").json()
    assert listed["data"] == []  # nothing stored for this tenant
    assert admin(mproxy, key, "/admin/usage").json()["calls"] == 0


# -- errors -----------------------------------------------------------------------------------------


def test_errors_have_anthropics_shape(mproxy: Proxy, claude: FakeAnthropic, key: str, cid: str) -> None:
    c = client(mproxy, key, f"/c/{cid}")
    with pytest.raises(anthropic.BadRequestError) as bad:
        c.messages.create(model="claude-x", max_tokens=10, messages="nope")  # type: ignore[arg-type]
    assert bad.value.body["type"] == "error" and bad.value.body["error"]["type"] == "invalid_request_error"
    r = httpx.post(f"{mproxy.url}/c/{cid}/v1/messages", json={"model": "claude-x", "messages": []}, timeout=30)
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"

    claude.enqueue(AReply(status=529, error={"type": "overloaded_error", "message": "Overloaded"}))
    with pytest.raises(anthropic.APIStatusError) as busy:
        c.messages.create(model="claude-x", max_tokens=10, messages=[{"role": "user", "content": "hi"}])
    assert busy.value.status_code == 529
    assert busy.value.body == {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}


def test_prompt_too_long_is_a_context_overflow(mproxy: Proxy, claude: FakeAnthropic, key: str, cid: str) -> None:
    c = client(mproxy, key, f"/c/{cid}")
    claude.enqueue(AReply(status=400, error={"type": "invalid_request_error",
                                              "message": "prompt is too long: 210000 tokens > 200000 maximum"}))
    with pytest.raises(anthropic.BadRequestError) as exc:
        c.messages.with_raw_response.create(model="claude-x", max_tokens=10, messages=[{"role": "user", "content": "x"}])
    assert exc.value.body["error"]["type"] == "invalid_request_error"
    assert "prompt is too long" in exc.value.body["error"]["message"]
    node_id = exc.value.response.headers["x-node-id"]
    assert node(mproxy, key, node_id)["error"]["code"] == "context_overflow"


def test_a_context_overflow_over_chat_says_prompt_is_too_long(mproxy: Proxy, upstream: FakeUpstream, key: str,
                                                               cid: str) -> None:
    """A chat upstream's overflow (OpenAI's "maximum context length") reaches a Messages client in
    Anthropic's words, "prompt is too long" first -- what Claude Code reads as "compact and try
    again" -- the upstream's own words after them."""
    c = client(mproxy, key, f"/c/{cid}")
    said = "This model's maximum context length is 8192 tokens. However, you requested 9000 tokens."
    upstream.enqueue(Reply(kind="error", status=400, error={"message": said, "type": "invalid_request_error",
                                                            "param": "messages", "code": "context_length_exceeded"}))
    with pytest.raises(anthropic.BadRequestError) as exc:
        c.messages.create(model="gpt-x", max_tokens=10, messages=[{"role": "user", "content": "x"}])
    assert exc.value.body["error"] == {"type": "invalid_request_error", "message": f"prompt is too long: {said}"}
    # another failure keeps its words
    upstream.enqueue(Reply(kind="error", status=400, error={"message": "bad temperature", "type": "invalid_request_error"}))
    with pytest.raises(anthropic.BadRequestError) as other:
        c.messages.create(model="gpt-x", max_tokens=10, messages=[{"role": "user", "content": "y"}])
    assert other.value.body["error"]["message"] == "bad temperature"
    # an overflow a chat upstream reports in its stream -- before any answer, or after a first chunk
    # -- ends the Messages stream with an error event in the same words (Claude Code streams)
    error = {"error": {"message": said, "type": "invalid_request_error", "code": "context_length_exceeded"}}
    first = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "gpt-x",
             "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
    for events in ([error], [first, error]):
        upstream.enqueue(Reply(kind="raw", content_type="text/event-stream",
                               body=b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)))
        r = httpx.post(f"{mproxy.url}/c/{cid}/v1/messages", headers={"x-api-key": key}, timeout=30,
                       json={"model": "gpt-x", "max_tokens": 10, "stream": True,
                             "messages": [{"role": "user", "content": "z"}]})
        last = [line for line in r.text.splitlines() if line.startswith("data: ")][-1]
        assert json.loads(last[6:])["error"]["message"] == f"prompt is too long: {said}"


def test_stream_error_event(mproxy: Proxy, claude: FakeAnthropic, key: str, cid: str) -> None:
    c = client(mproxy, key, f"/c/{cid}")
    claude.enqueue(AReply(content=[{"type": "text", "text": "partial"}],
                          stream_error={"type": "overloaded_error", "message": "Overloaded"}))
    with pytest.raises(anthropic.APIStatusError):
        with c.messages.stream(model="claude-x", max_tokens=10, messages=[{"role": "user", "content": "x"}]) as s:
            for _ in s:
                pass
    r = client(mproxy, key, f"/c/{cid}").messages.with_raw_response.create(
        model="claude-x", max_tokens=10, messages=[{"role": "user", "content": "y"}])
    # a transient failure keeps its question (the head is on it), never the partial answer
    assert claude.last.body["messages"] == [{"role": "user", "content": "x"}, {"role": "user", "content": "y"}]
    assert r.parse().content[0].text == "echo: y"


# -- translated: an Anthropic client over a chat upstream -------------------------------------------


def test_over_chat_tool_round(mproxy: Proxy, upstream: FakeUpstream, key: str, cid: str) -> None:
    c = client(mproxy, key, f"/c/{cid}")
    tools = [{"name": "Bash", "description": "Run a command", "input_schema": {
        "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}},
        {"type": "web_search_20250305", "name": "web_search", "max_uses": 2}]
    upstream.enqueue(Reply(content="Running it.", tool_calls=[
        {"id": "call_1", "type": "function", "function": {"name": "Bash", "arguments": '{"command": "echo hi"}'}}]))
    r = c.messages.with_raw_response.create(model="gpt-x", max_tokens=300, system="You code.", tools=tools,
                                            tool_choice={"type": "auto", "disable_parallel_tool_use": True},
                                            metadata={"user_id": "u1"},
                                            messages=[{"role": "user", "content": "say hi"}])
    m = r.parse()
    assert r.headers["x-branchpoint-dropped-tools"] == "web_search_20250305"
    assert m.id == f"msg_{uuid.UUID(r.headers['x-node-id']).hex}"
    assert m.stop_reason == "tool_use"
    assert [(b.type, getattr(b, "text", None) or getattr(b, "input", None)) for b in m.content] == [
        ("text", "Running it."), ("tool_use", {"command": "echo hi"})]
    sent = upstream.last.body
    assert sent["messages"] == [{"role": "system", "content": "You code."}, {"role": "user", "content": "say hi"}]
    assert sent["tools"] == [{"type": "function", "function": {"name": "Bash", "description": "Run a command",
                                                               "parameters": tools[0]["input_schema"]}}]
    assert sent["tool_choice"] == "auto" and sent["parallel_tool_calls"] is False
    assert sent["max_tokens"] == 300 and sent["user"] == "u1"

    m2 = c.messages.create(model="gpt-x", max_tokens=300, tools=tools, messages=[{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "call_1", "content": [{"type": "text", "text": "hi"}]},
        {"type": "text", "text": "what did it print?"}]}])
    assert m2.content[0].text == "echo: what did it print?"
    assert upstream.last.body["messages"][2:] == [
        {"role": "assistant", "content": "Running it.", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "Bash", "arguments": '{"command":"echo hi"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "hi"},
        {"role": "user", "content": "what did it print?"},
    ]


def test_over_chat_stream(mproxy: Proxy, upstream: FakeUpstream, key: str, cid: str) -> None:
    c = client(mproxy, key, f"/c/{cid}")
    upstream.enqueue(Reply(kind="stream", content="Let me run it.", reasoning="thinking hard", tool_calls=[
        {"id": "call_9", "type": "function", "function": {"name": "Bash", "arguments": '{"command": "pwd"}'}}],
        usage={"prompt_tokens": 30, "completion_tokens": 9, "total_tokens": 39,
               "prompt_tokens_details": {"cached_tokens": 20}}))
    with c.messages.stream(model="gpt-x", max_tokens=50, messages=[{"role": "user", "content": "where?"}],
                           tools=[{"name": "Bash", "input_schema": {"type": "object"}}]) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
        node_id = s.response.headers["x-node-id"]
    assert text == "Let me run it."
    assert [b.type for b in final.content] == ["thinking", "text", "tool_use"]
    assert final.content[2].input == {"command": "pwd"} and final.content[2].id == "call_9"
    assert final.stop_reason == "tool_use"
    assert final.usage.input_tokens == 10 and final.usage.cache_read_input_tokens == 20
    assert final.usage.output_tokens == 9
    stored = node(mproxy, key, node_id)
    assert stored["received"][0]["content"][2] == {"type": "tool_use", "id": "call_9", "name": "Bash",
                                                   "input": {"command": "pwd"}}
    assert replay_verified(mproxy, key, node_id) == "true"


@pytest.mark.parametrize("kind", ["json", "stream"])
def test_over_chat_tool_calls_finished_with_stop_are_tool_use(mproxy: Proxy, upstream: FakeUpstream, key: str,
                                                              cid: str, kind: str) -> None:
    """Gemini's OpenAI-compatible endpoint finishes an answer of tool calls with ``stop``: the
    Messages client gets ``stop_reason: tool_use`` all the same -- with ``end_turn`` the anthropic
    SDK's tool runner took the turn as over and never ran the tool."""
    upstream.enqueue(Reply(kind=kind, content=None, finish_reason="stop", tool_calls=[
        {"id": "fc-1", "type": "function", "function": {"name": "Bash", "arguments": '{"command": "pwd"}'}}]))
    c = client(mproxy, key, f"/c/{cid}")
    asked: dict[str, Any] = {"model": "gemini-3-flash-preview", "max_tokens": 50,
                             "tools": [{"name": "Bash", "input_schema": {"type": "object"}}],
                             "messages": [{"role": "user", "content": "where?"}]}
    final = _final_message(c, asked, kind)
    assert [b.type for b in final.content] == ["tool_use"] and final.stop_reason == "tool_use"


def _final_message(c: Any, asked: dict[str, Any], kind: str) -> Any:
    """The answer to ``asked`` as the anthropic SDK reads it, whole (json) or streamed."""
    if kind == "json":
        return c.messages.create(**asked)
    with c.messages.stream(**asked) as s:
        return s.get_final_message()


@pytest.mark.parametrize("kind", ["json", "stream"])
def test_over_chat_a_thinking_part_is_a_thinking_block(mproxy: Proxy, upstream: FakeUpstream, key: str, cid: str,
                                                        kind: str) -> None:
    """Mistral's reasoning models answer with content as parts, a ``thinking`` part first: the
    Messages client gets a thinking block before the text, whole or streamed alike -- a whole
    answer's thinking part was dropped."""
    parts = [{"type": "thinking", "thinking": [{"type": "text", "text": "the chain of it"}]},
             {"type": "text", "text": "Hello world"}]
    if kind == "json":
        upstream.enqueue(Reply(extra_message={"content": parts}))
    else:
        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            return b"data: " + json.dumps({"id": "m", "object": "chat.completion.chunk", "created": 1, "model": "m",
                                           "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}).encode()
        upstream.enqueue(Reply(kind="raw", content_type="text/event-stream", body=b"\n\n".join([
            chunk({"role": "assistant", "content": parts[:1]}), chunk({"content": parts[1:]}), chunk({}, "stop"),
            b"data: [DONE]"]) + b"\n\n"))
    c = client(mproxy, key, f"/c/{cid}")
    asked: dict[str, Any] = {"model": "magistral-medium-latest", "max_tokens": 50,
                             "messages": [{"role": "user", "content": "hi"}]}
    final = _final_message(c, asked, kind)
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in final.content] == [
        ("thinking", "the chain of it"), ("text", "Hello world")]


def test_over_chat_a_stream_without_done_ends_with_message_stop(mproxy: Proxy, upstream: FakeUpstream, key: str,
                                                                 cid: str) -> None:
    """A chat upstream that ends its stream's body after the finishing chunk, with no [DONE]: the
    Messages client still gets the whole message and its message_stop, and the answer is stored."""
    c = client(mproxy, key, f"/c/{cid}")
    upstream.enqueue(Reply(kind="stream", content="Complete answer.", done=False))
    with c.messages.stream(model="gpt-x", max_tokens=50, messages=[{"role": "user", "content": "hi"}]) as s:
        final = s.get_final_message()
        node_id = s.response.headers["x-node-id"]
    assert final.content[0].text == "Complete answer." and final.stop_reason == "end_turn"
    assert node(mproxy, key, node_id)["status"] == "success"


def test_over_chat_a_reasoning_that_ends_like_a_key_begins_stays_one_block(mproxy: Proxy, upstream: FakeUpstream,
                                                                           key: str, cid: str) -> None:
    """The masker holds back a reasoning's end that could begin the client's key ("...files": an
    "s", as "sk-" begins); it goes out before the text starts, so the thinking block closes whole
    -- not with its last letter in a second thinking block after the text."""
    c = client(mproxy, key, f"/c/{cid}")
    upstream.enqueue(Reply(kind="stream", content="Answer.", reasoning="Let me check the files"))
    with c.messages.stream(model="gpt-x", max_tokens=50, messages=[{"role": "user", "content": "look"}]) as s:
        events = list(s)
        final = s.get_final_message()
    starts = [e.content_block.type for e in events if e.type == "content_block_start"]
    assert starts == ["thinking", "text"]
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[0].thinking == "Let me check the files" and final.content[1].text == "Answer."


def test_over_chat_structured_output_and_effort(mproxy: Proxy, upstream: FakeUpstream, key: str, cid: str) -> None:
    """``output_config`` has words in chat: its ``format`` (structured output, a JSON schema: the
    SDK's ``messages.parse(output_format=...)``) is chat's strict ``response_format``, its
    ``effort`` chat's ``reasoning_effort`` -- before, both were dropped, the model answered in
    prose and the SDK failed validating it. A Responses upstream gets them through chat, as
    ``text.format`` and ``reasoning.effort``."""
    from pydantic import BaseModel

    class City(BaseModel):
        name: str

    c = client(mproxy, key, f"/c/{cid}")
    upstream.enqueue(Reply(content='{"name": "Paris"}'))
    m = c.messages.parse(model="gpt-x", max_tokens=50, output_format=City, output_config={"effort": "high"},
                         messages=[{"role": "user", "content": "a city"}])
    assert m.parsed_output == City(name="Paris")
    sent = upstream.last.body
    assert sent["reasoning_effort"] == "high"
    assert sent["response_format"]["type"] == "json_schema"
    schema = sent["response_format"]["json_schema"]
    assert (schema["name"], schema["strict"]) == ("output", True)
    assert schema["schema"]["properties"] == {"name": {"title": "Name", "type": "string"}}

    c.messages.create(model="native-x", max_tokens=50, messages=[{"role": "user", "content": "another"}],
                      output_config={"effort": "low", "format": {"type": "json_schema", "schema": schema["schema"]}})
    body = upstream.responses_requests[-1].body
    assert body["reasoning"]["effort"] == "low"
    assert body["text"]["format"] == {"type": "json_schema", "name": "output", "schema": schema["schema"],
                                      "strict": True}
    # a schema chat's strict mode refuses (a property left out of required: Pydantic's default
    # value; an object not closed) goes as a guide, not strict -- a refusal would be worse
    for loose in ({"type": "object", "properties": {"name": {"type": "string"}, "size": {"type": "integer"}},
                   "required": ["name"], "additionalProperties": False},
                  {"type": "object", "properties": {"city": {"type": "object", "properties": {"n": {"type": "string"}},
                                                             "required": ["n"]}},
                   "required": ["city"], "additionalProperties": False},
                  {"type": "object", "additionalProperties": {"type": "string"}}):
        c.messages.create(model="gpt-x", max_tokens=50, messages=[{"role": "user", "content": "loose"}],
                          output_config={"format": {"type": "json_schema", "schema": loose}})
        assert upstream.last.body["response_format"]["json_schema"]["strict"] is False


def test_over_responses_upstream(mproxy: Proxy, upstream: FakeUpstream, key: str, cid: str) -> None:
    """Neither side speaks chat: translated through it, both ways, streams too."""
    c = client(mproxy, key, f"/c/{cid}")
    m = c.messages.create(model="native-x", max_tokens=20, system="Sys.", messages=[{"role": "user", "content": "hey"}])
    sent = upstream.responses_requests[-1].body
    assert sent["store"] is False and sent["max_output_tokens"] == 20
    assert [i.get("role") for i in sent["input"]] == ["system", "user"]
    assert m.content[0].type == "text" and m.content[0].text
    with c.messages.stream(model="native-x", max_tokens=20, messages=[{"role": "user", "content": "more"}]) as s:
        streamed = "".join(s.text_stream)
        final = s.get_final_message()
    assert streamed and final.content[0].text == streamed
    assert [i.get("role") for i in upstream.responses_requests[-1].body["input"]] == ["system", "user", "assistant", "user"]


# -- chat clients over the Anthropic upstream --------------------------------------------------------


def test_chat_client_over_anthropic(mproxy: Proxy, claude: FakeAnthropic, key: str, cid: str) -> None:
    oc = mproxy.openai(key, conversation=cid)
    claude.enqueue(AReply(content=[{"type": "text", "text": "Checking."},
                                   {"type": "tool_use", "id": "toolu_7", "name": "lookup", "input": {"q": "x"}}],
                          stop_reason="tool_use", usage={"input_tokens": 3, "output_tokens": 4,
                                                         "cache_read_input_tokens": 10}))
    r = oc.chat.completions.create(model="claude-x", messages=[
        {"role": "system", "content": "Be exact."}, {"role": "user", "content": "find x"}],
        tools=[{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}],
        stop="END", user="someone")
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Checking."
    assert choice.message.tool_calls[0].id == "toolu_7"
    assert json.loads(choice.message.tool_calls[0].function.arguments) == {"q": "x"}
    assert r.usage.prompt_tokens == 13 and r.usage.prompt_tokens_details.cached_tokens == 10
    assert claude.last.headers["anthropic-version"] == "2023-06-01"  # (the client named none)
    assert "authorization" not in claude.last.headers
    sent = claude.last.body
    assert sent["system"] == "Be exact."
    assert sent["messages"] == [{"role": "user", "content": [{"type": "text", "text": "find x"}]}]
    assert sent["max_tokens"] == 4096 and sent["stop_sequences"] == ["END"]
    assert sent["tools"] == [{"name": "lookup", "input_schema": {"type": "object"}}]
    assert sent["metadata"] == {"user_id": "someone"}

    stream = oc.chat.completions.create(model="claude-x", stream=True, stream_options={"include_usage": True},
                                        messages=[{"role": "tool", "tool_call_id": "toolu_7", "content": "found"}])
    chunks = list(stream)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == "echo: find x"  # (the fake echoes the last user *text*: the first question's)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5
    assert claude.last.body["messages"][1:] == [
        {"role": "assistant", "content": [{"type": "text", "text": "Checking."},
                                          {"type": "tool_use", "id": "toolu_7", "name": "lookup", "input": {"q": "x"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_7", "content": "found"}]},
    ]


_CLOSED = {"type": "object", "properties": {"k": {"type": "string"}}, "required": ["k"], "additionalProperties": False}
_OPEN = {"type": "object", "properties": {"k": {"type": "string"}, "n": {"type": "number"}}, "required": ["k"]}


@pytest.mark.parametrize("client_api, model", [("messages", "gpt-x"), ("messages", "native-1"), ("chat", "claude-x"),
                                               ("responses", "claude-x")])
def test_a_tools_strict_reaches_the_upstream_as_asked(mproxy: Proxy, upstream: FakeUpstream, claude: FakeAnthropic,
                                                      key: str, cid: str, client_api: str, model: str) -> None:
    """A Messages client's tool ``strict`` is what it asked towards OpenAI's chat and Responses
    APIs: it was dropped -- towards a Responses upstream, whose tools are strict unless they say
    otherwise, it even became ``strict: false``. A schema chat's strict mode refuses (a property
    left out of ``required``, an object not closed) goes as non-strict. Towards Anthropic a chat or
    Responses client's ``strict`` is left out: Anthropic refuses strict tools on models without
    structured outputs, and OpenAI's clients send ``strict: true`` on every tool by default."""
    if client_api == "messages":
        path, body = "/v1/messages", {"max_tokens": 50, "tools": [
            {"name": "a", "input_schema": _CLOSED, "strict": True}, {"name": "b", "input_schema": _OPEN, "strict": True},
            {"name": "c", "input_schema": _CLOSED}]}
    elif client_api == "chat":
        path, body = "/v1/chat/completions", {"tools": [
            {"type": "function", "function": {"name": n, "parameters": _CLOSED, **strict}}
            for n, strict in (("a", {"strict": True}), ("b", {"strict": False}), ("c", {}))]}
    else:
        path, body = "/v1/responses", {"tools": [
            {"type": "function", "name": n, "parameters": _CLOSED, "strict": strict}
            for n, strict in (("a", True), ("b", False))]}
    question = [{"role": "user", "content": "hi"}]
    r = httpx.post(f"{mproxy.url}/c/{cid}{path}", headers={"x-api-key": key}, timeout=30,
                   json={"model": model, **body, ("input" if client_api == "responses" else "messages"): question})
    assert r.status_code == 200, r.text
    if model == "claude-x":
        assert [t.get("strict") for t in claude.last.body["tools"]] == [None] * len(body["tools"])
    elif model == "gpt-x":
        assert [t["function"].get("strict") for t in upstream.last.body["tools"]] == [True, False, None]
    else:
        assert [t["strict"] for t in upstream.responses_requests[-1].body["tools"]] == [True, False, False]


def test_chat_fields_without_an_equivalent_are_refused(mproxy: Proxy, key: str, cid: str) -> None:
    oc = mproxy.openai(key, conversation=cid)
    with pytest.raises(Exception) as exc:
        oc.chat.completions.create(model="claude-x", n=2, messages=[{"role": "user", "content": "x"}])
    assert getattr(exc.value, "status_code", None) == 400


def test_structured_output_reaches_anthropic_as_output_config_format(mproxy: Proxy, claude: FakeAnthropic, key: str,
                                                                     cid: str) -> None:
    """A chat client's ``response_format`` json_schema (the SDK's ``parse``, LangChain's
    ``with_structured_output``, instructor's JSON-schema mode) and a Responses client's
    ``text.format`` reach a Claude model as Anthropic's structured outputs, ``output_config.format``,
    the schema as Anthropic's grammar takes it (objects closed, what it does not enforce said in the
    description); they were refused 400. JSON without a schema (``json_object``) has no
    equivalent: still refused, nothing sent."""
    import pydantic

    class Weather(pydantic.BaseModel):
        city: str
        celsius: int

    oc = mproxy.openai(key, conversation=cid)
    claude.enqueue(AReply(content=[{"type": "text", "text": '{"city": "Paris", "celsius": 21}'}]))
    parsed = oc.chat.completions.parse(model="claude-x", messages=[{"role": "user", "content": "Paris?"}],
                                       response_format=Weather)
    assert parsed.choices[0].message.parsed == Weather(city="Paris", celsius=21)
    sent = claude.last.body
    assert "response_format" not in sent
    assert sent["output_config"]["format"] == {"type": "json_schema", "schema": {
        "title": "Weather", "type": "object", "additionalProperties": False, "required": ["city", "celsius"],
        "properties": {"city": {"title": "City", "type": "string"}, "celsius": {"title": "Celsius", "type": "integer"}}}}

    loose = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object", "properties": {
        "n": {"type": "integer", "minimum": 1, "description": "How many."},
        "name": {"type": ["string", "null"]},
        "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]+$"}, "minItems": 2},
        "at": {"oneOf": [{"type": "string", "format": "date"}, {"type": "string", "format": "phone"}]}}}
    r = httpx.post(f"{mproxy.url}/c/{cid}/v1/responses", headers={"Authorization": f"Bearer {key}"}, timeout=30,
                   json={"model": "claude-x", "input": "count", "text": {"format": {
                       "type": "json_schema", "name": "count", "schema": loose}}})
    assert r.status_code == 200, r.text
    assert claude.last.body["output_config"]["format"]["schema"] == {
        "type": "object", "additionalProperties": False, "properties": {
            "n": {"type": "integer", "description": "How many.\n\n{minimum: 1}"},
            "name": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "tags": {"type": "array", "items": {"type": "string", "description": "{pattern: ^[a-z]+$}"},
                     "description": "{minItems: 2}"},
            "at": {"anyOf": [{"type": "string", "format": "date"},
                             {"type": "string", "description": "{format: phone}"}]}}}

    sent_before = len(claude.requests)
    with pytest.raises(openai.BadRequestError) as refused:
        oc.chat.completions.create(model="claude-x", messages=[{"role": "user", "content": "x"}],
                                   response_format={"type": "json_object"})
    assert refused.value.body["param"] == "response_format" and "'json_object'" in refused.value.body["message"]
    assert len(claude.requests) == sent_before


def test_a_schema_for_anthropic_keeps_its_definitions_and_each_types_keywords() -> None:
    """What ``output_config.format`` gets of schemas pydantic does not write: draft 7's
    ``definitions`` (zod-to-json-schema's) kept for their ``$ref``s, a list of types split with each
    type's own keywords (the ``null`` of an optional object carries no properties), an object whose
    shapes are its variants closed in each of them, not beside them (an empty closed object there
    could hold none); a ``json_schema`` format without a schema is refused saying so."""
    from proxy.dialects.messages.schema import output_schema
    from proxy.dialects.messages.translate import check_fields

    ref = {"type": "object", "properties": {"a": {"$ref": "#/definitions/A"}},
           "definitions": {"A": {"type": "object", "properties": {"x": {"type": "number", "maximum": 3}}}}}
    assert output_schema(ref) == {
        "type": "object", "properties": {"a": {"$ref": "#/definitions/A"}}, "additionalProperties": False,
        "definitions": {"A": {"type": "object", "additionalProperties": False,
                              "properties": {"x": {"type": "number", "description": "{maximum: 3}"}}}}}
    optional = {"type": ["object", "null"], "properties": {"a": {"type": "string"}}, "required": ["a"]}
    assert output_schema(optional) == {"anyOf": [
        {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": False, "required": ["a"]},
        {"type": "null"}]}
    assert output_schema({"type": ["string", "integer"], "minLength": 1, "minimum": 0}) == {"anyOf": [
        {"type": "string", "description": "{minLength: 1}"}, {"type": "integer", "description": "{minimum: 0}"}]}
    either = {"type": "object", "anyOf": [{"properties": {"a": {"type": "string"}}}, {"properties": {"b": {"type": "integer"}}}]}
    assert output_schema(either) == {"type": "object", "anyOf": [
        {"properties": {"a": {"type": "string"}}, "additionalProperties": False},
        {"properties": {"b": {"type": "integer"}}, "additionalProperties": False}]}
    with pytest.raises(InvalidRequest) as refused:
        check_fields({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}})
    assert str(refused.value).startswith("'response_format' of type 'json_schema' without a schema has no equivalent")


_TWO = [{"type": "function", "function": {"name": "a", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "b", "parameters": {"type": "object"}}}]


@pytest.mark.parametrize("client", ["chat", "responses"])
def test_claudes_call_without_input_streams_as_empty_json_arguments(mproxy: Proxy, claude: FakeAnthropic, key: str,
                                                                    cid: str, client: str) -> None:
    """A call of a tool without parameters: Anthropic streams its input as one empty piece. A chat
    (or Responses) client's stream said arguments ``""`` -- not JSON, which OpenAI never sends
    (``"{}"``), and not what the stored answer (a chat client's) or a whole answer says."""
    claude.enqueue(AReply(content=[{"type": "tool_use", "id": "toolu_now", "name": "now", "input": {}}],
                          stop_reason="tool_use", empty_input_delta=True))
    c = mproxy.openai(key, conversation=cid)
    if client == "chat":
        tools = [{"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}]
        arguments = "".join(tc.function.arguments or "" for chunk in c.chat.completions.create(
            model="claude-x", messages=[{"role": "user", "content": "time?"}], tools=tools, stream=True)
            for choice in chunk.choices for tc in choice.delta.tool_calls or ())
    else:
        tools = [{"type": "function", "name": "now", "parameters": {"type": "object", "properties": {}}}]
        with c.responses.stream(model="claude-x", input="time?", tools=tools) as stream:
            final = stream.get_final_response()
        arguments = next(o.arguments for o in final.output if o.type == "function_call")
    assert arguments == "{}"
    head = httpx.get(f"{mproxy.url}/admin/conversations/{cid}", headers={"x-api-key": key}).json()["head_node_id"]
    stored = httpx.get(f"{mproxy.url}/admin/nodes/{head}", headers={"x-api-key": key}).json()["received"]
    assert "{}" in json.dumps([c.get("function", {}).get("arguments") for m in stored for c in m.get("tool_calls") or ()]
                              + [i.get("arguments") for i in stored if i.get("type") == "function_call"])


def test_a_chat_clients_allowed_tools_reach_anthropic_as_the_tools_it_names(mproxy: Proxy, claude: FakeAnthropic,
                                                                              key: str, cid: str) -> None:
    """``tool_choice: allowed_tools`` offers Anthropic only the tools it names, its mode the
    choice (``required`` is ``any``) -- as over a chat upstream for a Responses client. It went as
    every tool and ``auto``: the model could call the tool the client excluded, and need call none."""
    oc = mproxy.openai(key, conversation=cid)
    only_a = [{"type": "function", "function": {"name": "a"}}]
    oc.chat.completions.create(model="claude-x", messages=[{"role": "user", "content": "hi"}], tools=_TWO,
                               tool_choice={"type": "allowed_tools", "allowed_tools": {"mode": "required",
                                                                                       "tools": only_a}})
    assert [t["name"] for t in claude.last.body["tools"]] == ["a"]
    assert claude.last.body["tool_choice"] == {"type": "any"}
    oc.chat.completions.create(model="claude-x", messages=[{"role": "user", "content": "again"}], tools=_TWO,
                               parallel_tool_calls=False,
                               tool_choice={"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": only_a}})
    assert [t["name"] for t in claude.last.body["tools"]] == ["a"]
    assert claude.last.body["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True}


def test_a_chat_clients_custom_tool_over_anthropic_is_dropped_and_said(mproxy: Proxy, claude: FakeAnthropic,
                                                                       key: str, cid: str) -> None:
    """A custom tool (free-form input) is not offered to Anthropic, whose answer could only call a
    function: it is dropped and named in X-Branchpoint-Dropped-Tools, as a hosted tool a chat
    upstream cannot run, and forcing it lets the model choose. It vanished unsaid; with
    ``unsupported_tools = "refuse"`` it is refused before anything is stored."""
    oc = mproxy.openai(key, conversation=cid)
    tools = [{"type": "custom", "custom": {"name": "apply_patch", "description": "patch"}}, _TWO[0]]
    raw = oc.chat.completions.with_raw_response.create(
        model="claude-x", messages=[{"role": "user", "content": "patch it"}], tools=tools,
        tool_choice={"type": "custom", "custom": {"name": "apply_patch"}})
    assert raw.headers["x-branchpoint-dropped-tools"] == "custom"
    assert [t["name"] for t in claude.last.body["tools"]] == ["a"]
    assert claude.last.body["tool_choice"] == {"type": "auto"}
    way = crossing("chat", "anthropic")
    with pytest.raises(InvalidRequest) as refused:
        way.prepare({"tools": tools}, unsupported_tools="refuse")
    assert refused.value.param == "tools" and "custom" in str(refused.value)
    assert way.prepare({"tools": _TWO}, unsupported_tools="refuse") == []


def test_openai_only_fields_are_not_sent_to_anthropic(mproxy: Proxy, claude: FakeAnthropic, key: str,
                                                      cid: str) -> None:
    """OpenAI's own fields with no meaning for Anthropic (its prompt cache's key and options,
    safety_identifier, its service tiers) are not sent: Anthropic refuses a field it does not
    know (400 "Extra inputs are not permitted"), so an SDK call setting one failed on every Claude
    model -- a Responses client's alike. A field the proxy does not know still goes as it came;
    ``moderation``, which would change the answer, is refused."""
    oc = mproxy.openai(key, conversation=cid)
    oc.chat.completions.create(model="claude-x", messages=[{"role": "user", "content": "hi"}], prompt_cache_key="k1",
                               safety_identifier="u1", service_tier="default", prompt_cache_retention="24h",
                               extra_body={"prompt_cache_options": {"mode": "implicit"}, "future_field": 1})
    sent = claude.last.body
    assert sent["future_field"] == 1
    assert not {"prompt_cache_key", "safety_identifier", "service_tier", "prompt_cache_retention",
                "prompt_cache_options"} & set(sent), sent
    oc.chat.completions.create(model="claude-x", messages=[{"role": "user", "content": "hi"}], service_tier="auto")
    assert claude.last.body["service_tier"] == "auto"  # (Anthropic's word too)
    oc.responses.create(model="claude-x", input="hi", prompt_cache_key="k1", safety_identifier="u1", service_tier="flex")
    assert not {"prompt_cache_key", "safety_identifier", "service_tier"} & set(claude.last.body), claude.last.body
    before = len(claude.calls)
    with pytest.raises(openai.BadRequestError) as refused:
        oc.chat.completions.create(model="claude-x", messages=[{"role": "user", "content": "hi"}],
                                   extra_body={"moderation": {"model": "omni-moderation-latest"}})
    assert refused.value.body["param"] == "moderation" and len(claude.calls) == before


def test_audio_reaches_anthropic_as_a_line_saying_so(mproxy: Proxy, claude: FakeAnthropic, key: str, cid: str) -> None:
    """A chat client's audio, which Anthropic cannot read, reaches it as a line saying what it was
    (as a file it cannot read): the question was answered without it, unsaid, and an audio-only
    message went as a user message with no content."""
    oc = mproxy.openai(key, conversation=cid)
    audio = {"type": "input_audio", "input_audio": {"data": "UklGRiQA", "format": "wav"}}
    oc.chat.completions.create(model="claude-x", messages=[{"role": "user", "content": [
        {"type": "text", "text": "What does the speaker ask for?"}, audio]}])
    assert claude.last.body["messages"][-1]["content"] == [
        {"type": "text", "text": "What does the speaker ask for?"},
        {"type": "text", "text": "[audio (wav): not readable by this model]"}]
    oc.chat.completions.create(model="claude-x", messages=[{"role": "user", "content": [audio]}])
    assert claude.last.body["messages"][-1] == {
        "role": "user", "content": [{"type": "text", "text": "[audio (wav): not readable by this model]"}]}


def test_a_part_anthropic_has_no_block_for_is_said_not_dropped(mproxy: Proxy, claude: FakeAnthropic, key: str,
                                                               cid: str) -> None:
    """A chat part of a kind Anthropic has no block for (``video_url`` ...) reaches it as a line
    saying so, as audio does, and an assistant's ``refusal`` part as its text -- both vanished
    unsaid: the question went without its video, and a refusal-only answer was left out."""
    oc = mproxy.openai(key, conversation=cid)
    oc.chat.completions.create(model="claude-x", messages=[
        {"role": "user", "content": [{"type": "text", "text": "What happens?"},
                                     {"type": "video_url", "video_url": {"url": "https://example.com/v.mp4"}}]},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "I cannot watch videos."}]},
        {"role": "user", "content": "Then guess."}])
    assert claude.last.body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "What happens?"},
                                     {"type": "text", "text": "[video_url: not readable by this model]"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "I cannot watch videos."}]},
        {"role": "user", "content": [{"type": "text", "text": "Then guess."}]}]


def test_an_image_url_given_as_a_string_reaches_anthropic(mproxy: Proxy, upstream: FakeUpstream, claude: FakeAnthropic,
                                                           key: str, cid: str) -> None:
    """A chat image part whose ``image_url`` is the URL itself (a string, which OpenAI-compatible
    servers and the proxy's own Responses translation take) reaches an Anthropic model as an image
    by URL -- it made a 500, and once a chat model's call had stored it, so did every later call
    of the conversation to an Anthropic model, from either API. One without a URL (a list, a
    number) reaches it as a line saying so."""
    oc = mproxy.openai(key, conversation=cid)
    question = {"type": "text", "text": "What is it?"}
    oc.chat.completions.create(model="gpt-x", messages=[{"role": "user", "content": [
        question, {"type": "image_url", "image_url": "https://example.com/a.png"}]}])
    by_url = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
    oc.chat.completions.create(model="claude-x", messages=[{"role": "user", "content": "and now?"}])
    assert claude.last.body["messages"][0]["content"] == [question, by_url]
    client(mproxy, key, f"/c/{cid}").messages.create(model="claude-x", max_tokens=5, messages=[
        {"role": "user", "content": "again"}])
    assert claude.last.body["messages"][0]["content"] == [question, by_url]
    oc.chat.completions.create(model="claude-x", messages=[{"role": "user", "content": [
        question, {"type": "image_url", "image_url": ["x"]}, {"type": "image_url", "image_url": {"url": 5}}]}])
    line = {"type": "text", "text": "[image without a URL: not readable by this model]"}
    assert claude.last.body["messages"][-1]["content"] == [question, line, line]


# -- full history: clients that resend the whole session ----------------------------------------------


def test_auto_full_history_session(mproxy: Proxy, claude: FakeAnthropic) -> None:
    """Claude Code's shape: the whole session each call, under /auto; a tool round whose results
    and the next text share one user message -- one conversation, each node only what is new."""
    key = new_key()
    c = client(mproxy, key, "/auto")
    system = [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}]
    tools = [{"name": "Bash", "input_schema": {"type": "object"}}]
    history: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": "run echo",
                                                                   "cache_control": {"type": "ephemeral"}}]}]
    claude.enqueue(AReply(content=[{"type": "tool_use", "id": "toolu_a", "name": "Bash", "input": {"command": "echo hi"}}],
                          stop_reason="tool_use"))
    r1 = c.messages.with_raw_response.create(model="claude-x", max_tokens=100, system=system, tools=tools,
                                             messages=history)
    cid = r1.headers["x-conversation-id"]
    history = [{"role": "user", "content": [{"type": "text", "text": "run echo"}]},
               {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r1.parse().content]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_a", "content": "hi\n"},
                                            {"type": "text", "text": "and now?", "cache_control": {"type": "ephemeral"}}]}]
    r2 = c.messages.with_raw_response.create(model="claude-x", max_tokens=100, system=system, tools=tools,
                                             messages=history)
    assert r2.headers["x-conversation-id"] == cid
    assert r2.headers["x-context-mode"] == "full" and r2.headers["x-context-matched"] == "2"
    assert claude.last.body["messages"] == history  # exactly the client's messages, markers where it put them
    assert claude.last.body["system"] == system
    n2 = node(mproxy, key, r2.headers["x-node-id"])
    assert n2["parent_id"] == r1.headers["x-node-id"]
    assert [f["content"] for f in n2["sent"]] == [history[2]["content"][:1], history[2]["content"][1:]]
    assert replay_verified(mproxy, key, r2.headers["x-node-id"]) == "true"

    # the same session with its tool result and text restored (a resumed session): matched, not stored again
    r3 = c.messages.with_raw_response.create(model="claude-x", max_tokens=100, system=system, tools=tools,
                                             messages=[*history, {"role": "assistant", "content": [
                                                 {"type": "text", "text": "echo: and now?"}]},
                                                 {"role": "user", "content": "bye"}])
    assert r3.headers["x-conversation-id"] == cid and r3.headers["x-context-matched"] == "5"
    n3 = node(mproxy, key, r3.headers["x-node-id"])
    assert n3["parent_id"] == r2.headers["x-node-id"] and n3["sent"] == [{"role": "user", "content": "bye"}]


def test_x_api_key_and_bearer_are_one_tenant(mproxy: Proxy, claude: FakeAnthropic, cid: str) -> None:
    key = new_key()
    r = client(mproxy, key, f"/c/{cid}").messages.with_raw_response.create(
        model="claude-x", max_tokens=10, messages=[{"role": "user", "content": "mine"}])
    seen = httpx.get(f"{mproxy.url}/admin/nodes/{r.headers['x-node-id']}",
                     headers={"Authorization": f"Bearer {key}"}, timeout=30)
    assert seen.status_code == 200
    other = httpx.get(f"{mproxy.url}/admin/nodes/{r.headers['x-node-id']}", headers={"x-api-key": new_key()}, timeout=30)
    assert other.status_code == 404


# -- compaction -------------------------------------------------------------------------------------


def test_compaction_counts_anthropics_cached_tokens(fresh_database_url: str, upstream_url: str,
                                                    claude_server: tuple[FakeAnthropic, ServerThread]) -> None:
    """Anthropic's input_tokens leave out the cached prompt: a session served from the cache still
    measures its whole context, so it is compacted at the soft threshold -- and the summary is made
    by the Anthropic upstream itself, then starts the next request."""
    from tests.conftest import Db, wait_for

    claude = claude_server[0]
    claude.reset()
    settings = make_settings(fresh_database_url, upstream_url, upstreams=[
        {"name": "anthropic", "base_url": claude_server[1].url + "/v1", "models": ["*"], "api": "anthropic"}],
        models={"tiny*": {"context_window": 4000, "max_output_tokens": 1000}}, compaction={"keep_recent": 4})
    key, cid = new_key(), f"cc-{uuid.uuid4().hex[:8]}"
    with serve_proxy(settings) as p:
        c = client(p, key, f"/c/{cid}")
        for i in range(7):  # the 7th reports 5 + 2100 cached + 20 > the soft threshold (2100)
            claude.enqueue(AReply(content=[{"type": "text", "text": f"answer {i}"}],
                                  usage={"input_tokens": 5, "cache_read_input_tokens": 300 + 300 * i,
                                         "output_tokens": 20}))
            if i == 6:  # the summary's answer, queued before the turn that starts the background job
                claude.enqueue(AReply(content=[{"type": "text", "text": "Facts so far: seven questions were asked."}]))
            c.messages.create(model="tiny-claude", max_tokens=50, messages=[{"role": "user", "content": f"question {i}"}])
        db = Db(fresh_database_url)
        wait_for(lambda: db.fetch("SELECT id FROM nodes WHERE conversation_id = $1 AND kind = 'compaction'", cid),
                 what="the background compaction")
        summariser = claude.calls[-1].body
        assert "question 0" in json.dumps(summariser) and summariser["max_tokens"] > 0
        c.messages.create(model="tiny-claude", max_tokens=50, messages=[{"role": "user", "content": "what now?"}])
        sent = claude.last.body["messages"]
        assert "Facts so far: seven questions were asked." in json.dumps(sent[0])
        assert "question 0" not in json.dumps(sent) and sent[-1] == {"role": "user", "content": "what now?"}


def test_refusals_before_the_call_have_anthropics_shape(database_url: str, upstream_url: str) -> None:
    """A body that can never fit under max_bytes_in_flight (the middleware) and one over
    max_body_bytes (the app): both answered 413 in Anthropic's shape on /v1/messages."""
    settings = make_settings(database_url, upstream_url, server={"max_body_bytes": 4096, "max_bytes_in_flight": 2048})
    with serve_proxy(settings) as p:
        for size in (3000, 5000):
            big = {"model": "gpt-x", "max_tokens": 5, "messages": [{"role": "user", "content": "x" * size}]}
            r = httpx.post(f"{p.url}/c/conv-big/v1/messages", json=big, headers={"x-api-key": new_key()}, timeout=30)
            assert r.status_code == 413, r.text
            assert r.json()["type"] == "error" and r.json()["error"]["type"] == "request_too_large"
        chat = httpx.post(f"{p.url}/c/conv-big/v1/chat/completions", json=big, headers={"x-api-key": new_key()}, timeout=30)
        assert chat.status_code == 413 and "type" not in chat.json()  # (chat clients: OpenAI's shape)


# -- what a hostile review found (each fails without its fix) -----------------------------------------


def _chat_chunk(delta: dict[str, Any], finish: str | None = None) -> str:
    return "data: " + json.dumps({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
                                  "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}) + "\n\n"


@pytest.mark.parametrize("model", ["claude-x", "gpt-x"])
def test_malformed_blocks_are_refused_and_the_conversation_goes_on(mproxy: Proxy, claude: FakeAnthropic, model: str,
                                                                   key: str, cid: str) -> None:
    c = client(mproxy, key, f"/c/{cid}")
    c.messages.create(model=model, max_tokens=5, messages=[{"role": "user", "content": "first"}])
    bad = [
        [{"role": "assistant", "content": [{"type": "tool_use", "id": ["t1"], "name": "x", "input": {}}]},
         {"role": "user", "content": "b"}],
        [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": {"id": 1}, "content": "r"}]}],
        [{"role": "user", "content": [{"type": ["text"], "text": "x"}]}],
        [{"role": "user", "content": [{"type": "text", "text": 5}]}],
        [{"role": "user", "content": "c", "_bp_cont": True}],
    ]
    for messages in bad:
        r = httpx.post(f"{mproxy.url}/c/{cid}/v1/messages", headers={"x-api-key": key}, timeout=30,
                       json={"model": model, "max_tokens": 5, "messages": messages})
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", r.text
    for field in ("_bp_cache_control", "_bp_system_at"):  # the proxy's own keys: never a client's
        r = httpx.post(f"{mproxy.url}/c/{cid}/v1/messages", headers={"x-api-key": key}, timeout=30,
                       json={"model": model, "max_tokens": 5, field: [[0, 0, 0]], "messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 400, r.text
        chat = httpx.post(f"{mproxy.url}/c/{cid}/v1/chat/completions", headers={"x-api-key": key}, timeout=30,
                          json={"model": model, field: [5], "messages": [{"role": "user", "content": "x"}]})
        assert chat.status_code == 400, chat.text
    after = c.messages.create(model=model, max_tokens=5, messages=[{"role": "user", "content": "next"}])
    assert after.content[0].text == "echo: next"


def test_an_unhashable_chat_tool_call_id_is_no_500(mproxy: Proxy, key: str) -> None:
    r = httpx.post(f"{mproxy.url}/auto/v1/chat/completions", headers={"x-api-key": key}, timeout=30, json={
        "model": "gpt-x", "messages": [{"role": "user", "content": "q"},
                                       {"role": "assistant", "content": None, "tool_calls": [
                                           {"id": ["x"], "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                                       {"role": "tool", "tool_call_id": ["x"], "content": "r"},
                                       {"role": [1], "content": "odd"}]})
    assert r.status_code == 400  # (the role list: refused; before, the set of ids raised first)


@pytest.mark.parametrize("model", ["claude-x", "gpt-x"])
def test_an_echoed_key_is_masked_in_anthropic_streams(mproxy: Proxy, claude: FakeAnthropic, model: str, key: str,
                                                      cid: str) -> None:
    """The fake echoes the question in 4-character text deltas: the client's key, cut across them,
    reaches neither the client nor the stored node (Messages clients, and chat clients over Anthropic)."""
    if model == "claude-x":
        with client(mproxy, key, f"/c/{cid}").messages.stream(
                model=model, max_tokens=50, messages=[{"role": "user", "content": f"my key is {key}"}]) as s:
            seen = "".join(s.text_stream)
            node_id = s.response.headers["x-node-id"]
    else:
        raw = mproxy.openai(key, conversation=cid).chat.completions.with_raw_response.create(
            model="claude-x", stream=True, messages=[{"role": "user", "content": f"my key is {key}"}])
        node_id = raw.headers["x-node-id"]
        seen = "".join(ch.choices[0].delta.content or "" for ch in raw.parse() if ch.choices)
    assert key not in seen and "[redacted]" in seen and seen.startswith("echo: my key is ")
    assert key not in json.dumps(node(mproxy, key, node_id)["received"])


def test_interleaved_chat_tool_arguments_reach_the_client_whole(mproxy: Proxy, upstream: FakeUpstream, key: str,
                                                                 cid: str) -> None:
    body = (_chat_chunk({"role": "assistant"})
            + _chat_chunk({"tool_calls": [{"index": 0, "id": "c0", "type": "function", "function": {"name": "A", "arguments": '{"x":'}}]})
            + _chat_chunk({"tool_calls": [{"index": 1, "id": "c1", "type": "function", "function": {"name": "B", "arguments": '{"y":2}'}}]})
            + _chat_chunk({"content": "between"})
            + _chat_chunk({"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]})
            + _chat_chunk({}, "tool_calls") + "data: [DONE]\n\n")
    upstream.enqueue(Reply(kind="raw", body=body.encode(), content_type="text/event-stream"))
    tools = [{"name": "A", "input_schema": {"type": "object"}}, {"name": "B", "input_schema": {"type": "object"}}]
    with client(mproxy, key, f"/c/{cid}").messages.stream(model="gpt-x", max_tokens=9, tools=tools,
                                                          messages=[{"role": "user", "content": "go"}]) as s:
        final = s.get_final_message()
        node_id = s.response.headers["x-node-id"]
    seen = [(b.type, b.input if b.type == "tool_use" else b.text) for b in final.content]
    stored = [(b["type"], b.get("input", b.get("text"))) for b in node(mproxy, key, node_id)["received"][0]["content"]]
    assert seen == stored == [("text", "between"), ("tool_use", {"x": 1}), ("tool_use", {"y": 2})]


@pytest.mark.parametrize("arguments, expected", [
    ("not json {", {"arguments": "not json {"}), ("[1,2]", {"value": [1, 2]}), ('"str"', {"value": "str"}),
    ('{"ok": true}', {"ok": True}),
])
@pytest.mark.parametrize("stream", [False, True])
def test_a_chat_models_tool_arguments_that_are_no_object_reach_the_client_as_stored(
        mproxy: Proxy, upstream: FakeUpstream, key: str, cid: str, arguments: str, expected: Any, stream: bool) -> None:
    """A small model's tool arguments that are not a JSON object: the tool_use input the client
    gets -- streamed or whole -- is the object the answer is stored with, never text an SDK
    cannot parse into an input."""
    body = (_chat_chunk({"role": "assistant"})
            + _chat_chunk({"tool_calls": [{"index": 0, "id": "c0", "type": "function",
                                           "function": {"name": "A", "arguments": arguments}}]})
            + _chat_chunk({}, "tool_calls") + "data: [DONE]\n\n")
    if stream:
        upstream.enqueue(Reply(kind="raw", body=body.encode(), content_type="text/event-stream"))
    else:
        upstream.enqueue(Reply(content=None, tool_calls=[{"id": "c0", "type": "function",
                                                          "function": {"name": "A", "arguments": arguments}}]))
    tools = [{"name": "A", "input_schema": {"type": "object"}}]
    c = client(mproxy, key, f"/c/{cid}")
    if stream:
        with c.messages.stream(model="gpt-x", max_tokens=9, tools=tools, messages=[{"role": "user", "content": "go"}]) as s:
            final = s.get_final_message()
            node_id = s.response.headers["x-node-id"]
    else:
        raw = c.messages.with_raw_response.create(model="gpt-x", max_tokens=9, tools=tools,
                                                  messages=[{"role": "user", "content": "go"}])
        final, node_id = raw.parse(), raw.headers["x-node-id"]
    stored = node(mproxy, key, node_id)["received"][0]["content"]
    assert [b.input for b in final.content if b.type == "tool_use"] == [b["input"] for b in stored] == [expected]


def test_the_tree_previews_a_messages_answer_by_its_text_not_its_thinking(mproxy: Proxy, claude: FakeAnthropic,
                                                                         key: str, cid: str) -> None:
    claude.enqueue(AReply(content=[{"type": "thinking", "thinking": "hmm", "signature": "S"},
                                   {"type": "text", "text": "said after thinking"}]))
    client(mproxy, key, f"/c/{cid}").messages.create(model="claude-x", max_tokens=9,
                                                     messages=[{"role": "user", "content": "q"}])
    tree = mproxy.http(key).get(f"/admin/conversations/{cid}/tree").json()["data"]
    assert [n["preview"] for n in tree] == ["said after thinking"]


def test_a_chat_clients_signed_thinking_goes_back_to_anthropic(mproxy: Proxy, claude: FakeAnthropic, key: str,
                                                               cid: str) -> None:
    oc = mproxy.openai(key, conversation=cid)
    claude.enqueue(AReply(content=[{"type": "thinking", "thinking": "hmm", "signature": "SIGX"},
                                   {"type": "tool_use", "id": "toolu_t", "name": "f", "input": {}}], stop_reason="tool_use"))
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    oc.chat.completions.create(model="claude-x", tools=tools, messages=[{"role": "user", "content": "think"}])
    oc.chat.completions.create(model="claude-x", tools=tools,
                               messages=[{"role": "tool", "tool_call_id": "toolu_t", "content": "done"}])
    assistant = claude.last.body["messages"][1]
    assert assistant["content"][0] == {"type": "thinking", "thinking": "hmm", "signature": "SIGX"}
    assert upstream_neutral(assistant)


_MCP_ANSWER = [
    {"type": "text", "text": "Let me look."},
    {"type": "mcp_tool_use", "id": "mcptoolu_1", "name": "lookup", "server_name": "crm", "input": {"q": "ACME"}},
    {"type": "mcp_tool_result", "tool_use_id": "mcptoolu_1", "is_error": False,
     "content": [{"type": "text", "text": "ACME: owner Jane, tier Gold"}]},
    {"type": "text", "text": "ACME is a Gold account."}]
_MCP_LINES = ('Let me look.\n[mcp crm.lookup "ACME"]\n[mcp crm.lookup result: ACME: owner Jane, tier Gold]\n'
              "ACME is a Gold account.")


@pytest.mark.parametrize("stream", [False, True])
def test_a_chat_clients_answer_with_claudes_server_tools_goes_back_whole(mproxy: Proxy, claude: FakeAnthropic,
                                                                          upstream: FakeUpstream, key: str, cid: str,
                                                                          stream: bool) -> None:
    """A chat client naming Anthropic's MCP connector (a field it forwards as it came): Claude's
    MCP call and result are part of its answer. The chat client reads them as lines in the content
    (streamed as whole), and Claude's next call gets its blocks back whole, in their place among
    its text, as signed thinking is kept -- only the text went back, the lookup's result lost to
    Claude. Another model gets the lines. The client's own answer carries no blocks but signed
    thinking (the whole answer gave it every block, text and fetched pages among them)."""
    oc = mproxy.openai(key, conversation=cid)
    mcp = {"extra_body": {"mcp_servers": [{"type": "url", "url": "https://mcp.example/sse", "name": "crm"}]}}
    claude.enqueue(AReply(content=_MCP_ANSWER))
    if stream:
        chunks = list(oc.chat.completions.create(model="claude-x", messages=[{"role": "user", "content": "ACME?"}],
                                                 stream=True, **mcp))
        said = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    else:
        message = oc.chat.completions.create(model="claude-x", messages=[{"role": "user", "content": "ACME?"}],
                                             **mcp).choices[0].message
        said = message.content
        # (the blocks kept for Claude are the stored message's, not the client's to read as reasoning)
        assert "thinking_blocks" not in (message.model_extra or {})
    assert said == _MCP_LINES
    oc.chat.completions.create(model="claude-x", messages=[{"role": "user", "content": "who owns it?"}], **mcp)
    assert claude.last.body["messages"][1] == {"role": "assistant", "content": _MCP_ANSWER}
    oc.chat.completions.create(model="gpt-x", messages=[{"role": "user", "content": "and you?"}])
    assert upstream.last.body["messages"][1] == {"role": "assistant", "content": _MCP_LINES}


def upstream_neutral(message: dict[str, Any]) -> bool:
    return not any(k.startswith("_bp_") for k in message)


def test_a_leading_system_messages_marker_is_kept(mproxy: Proxy, claude: FakeAnthropic, key: str, cid: str) -> None:
    c = client(mproxy, key, f"/c/{cid}")
    c.messages.create(model="claude-x", max_tokens=5, system="Field.", messages=[
        {"role": "system", "content": [{"type": "text", "text": "SYS", "cache_control": {"type": "ephemeral"}}]},
        {"role": "user", "content": "hi"}])
    assert claude.last.body["system"] == [{"type": "text", "text": "Field."},
                                          {"type": "text", "text": "SYS", "cache_control": {"type": "ephemeral"}}]


_PDF = "JVBERi0xLjQK"  # (the first bytes of a PDF, base64)


def test_documents_reach_a_chat_upstream_as_file_parts_or_text(mproxy: Proxy, upstream: FakeUpstream, key: str,
                                                              cid: str) -> None:
    """A PDF an Anthropic client attaches reaches a chat model as chat's file part, which OpenAI's
    models read (and a Responses model as an input_file); a plain-text document as its text; a
    document by URL, which chat cannot fetch, and a PDF in a tool result (a chat tool message
    takes text only) as a line naming it."""
    pdf = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": _PDF},
           "title": "plan.pdf"}
    content = [
        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "The plan: ship it."},
         "title": "plan.txt"},
        pdf,
        {"type": "document", "source": {"type": "url", "url": "https://example.com/spec.pdf"}},
        {"type": "text", "text": "summarise"}]
    c = client(mproxy, key, f"/c/{cid}")
    c.messages.create(model="gpt-x", max_tokens=5, messages=[{"role": "user", "content": content}])
    parts = upstream.last.messages[-1]["content"]
    assert [p["type"] for p in parts] == ["text", "file", "text", "text"]
    assert "The plan: ship it." in parts[0]["text"]
    assert parts[1]["file"] == {"filename": "plan.pdf", "file_data": f"data:application/pdf;base64,{_PDF}"}
    assert "not readable" in parts[2]["text"] and "application/pdf" not in parts[2]["text"]

    c.messages.create(model="native-x", max_tokens=16, messages=[{"role": "user", "content": [pdf]}])
    assert upstream.responses_requests[-1].body["input"][-1]["content"] == [
        {"type": "input_file", "filename": "plan.pdf", "file_data": f"data:application/pdf;base64,{_PDF}"}]

    upstream.enqueue(Reply(tool_calls=[{"id": "call_1", "type": "function",
                                        "function": {"name": "Read", "arguments": "{}"}}]))
    use = c.messages.create(model="gpt-x", max_tokens=5, tools=[{"name": "Read", "input_schema": {"type": "object"}}],
                            messages=[{"role": "user", "content": "read it"}]).content[-1]
    c.messages.create(model="gpt-x", max_tokens=5, tools=[{"name": "Read", "input_schema": {"type": "object"}}],
                      messages=[{"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                              "content": [pdf]}]}])
    result = upstream.last.messages[-1]
    assert result["role"] == "tool" and "plan.pdf" in json.dumps(result["content"]) and _PDF not in json.dumps(result)


def test_an_image_by_anthropic_file_id_reaches_a_chat_upstream_as_a_line(mproxy: Proxy, upstream: FakeUpstream,
                                                                         key: str, cid: str) -> None:
    """An image attached by Anthropic file id is nothing a chat model can fetch: it reaches a chat
    upstream as a line naming it, as such a document does -- before, its id went as an image_url,
    which OpenAI-compatible servers refuse. Images by bytes or URL go as image parts."""
    client(mproxy, key, f"/c/{cid}").messages.create(model="gpt-x", max_tokens=5, messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "file", "file_id": "file_011CNha8iCJcU1wXNR6q4V8w"}},
        {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0K"}},
        {"type": "document", "source": {"type": "file", "file_id": "file_022"}},
        {"type": "text", "text": "what are they"}]}])
    assert upstream.last.messages[-1]["content"] == [
        {"type": "text", "text": "[image (file file_011CNha8iCJcU1wXNR6q4V8w): not readable by this model]"},
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0K"}},
        {"type": "text", "text": "[document (file file_022): not readable by this model]"},
        {"type": "text", "text": "what are they"}]


def test_files_reach_an_anthropic_upstream_as_documents(mproxy: Proxy, claude: FakeAnthropic, key: str,
                                                        cid: str) -> None:
    """The other way: an OpenAI client's file parts reach an Anthropic model as documents -- a PDF's
    bytes as a PDF, a text file as its text, a file by URL (Responses' input_file) as a document
    by URL; another provider's file id, which Anthropic cannot fetch, as a line naming it."""
    oc = mproxy.openai(key, conversation=cid)
    oc.chat.completions.create(model="claude-x", max_tokens=5, messages=[{"role": "user", "content": [
        {"type": "text", "text": "compare"},
        {"type": "file", "file": {"filename": "a.pdf", "file_data": f"data:application/pdf;base64,{_PDF}"}},
        {"type": "file", "file": {"filename": "b.txt", "file_data": "data:text/plain;base64,aGVsbG8="}},
        {"type": "file", "file": {"file_id": "file-abc123"}}]}])
    assert claude.last.body["messages"][-1]["content"] == [
        {"type": "text", "text": "compare"},
        {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": _PDF},
         "title": "a.pdf"},
        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "hello"}, "title": "b.txt"},
        {"type": "text", "text": "[file file-abc123: not readable by this model]"}]

    oc.responses.create(model="claude-x", input=[{"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "and this"}, {"type": "input_file", "file_url": "https://example.com/c.pdf"}]}])
    assert claude.last.body["messages"][-1]["content"][-1] == {
        "type": "document", "source": {"type": "url", "url": "https://example.com/c.pdf"}}


def test_a_translated_maximum_is_held_to_the_models_output(database_url: str, upstream_url: str,
                                                           upstream: FakeUpstream) -> None:
    """Claude Code asks max_tokens 32,000 (or 128,000): a chat model that gives at most what
    [models] says gets that much instead of a 400; natively the client's number goes as it is."""
    settings = make_settings(database_url, upstream_url, models={"small-*": {"context_window": 128000,
                                                                             "max_output_tokens": 16384}})
    key, cid = new_key(), f"cap-{uuid.uuid4().hex[:8]}"
    with serve_proxy(settings) as p:
        r = httpx.post(f"{p.url}/c/{cid}/v1/messages", headers={"x-api-key": key}, timeout=30, json={
            "model": "small-model", "max_tokens": 128000, "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200, r.text  # (the SDK itself wants a stream for so many tokens)
        assert upstream.last.body["max_tokens"] == 16384
        assert admin(p, key, f"/admin/nodes/{r.headers['x-node-id']}/request").headers["x-request-verified"] == "true"
        client(p, key, f"/c/{cid}").messages.create(model="small-model", max_tokens=1000,
                                                    messages=[{"role": "user", "content": "again"}])
        assert upstream.last.body["max_tokens"] == 1000  # (below the limit: as asked)


def test_a_side_call_lands_where_its_content_hangs(mproxy: Proxy, claude: FakeAnthropic) -> None:
    """An agent's side call (a title request on a small model, carrying the session so far) under
    the same session header hangs where its content does -- beside the session's next turn, never
    in its context."""
    key, session = new_key(), str(uuid.uuid4())
    headers = {"x-api-key": key, "x-claude-code-session-id": session}

    def post(model: str, messages: list[dict[str, Any]]) -> httpx.Response:
        r = httpx.post(f"{mproxy.url}/auto/v1/messages", headers=headers, timeout=30,
                       json={"model": model, "max_tokens": 20, "messages": messages})
        assert r.status_code == 200, r.text
        return r

    first = [{"role": "user", "content": "fix the failing test"}]
    r1 = post("claude-x", first)
    history = [*first, {"role": "assistant", "content": [{"type": "text", "text": "echo: fix the failing test"}]}]
    side = post("claude-haiku-x", [*history, {"role": "user", "content": "Write a 5-word title for this session."}])
    r2 = post("claude-x", [*history, {"role": "user", "content": "now run it"}])
    assert r1.headers["x-conversation-id"] == side.headers["x-conversation-id"] == r2.headers["x-conversation-id"] == session
    assert side.headers["x-parent-node-id"] == r1.headers["x-node-id"] == r2.headers["x-parent-node-id"]
    assert "title" not in json.dumps(claude.last.body["messages"])  # the side call is no context of the turn


def test_a_messages_call_read_as_a_response_reports_its_usage(mproxy: Proxy, claude: FakeAnthropic, key: str,
                                                               cid: str) -> None:
    """GET /v1/responses/{id} serves any node: a Messages call's usage reads in the Responses
    API's terms -- its cache reads among the input tokens and as cached ones (it read 0 and 0)."""
    claude.enqueue(AReply(usage={"input_tokens": 20, "cache_read_input_tokens": 100, "output_tokens": 3}))
    raw = client(mproxy, key, f"/c/{cid}").messages.with_raw_response.create(
        model="claude-x", max_tokens=50, messages=[{"role": "user", "content": "hi"}])
    got = mproxy.openai(key).responses.retrieve(f"resp_{uuid.UUID(raw.headers['x-node-id']).hex}")
    assert (got.usage.input_tokens, got.usage.input_tokens_details.cached_tokens, got.usage.output_tokens) == (120, 100, 3)


def test_a_messages_call_read_as_a_response_shows_its_tool_calls(mproxy: Proxy, claude: FakeAnthropic, key: str,
                                                                  cid: str) -> None:
    """GET /v1/responses/{id} of a Messages call that answered with text and a tool call: its
    output is the answer's items as the conversation's items list gives them -- the text, then the
    call as a function_call item."""
    claude.enqueue(AReply(content=[
        {"type": "text", "text": "Listing."},
        {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls -la"}},
    ], stop_reason="tool_use"))
    raw = client(mproxy, key, f"/c/{cid}").messages.with_raw_response.create(
        model="claude-x", max_tokens=50, tools=[{"name": "Bash", "input_schema": {"type": "object"}}],
        messages=[{"role": "user", "content": "list the files"}])
    got = mproxy.openai(key).responses.retrieve(f"resp_{uuid.UUID(raw.headers['x-node-id']).hex}")
    assert [o.type for o in got.output] == ["message", "function_call"]
    assert got.output[0].content[0].text == "Listing."
    call = got.output[1]
    assert (call.call_id, call.name, json.loads(call.arguments)) == ("toolu_1", "Bash", {"command": "ls -la"})
    listed = mproxy.openai(key).conversations.items.list(cid, order="asc").data
    assert [(i.id, i.type) for i in listed[1:]] == [(o.id, o.type) for o in got.output]
    assert (listed[2].call_id, listed[2].arguments) == (call.call_id, call.arguments)


def test_usage_counts_cached_prompts_in_every_apis_terms(mproxy: Proxy, claude: FakeAnthropic,
                                                         upstream: FakeUpstream, cid: str) -> None:
    """Anthropic's input_tokens leave out its cache's reads and writes: the conversation's usage
    and /admin/usage count them in, and say how much of the prompt went through a cache --
    Anthropic's cache reads and writes, chat's prompt_tokens_details.cached_tokens."""
    key = new_key()
    metered = _cached_tokens_metered(mproxy)
    claude.enqueue(AReply(usage={"input_tokens": 5, "cache_read_input_tokens": 100, "cache_creation_input_tokens": 20,
                                 "output_tokens": 7}))
    client(mproxy, key, f"/c/{cid}").messages.create(model="claude-x", max_tokens=9,
                                                     messages=[{"role": "user", "content": "a"}])
    upstream.enqueue(Reply(content="b", usage={"prompt_tokens": 50, "completion_tokens": 3, "total_tokens": 53,
                                               "prompt_tokens_details": {"cached_tokens": 30}}))
    mproxy.openai(key, conversation=cid).chat.completions.create(model="gpt-x", messages=[{"role": "user", "content": "b"}])
    conversation = admin(mproxy, key, f"/admin/conversations/{cid}").json()
    assert conversation["usage"]["prompt_tokens"] == 125 + 50
    report = admin(mproxy, key, "/admin/usage").json()
    assert conversation["usage"]["cached_tokens"] == 120 + 30
    assert (report["prompt_tokens"], report["cached_tokens"], report["completion_tokens"]) == (175, 150, 10)
    by_model = {line["model"]: line for line in report["data"]}
    assert by_model["claude-x"]["cached_tokens"] == 120 and by_model["gpt-x"]["cached_tokens"] == 30
    assert _cached_tokens_metered(mproxy) - metered == 150


def _cached_tokens_metered(proxy: Proxy) -> float:
    text = httpx.get(f"{proxy.url}/metrics", timeout=30).text
    return float(next(line.split()[1] for line in text.splitlines()
                      if line.startswith("branchpoint_cached_tokens_total ")))


def test_parallel_tool_results_stay_whole_on_later_calls(mproxy: Proxy, claude: FakeAnthropic, key: str,
                                                          cid: str) -> None:
    """Two tool results in one user message (parallel tool use): the request that put them back
    together must not change the stored fragments -- it had joined the second result into the
    path cache's copy of the first, so from the next call on the results read as a user message
    and the tool calls were dropped (Anthropic refuses that request)."""
    c = client(mproxy, key, f"/c/{cid}")
    claude.enqueue(AReply(content=[{"type": "tool_use", "id": "t1", "name": "Read", "input": {}},
                                   {"type": "tool_use", "id": "t2", "name": "Read", "input": {}}],
                          stop_reason="tool_use"))
    c.messages.create(model="claude-x", max_tokens=10, messages=[{"role": "user", "content": "go"}])
    c.messages.create(model="claude-x", max_tokens=10, messages=[{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t1", "content": "one"},
        {"type": "tool_result", "tool_use_id": "t2", "content": "two"}]}])
    with_results = claude.last.body["messages"]
    for text in ("next", "again", "and again"):
        c.messages.create(model="claude-x", max_tokens=10, messages=[{"role": "user", "content": text}])
        assert claude.last.body["messages"][:3] == with_results


# -- one conversation, several APIs: what each upstream gets is in its own format ---------------------

_ANTHROPIC_BLOCKS = {"text", "image", "document", "tool_use", "tool_result", "thinking", "redacted_thinking"}
_RESPONSES_PARTS = {"input_text", "input_image", "input_file", "output_text", "refusal"}


def _anthropic_shaped(messages: list[dict[str, Any]]) -> None:
    for m in messages:
        assert set(m) <= {"role", "content"} and m["role"] in ("user", "assistant"), m
        if isinstance(m["content"], list):
            assert all(b.get("type") in _ANTHROPIC_BLOCKS for b in m["content"]), m


def _responses_shaped(items: list[dict[str, Any]]) -> None:
    for item in items:
        if item.get("type", "message") == "message":
            content = item.get("content")
            if isinstance(content, list):
                assert all(p.get("type") in _RESPONSES_PARTS for p in content), item
        else:
            assert item["type"] in ("function_call", "function_call_output", "reasoning"), item


def test_a_responses_conversation_continued_over_anthropic(mproxy: Proxy, claude: FakeAnthropic, key: str,
                                                           cid: str) -> None:
    """Responses items stored by one call reach an Anthropic upstream as Anthropic messages, not
    as the items they were (``type``, ``id``, ``input_text`` / ``output_text`` parts)."""
    oc = mproxy.openai(key, conversation=cid)
    oc.responses.create(model="claude-x", input="hello")
    oc.responses.create(model="claude-x", input=[{"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": "parts"}]}])
    sent = claude.last.body["messages"]
    _anthropic_shaped(sent)
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert json.dumps(sent).count("parts") == 1 and "echo: hello" in json.dumps(sent[1])


def test_conversation_items_then_a_chat_client_over_anthropic(mproxy: Proxy, claude: FakeAnthropic, key: str) -> None:
    oc = mproxy.openai(key)
    conv = oc.conversations.create(items=[{"type": "message", "role": "user", "content": "Remember 7"}])
    mproxy.openai(key, conversation=conv.id).chat.completions.create(
        model="claude-x", messages=[{"role": "user", "content": "What?"}])
    sent = claude.last.body["messages"]
    _anthropic_shaped(sent)
    assert "Remember 7" in json.dumps(sent) and "What?" in json.dumps(sent)


def test_an_image_a_tool_returned_reaches_a_chat_upstream_as_text(mproxy: Proxy, upstream: FakeUpstream, key: str,
                                                                 cid: str) -> None:
    """Claude Code's Read of a screenshot: a tool result holding an image. A chat tool message takes
    no image (OpenAI refuses it -- and every later call, which resends it), so a chat upstream gets
    a line saying an image was there; the stored block keeps the image."""
    c = client(mproxy, key, f"/c/{cid}")
    tools = [{"name": "Read", "input_schema": {"type": "object"}}]
    upstream.enqueue(Reply(content=None, tool_calls=[
        {"id": "call_1", "type": "function", "function": {"name": "Read", "arguments": '{"path": "shot.png"}'}}]))
    c.messages.create(model="gpt-x", max_tokens=50, tools=tools, messages=[{"role": "user", "content": "look"}])
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    reply = c.messages.create(model="gpt-x", max_tokens=50, tools=tools, messages=[{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "call_1", "content": [{"type": "text", "text": "the file:"}, image]}]}])
    tool_message = upstream.last.messages[-1]
    assert tool_message["role"] == "tool" and tool_message["tool_call_id"] == "call_1"
    assert "image_url" not in json.dumps(tool_message) and "iVBORw0KGgo=" not in json.dumps(tool_message)
    assert tool_message["content"].startswith("the file:") and "image/png" in tool_message["content"]
    assert reply.content[0].text
    sent = mproxy.db.fetchval("SELECT sent FROM nodes WHERE conversation_id = $1 ORDER BY created_at DESC LIMIT 1", cid)
    assert sent[0]["content"][0]["content"][1] == image


def test_a_failed_tool_says_so_to_a_chat_upstream(mproxy: Proxy, upstream: FakeUpstream, key: str, cid: str) -> None:
    """A tool_result's is_error has no field in a chat tool message: the content says it, so the
    model knows the call failed; the stored block keeps the flag."""
    c = client(mproxy, key, f"/c/{cid}")
    tools = [{"name": "Bash", "input_schema": {"type": "object"}}]
    upstream.enqueue(Reply(content=None, tool_calls=[
        {"id": "call_1", "type": "function", "function": {"name": "Bash", "arguments": '{"cmd": "cat x"}'}}]))
    c.messages.create(model="gpt-x", max_tokens=50, tools=tools, messages=[{"role": "user", "content": "read x"}])
    c.messages.create(model="gpt-x", max_tokens=50, tools=tools, messages=[{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "call_1", "content": "cat: x: No such file", "is_error": True}]}])
    assert upstream.last.messages[-1] == {"role": "tool", "tool_call_id": "call_1",
                                          "content": "[the tool failed] cat: x: No such file"}
    sent = mproxy.db.fetchval("SELECT sent FROM nodes WHERE conversation_id = $1 ORDER BY created_at DESC LIMIT 1", cid)
    assert sent[0]["content"][0]["is_error"] is True


def test_a_messages_tool_round_over_a_responses_upstream(mproxy: Proxy, upstream: FakeUpstream, key: str,
                                                         cid: str) -> None:
    """Anthropic blocks stored by a Messages call reach a Responses upstream as Responses items:
    the tool result a function_call_output answering the function call, the image an input_image."""
    c = client(mproxy, key, f"/c/{cid}")
    tools = [{"name": "Bash", "description": "run", "input_schema": {"type": "object"}}]
    upstream.enqueue(Reply(content="let me run", tool_calls=[
        {"id": "call_1", "type": "function", "function": {"name": "Bash", "arguments": '{"cmd": "ls"}'}}]))
    first = c.messages.create(model="native-1", max_tokens=50, tools=tools, messages=[{"role": "user", "content": [
        {"type": "text", "text": "first"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}])
    assert first.stop_reason == "tool_use"
    c.messages.create(model="native-1", max_tokens=50, tools=tools, messages=[{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "call_1", "content": "a.txt"}]}])
    sent = upstream.responses_requests[-1].body["input"]
    _responses_shaped(sent)
    calls = [i for i in sent if i.get("type") == "function_call"]
    outputs = [i for i in sent if i.get("type") == "function_call_output"]
    assert [c["call_id"] for c in calls] == ["call_1"] and [o["call_id"] for o in outputs] == ["call_1"]
    assert outputs[0]["output"] == "a.txt"
    # and the Conversations API lists the tool result as what it is
    listed = mproxy.openai(key).conversations.items.list(cid, order="asc").data
    assert [i.type for i in listed] == ["message", "message", "function_call", "function_call_output", "message"]
    assert listed[3].output == "a.txt" and listed[4].role == "assistant"


def test_a_messages_calls_input_items_are_its_items_in_the_conversation(mproxy: Proxy, upstream: FakeUpstream,
                                                                         key: str, cid: str) -> None:
    """``GET /v1/responses/{id}/input_items`` of a Messages node lists the items the conversation's
    items list gives its path up to it, with the same ids -- a tool result and a text in one user
    message are two -- and not its answer."""
    c = client(mproxy, key, f"/c/{cid}")
    tools = [{"name": "Bash", "input_schema": {"type": "object"}}]
    upstream.enqueue(Reply(content="Running.", tool_calls=[
        {"id": "call_1", "type": "function", "function": {"name": "Bash", "arguments": "{}"}}]))
    c.messages.create(model="gpt-x", max_tokens=50, system="Sys.", tools=tools,
                      messages=[{"role": "user", "content": "run it"}])
    r = c.messages.with_raw_response.create(model="gpt-x", max_tokens=50, tools=tools, messages=[
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "hi"},
                                     {"type": "text", "text": "what did it say?"}]}])
    node_id = uuid.UUID(r.headers["x-node-id"])
    listed = admin(mproxy, key, f"/v1/conversations/{cid}/items?order=asc").json()["data"]
    inputs = admin(mproxy, key, f"/v1/responses/resp_{node_id.hex}/input_items?order=asc").json()["data"]
    assert [(i["type"], i.get("role")) for i in inputs] == [
        ("message", "system"), ("message", "user"), ("message", "assistant"), ("function_call", None),
        ("function_call_output", None), ("message", "user")]
    assert inputs[4]["call_id"] == "call_1" and inputs[5]["content"][0]["text"] == "what did it say?"
    assert inputs == listed[:len(inputs)] and len(listed) == len(inputs) + 1  # the same items, the same ids


def test_whose_items_a_message_keeps_is_recorded_or_read_by_shape() -> None:
    """Messages read before the dialect was recorded beside their items (kept raw in a compaction
    node) are told apart by shape: Responses items have a type, or input_/output_ parts."""
    from proxy.dialects.responses.items import ITEMS, ITEMS_OF, items_of

    assert items_of({"role": "user", "content": "x"}) is None
    assert items_of({ITEMS: [{"role": "user", "content": "x"}], ITEMS_OF: "responses"}) == "responses"
    assert items_of({ITEMS: [{"type": "message", "role": "user", "content": "x"}]}) == "responses"
    assert items_of({ITEMS: [{"role": "user", "content": [{"type": "input_text", "text": "x"}]}]}) == "responses"
    assert items_of({ITEMS: [{"role": "user", "content": [{"type": "text", "text": "x"}]}]}) == "messages"
    assert items_of({ITEMS: [{"role": "assistant", "content": "plain"}]}) == "messages"


def test_a_chat_upstreams_refusal_streams_as_the_text_it_is_stored_as(mproxy: Proxy, upstream: FakeUpstream, key: str,
                                                                      cid: str) -> None:
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "gpt-x"}
    deltas = [{"role": "assistant", "content": ""}, {"refusal": "I can't "}, {"refusal": "help with that."}]
    events = [{**chunk, "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
    events.append({**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    upstream.enqueue(Reply(kind="raw", body=body, content_type="text/event-stream"))
    with client(mproxy, key, f"/c/{cid}").messages.stream(model="gpt-x", max_tokens=20,
                                                          messages=[{"role": "user", "content": "no"}]) as s:
        final = s.get_final_message()
        node_id = s.response.headers["x-node-id"]
    assert [(b.type, b.text) for b in final.content] == [("text", "I can't help with that.")]
    assert node(mproxy, key, node_id)["received"][0]["content"] == [{"type": "text", "text": "I can't help with that."}]


def test_without_a_conversation_the_proxys_own_errors_are_anthropics(mproxy: Proxy, claude: FakeAnthropic, key: str,
                                                                       database_url: str, upstream_url: str) -> None:
    """A call naming no conversation is passed through to an Anthropic upstream untouched; the
    errors the proxy itself says -- the stream cut, the upstream unreachable -- are in Anthropic's
    shape too, so the SDK raises them (an OpenAI-shaped event it took for nothing: a cut answer
    looked whole)."""
    claude.enqueue(AReply(cut=True))
    with pytest.raises(anthropic.APIStatusError) as cut:
        with client(mproxy, key, "").messages.stream(model="claude-x", max_tokens=10,
                                                     messages=[{"role": "user", "content": "cut me"}]) as stream:
            stream.get_final_message()
    assert cut.value.body["type"] == "error" and cut.value.body["error"]["type"] == "api_error"
    dead = make_settings(database_url, upstream_url, upstreams=[
        {"name": "anthropic", "base_url": f"http://127.0.0.1:{free_port()}/v1", "models": ["claude-*"],
         "api": "anthropic"}])
    with serve_proxy(dead) as p:
        for path in ("/v1/messages", "/v1/messages/count_tokens"):
            r = httpx.post(f"{p.url}{path}", headers={"x-api-key": key, "anthropic-version": "2023-06-01"},
                           json={"model": "claude-x", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]},
                           timeout=30)
            assert r.status_code == 502, r.text
            assert r.json()["type"] == "error" and r.json()["error"]["type"] == "api_error", r.text
            assert "cannot reach the upstream" in r.json()["error"]["message"]


def test_an_edit_resent_with_its_defaults_filled_in_is_matched(mproxy: Proxy, claude: FakeAnthropic, key: str) -> None:
    """Claude Code resends each Edit call as its tool's schema reads it, with ``replace_all: false``
    the model never wrote: the resent history still matches the Edit round, so the next node hangs
    under it and stores only the tool result -- the match stopped before it, and the next node,
    beside the Edit round, stored the model's call again (found by a hostile pass)."""
    c = client(mproxy, key, "/auto")
    session = {"X-Claude-Code-Session-Id": f"cc-{uuid.uuid4().hex}"}
    edit = {"name": "Edit", "description": "edit a file", "input_schema": {"type": "object", "properties": {
        "file_path": {"type": "string"}, "old_string": {"type": "string"}, "new_string": {"type": "string"},
        "replace_all": {"type": "boolean", "default": False}}, "required": ["file_path", "old_string", "new_string"]}}
    wrote = {"file_path": "notes.txt", "old_string": "pelican", "new_string": "heron"}
    claude.enqueue(AReply(content=[{"type": "tool_use", "id": "toolu_edit1", "name": "Edit", "input": wrote}],
                          stop_reason="tool_use"))
    ask = {"role": "user", "content": "use heron"}
    first = c.messages.with_raw_response.create(model="claude-x", max_tokens=50, tools=[edit], messages=[ask],
                                                extra_headers=session)
    resent = {"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_edit1", "name": "Edit", "input": {**wrote, "replace_all": False}}]}
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_edit1", "content": "edited"}]}
    second = c.messages.with_raw_response.create(model="claude-x", max_tokens=50, tools=[edit],
                                                 messages=[ask, resent, result], extra_headers=session)
    assert second.headers["x-context-matched"] == "2"
    assert second.headers["x-parent-node-id"] == first.headers["x-node-id"]
    assert node(mproxy, key, second.headers["x-node-id"])["sent"] == [result]
    # the upstream gets the call as its model wrote it: the request extends the one before byte for
    # byte (a prompt cache's prefix), then the result
    assert claude.last.body["messages"][1:] == [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_edit1", "name": "Edit", "input": wrote}]},
        result]


@pytest.mark.parametrize("model", ["claude-x", "gpt-4o-mini"])
@pytest.mark.parametrize("where", ["/auto", "/c/{cid}"])
def test_the_sdks_tool_runner_threads_are_declined_and_it_sends_the_whole_conversation(
        mproxy: Proxy, claude: FakeAnthropic, upstream: FakeUpstream, key: str, cid: str, model: str, where: str) -> None:
    """The anthropic SDK's tool runner uses message threads (a beta: the server keeps the
    conversation, each request sends only what is new) -- a stored call's conversation is the
    tree's, and a translated call's upstream has no threads: refused as Anthropic refuses what
    threads do not support, so the SDK sends the whole conversation instead. It sent only the new
    messages, which reached the upstream alone, and each round became a conversation of its own
    (found by a hostile pass)."""
    from anthropic import beta_tool

    @beta_tool
    def weather(city: str) -> str:
        """The weather in a city.

        Args:
            city: the city
        """
        return f"21 C in {city}"

    if model.startswith("claude"):
        claude.enqueue(AReply(content=[{"type": "tool_use", "id": "toolu_w1", "name": "weather",
                                        "input": {"city": "Paris"}}], stop_reason="tool_use"),
                       AReply(content=[{"type": "text", "text": "21 C."}]))
    else:
        upstream.enqueue(Reply(content=None, tool_calls=[{"id": "toolu_w1", "type": "function", "function": {
            "name": "weather", "arguments": '{"city": "Paris"}'}}]), Reply(content="21 C."))
    c = client(mproxy, key, where.format(cid=cid))
    final = c.beta.messages.tool_runner(model=model, max_tokens=100, tools=[weather], system="You answer weather.",
                                        messages=[{"role": "user", "content": "Weather in Paris?"}]).until_done()
    assert final.content[0].text == "21 C."
    if model.startswith("claude"):
        sent = claude.last.body
        assert "thread" not in sent and sent["system"] == "You answer weather."
        assert [(m["role"], [b["type"] for b in m["content"]] if isinstance(m["content"], list) else m["content"])
                for m in sent["messages"]] == [("user", "Weather in Paris?"), ("assistant", ["tool_use"]),
                                               ("user", ["tool_result"])]
    else:
        sent = upstream.last.body
        assert "thread" not in sent
        assert [m["role"] for m in sent["messages"]] == ["system", "user", "assistant", "tool"]
        assert sent["messages"][3]["content"] == "21 C in Paris"
    listed = admin(mproxy, key, "/admin/conversations").json()["data"]
    assert len(listed) == 1
    path = admin(mproxy, key, f"/admin/conversations/{listed[0]['id']}/path").json()["data"]
    assert len(path) == 2 and path[1]["parent_id"] == path[0]["id"]


def test_a_null_thread_is_no_thread(mproxy: Proxy, claude: FakeAnthropic, key: str, cid: str) -> None:
    """``"thread": null`` (a client that writes every field, set or not) asks for no thread: served."""
    r = httpx.post(f"{mproxy.url}/c/{cid}/v1/messages", headers={"x-api-key": key}, timeout=30,
                   json={"model": "claude-x", "max_tokens": 10, "thread": None, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text
    r = httpx.post(f"{mproxy.url}/c/{cid}/v1/messages", headers={"x-api-key": key}, timeout=30,
                   json={"model": "claude-x", "max_tokens": 10, "thread": {"type": "create"},
                         "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and r.json()["error"]["details"]["error_code"] == "thread_unsupported_request"


@pytest.mark.parametrize("kind", ["json", "stream"])
def test_over_chat_a_tool_calls_signature_goes_back_to_its_provider(mproxy: Proxy, upstream: FakeUpstream,
                                                                    claude: FakeAnthropic, kind: str) -> None:
    """Gemini signs a tool call (``extra_content``) and refuses the next call when it comes back
    unsigned. A ``tool_use`` block has no place for it: the answer carries it in a
    ``redacted_thinking`` block after the calls (whole or streamed alike), which a client sends
    back as it got it -- so the tool round reaches Gemini signed, whether the client resends its
    whole history (Claude Code) or continues from the stored answer; an Anthropic upstream, which
    did not make it, never gets that block."""
    signature = {"google": {"thought_signature": "EjQKMgEMOdbHJChLX75QUCJj"}}
    signed = {"id": "fc-1", "type": "function", "function": {"name": "Bash", "arguments": '{"command": "pwd"}'},
              "extra_content": signature}
    upstream.enqueue(Reply(kind=kind, content=None, tool_calls=[signed]))
    c = client(mproxy, new_key(), "/auto")
    question = {"role": "user", "content": f"where? {uuid.uuid4().hex[:6]}"}
    tools = [{"name": "Bash", "input_schema": {"type": "object"}}]
    asked: dict[str, Any] = {"model": "gemini-3-flash-preview", "max_tokens": 50, "tools": tools,
                             "messages": [question]}
    final = _final_message(c, asked, kind)
    assert [b.type for b in final.content] == ["tool_use", "redacted_thinking"] and final.stop_reason == "tool_use"
    answer = {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in final.content]}
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "fc-1", "content": "/home"}]}
    upstream.enqueue(Reply(content="In /home."))
    raw = c.messages.with_raw_response.create(**{**asked, "messages": [question, answer, result]})
    assert raw.headers["x-context-matched"] == "2"  # (the stored answer: the history resent matched it)
    [call] = upstream.last.messages[1]["tool_calls"]
    assert call["id"] == "fc-1" and call["extra_content"] == signature
    claude.enqueue(AReply(content=[{"type": "text", "text": "Still /home."}]))
    c.messages.create(**{**asked, "model": "claude-sonnet-4-5", "messages": [question, answer, result]})
    sent = claude.last.messages[1]["content"]
    assert [b["type"] for b in sent] == ["tool_use"] and sent[0]["id"] == "fc-1"


@pytest.mark.parametrize("value, stored", [("1e20", b'{"x":100000000000000000000}'), ("-0.0", b'{"x":0.0}'),
                                           ("1.5e3", b'{"x":1500.0}')])
def test_a_number_in_a_resent_history_goes_out_as_it_will_read_back_stored(mproxy: Proxy, claude: FakeAnthropic,
                                                                          value: str, stored: bytes) -> None:
    """A resumed session's history holds a tool input with a number PostgreSQL's jsonb writes
    otherwise (1e20 as an integer, -0.0 as 0.0): the first request said it as parsed, every later
    one as stored -- the request's prefix changed once (a provider's prompt cache missed) and the
    first node's request no longer verified. Now it goes out as stored from the first call."""
    history = ('[{"role":"user","content":[{"type":"text","text":"go"}]},{"role":"assistant","content":[{"type":'
               '"tool_use","id":"toolu_9","name":"calc","input":{"x":' + value + '}}]},{"role":"user","content":'
               '[{"type":"tool_result","tool_use_id":"toolu_9","content":"ok"}]}]')
    key = new_key()
    headers = {"x-api-key": key, "content-type": "application/json", "X-Claude-Code-Session-Id": str(uuid.uuid4())}
    with httpx.Client(base_url=mproxy.url, timeout=30, headers=headers) as http:
        claude.enqueue(AReply(content=[{"type": "text", "text": "a1"}]))
        first = http.post("/auto/v1/messages", content='{"model":"claude-x","max_tokens":100,"messages":' + history + '}')
        assert first.status_code == 200, first.text
        claude.enqueue(AReply(content=[{"type": "text", "text": "a2"}]))
        second = http.post("/auto/v1/messages", content='{"model":"claude-x","max_tokens":100,"messages":' + history[:-1]
                           + ',{"role":"assistant","content":[{"type":"text","text":"a1"}]},'
                           '{"role":"user","content":[{"type":"text","text":"next"}]}]}')
        assert second.status_code == 200 and second.headers["x-context-matched"] == "4", second.text
        replay = http.get(f"/admin/nodes/{first.headers['x-node-id']}/request")
    assert replay.headers["x-request-verified"] == "true"
    assert stored in claude.calls[-2].raw and stored in claude.calls[-1].raw
