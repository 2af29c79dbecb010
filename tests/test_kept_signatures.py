"""What a translated answer keeps for the provider that produced it (proxy/dialects/signed.py):
a tool call's signature (Gemini's ``extra_content``) and signed thinking (Claude's) ride in one
piece of ours -- a Responses reasoning item, an Anthropic ``redacted_thinking`` block -- and go
back to that provider only, however the history comes back: stored, resent whole and matched,
resent and matched by nothing, copied by a Conversations item delete. Neither the piece nor what
it keeps may reach another provider: asserted on what each fake upstream received."""

from __future__ import annotations

import json
import uuid
from typing import Any

import anthropic
import openai
import pytest

from .anthropic_fake import AReply
from .conftest import make_settings, new_key, serve_proxy
from .fakes import Reply
from .helpers import tool_call

SIGNATURE = {"google": {"thought_signature": "EjQKMgEMOdbHJChLX75QUCJj"}}
SIGNED = {**tool_call("fc-1", "weather", '{"city": "Oslo"}'), "extra_content": SIGNATURE}
WEATHER = {"type": "function", "name": "weather", "description": "w",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
RESULT = {"type": "function_call_output", "call_id": "fc-1", "output": "-3 C"}
BASH = [{"name": "Bash", "input_schema": {"type": "object"}}]


@pytest.fixture(scope="module")
def four(database_url: str, upstream_url: str, claude_server: Any) -> Any:
    """Gemini and a plain model on chat upstreams, a Responses upstream, an Anthropic one."""
    with serve_proxy(make_settings(database_url, upstream_url, upstreams=[
        {"name": "anthropic", "base_url": claude_server[1].url + "/v1", "models": ["claude-*"], "api": "anthropic"},
        {"name": "gemini", "base_url": upstream_url, "models": ["gemini-*"]},
        {"name": "native", "base_url": upstream_url, "models": ["native-*"], "api": "responses"},
        {"name": "plain", "base_url": upstream_url, "models": ["*"]},
    ])) as p:
        yield p


def _auto(proxy: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{proxy.url}/auto/v1", api_key=new_key(), max_retries=0)


def _gemini_turn(client: openai.OpenAI, upstream: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    question = {"role": "user", "content": f"Weather in Oslo? {uuid.uuid4().hex[:6]}"}
    upstream.enqueue(Reply(content=None, tool_calls=[SIGNED]))
    first = client.responses.create(model="gemini-3", input=[question], tools=[WEATHER])
    items = [i.model_dump(exclude_none=True) for i in first.output]
    assert [i["type"] for i in items] == ["function_call", "reasoning"]
    return question, items


def test_a_resent_history_gives_a_responses_upstream_neither_the_piece_nor_the_signature(four, upstream):
    """Codex resends its whole history; the user switches from Gemini to a model on a Responses
    upstream: the history matches, and the Responses upstream gets the call and its result --
    never our reasoning item (OpenAI refuses an encrypted_content it did not make)."""
    client = _auto(four)
    question, items = _gemini_turn(client, upstream)
    upstream.enqueue(Reply(content="Cold."))
    raw = client.responses.with_raw_response.create(model="native-1", input=[question, *items, RESULT],
                                                    tools=[WEATHER])
    assert raw.headers["x-context-matched"] == "2"
    sent = json.dumps(upstream.responses_requests[-1].body)
    assert "bp-signed:" not in sent and "thought_signature" not in sent and '"call_id": "fc-1"' in sent
    # the same history naming no conversation: passed through, without our item
    plain = openai.OpenAI(base_url=f"{four.url}/v1", api_key=new_key(), max_retries=0)
    plain.responses.create(model="native-1", input=[question, *items, RESULT], tools=[WEATHER])
    sent = json.dumps(upstream.responses_requests[-1].body)
    assert "bp-signed:" not in sent and '"call_id": "fc-1"' in sent


def test_a_history_matched_by_nothing_gives_the_signature_to_its_producer_only(four, upstream):
    """The same history resent under another key matches nothing: it is stored as sent. Gemini
    gets its call signed; a later call to another provider gets the call unsigned."""
    question, items = _gemini_turn(_auto(four), upstream)
    other = _auto(four)
    upstream.enqueue(Reply(content="Cold."))
    second = other.responses.create(model="gemini-3", input=[question, *items, RESULT], tools=[WEATHER])
    assert upstream.last.messages[1]["tool_calls"] == [SIGNED]
    upstream.enqueue(Reply(content="ok"))
    other.responses.create(model="gpt-4o-mini", previous_response_id=second.id, input="and now?", tools=[WEATHER])
    assert upstream.last.messages[1]["tool_calls"] == [tool_call("fc-1", "weather", '{"city": "Oslo"}')]
    assert "bp-signed:" not in json.dumps(upstream.last.body)


def _claude_code_over_gemini(proxy: Any, upstream: Any) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    signed = {"id": "fc-1", "type": "function", "function": {"name": "Bash", "arguments": '{"command": "pwd"}'},
              "extra_content": SIGNATURE}
    upstream.enqueue(Reply(content=None, tool_calls=[signed]))
    c = anthropic.Anthropic(base_url=f"{proxy.url}/auto", api_key=new_key(), max_retries=0)
    question = {"role": "user", "content": f"where? {uuid.uuid4().hex[:6]}"}
    final = c.messages.create(model="gemini-3", max_tokens=50, tools=BASH, messages=[question])
    answer = {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in final.content]}
    assert [b["type"] for b in answer["content"]] == ["tool_use", "redacted_thinking"]
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "fc-1", "content": "/home"}]}
    return question, answer, result


@pytest.mark.parametrize("where", ["/auto", ""])  # (stored, matched by nothing; not stored at all)
def test_a_messages_history_over_gemini_resent_to_claude_or_another_model(four, upstream, claude, where):
    """Claude Code's history of a Gemini tool round, resent to Claude (matched by nothing, or
    naming no conversation) and to another chat model: Anthropic never gets our
    ``redacted_thinking`` block (it would refuse its data), and the other model never gets the
    signature."""
    question, answer, result = _claude_code_over_gemini(four, upstream)
    c = anthropic.Anthropic(base_url=f"{four.url}{where}", api_key=new_key(), max_retries=0)
    claude.enqueue(AReply(content=[{"type": "text", "text": "Still /home."}]))
    c.messages.create(model="claude-x", max_tokens=50, tools=BASH, messages=[question, answer, result])
    assert [b["type"] for b in claude.last.messages[1]["content"]] == ["tool_use"]
    upstream.enqueue(Reply(content="ok"))
    c.messages.create(model="gpt-4o-mini", max_tokens=50, tools=BASH, messages=[question, answer, result])
    assert "thought_signature" not in json.dumps(upstream.last.body)
    assert "bp-signed:" not in json.dumps(upstream.last.body)


def test_a_deleted_items_copies_give_claudes_thinking_to_claude_only(four, upstream, claude):
    """A Conversations item delete copies the nodes after it from their listed items: Claude's
    signed thinking goes back to Claude from the copy -- and to no other model."""
    thinking = {"type": "thinking", "thinking": "hmm", "signature": "sig1"}
    key = new_key()
    conv = four.openai(key).conversations.create()
    a = anthropic.Anthropic(base_url=f"{four.url}/c/{conv.id}", api_key=key, max_retries=0)
    asked = {"model": "claude-x", "max_tokens": 2000, "tools": [{"name": "shell", "input_schema": {"type": "object"}}]}
    a.messages.create(**asked, messages=[{"role": "user", "content": "note: DELETE ME"}])
    claude.enqueue(AReply(content=[thinking, {"type": "tool_use", "id": "toolu_7", "name": "shell",
                                              "input": {"cmd": "ls"}}], stop_reason="tool_use"))
    a.messages.create(**asked, messages=[{"role": "user", "content": "list files"}])
    http = four.http(key)
    items = http.get(f"/v1/conversations/{conv.id}/items", params={"order": "asc"}).json()["data"]
    victim = next(i for i in items if "DELETE ME" in str(i) and i.get("role") == "user")
    assert http.delete(f"/v1/conversations/{conv.id}/items/{victim['id']}").status_code == 200
    claude.enqueue(AReply(content=[{"type": "text", "text": "files seen"}]))
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_7", "content": "files"}]}
    a.messages.create(**asked, messages=[result])
    assert [m for m in claude.last.messages if m["role"] == "assistant"][-1]["content"][0] == thinking
    head = four.http(key).get(f"/admin/conversations/{conv.id}").json()["head_node_id"]
    parent = four.http(key).get(f"/admin/nodes/{head}").json()["parent_id"]
    upstream.enqueue(Reply(content="ok"))
    a.messages.create(**{**asked, "model": "gpt-4o-mini"}, messages=[result],
                      extra_headers={"X-Parent-Node-Id": parent})  # (the same turn, to another model)
    assert "sig1" not in json.dumps(upstream.last.body) and "bp-signed:" not in json.dumps(upstream.last.body)


def test_a_chat_clients_stream_of_two_thinking_blocks_reads_in_the_openai_sdk(four, claude):
    """Interleaved thinking: two signed thinking blocks in one answer reach a streaming chat client
    as ``thinking_blocks`` once, whole -- the openai SDK's stream helper refused a second list
    delta without an index."""
    claude.enqueue(AReply(content=[
        {"type": "thinking", "thinking": "first", "signature": "s1"},
        {"type": "tool_use", "id": "toolu_1", "name": "shell", "input": {"cmd": "ls"}},
        {"type": "thinking", "thinking": "second", "signature": "s2"},
        {"type": "text", "text": "done"}], stop_reason="end_turn"))
    client = four.openai(new_key(), conversation=f"c-{uuid.uuid4().hex[:8]}")
    with client.chat.completions.stream(model="claude-x", messages=[{"role": "user", "content": "go"}],
                                        max_tokens=100) as s:
        for _ in s:
            pass
        final = s.get_final_completion()
    blocks = final.choices[0].message.model_extra["thinking_blocks"]
    assert [b["signature"] for b in blocks] == ["s1", "s2"]


def test_a_kept_item_goes_with_the_answer_before_it_not_a_later_one_with_the_same_call_id():
    """Two answers whose calls have the same id (``call_0``, as servers that number calls give
    them), the first one signed: its kept item restores onto it, never onto the later one."""
    from proxy.assembly import KEPT
    from proxy.dialects.responses.items import to_messages
    from proxy.dialects.responses.translate import output_items

    node = uuid.uuid4()
    first = output_items({"role": "assistant", "content": None,
                          "tool_calls": [{**tool_call("call_0", "weather", "{}"), "extra_content": SIGNATURE}]},
                         node, producer="gemini")
    second = output_items({"role": "assistant", "content": None, "tool_calls": [tool_call("call_0", "weather", "{}")]},
                          uuid.uuid4(), producer="plain")
    out = {"type": "function_call_output", "call_id": "call_0", "output": "x"}
    messages = to_messages([*first, out, *second, out])
    assistants = [m for m in messages if m["role"] == "assistant"]
    assert [KEPT in m for m in assistants] == [True, False]
    assert assistants[0][KEPT][0]["producer"] == "gemini"
