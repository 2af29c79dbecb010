"""An Anthropic Messages client over an upstream that speaks only OpenAI's Responses API (Claude
Code in front of a model only that API serves): the request goes Messages -> chat -> Responses,
the answer back the same way (docs/behaviour.md#the-messages-api). Assertions on what the fake
upstream received and on what was stored."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx

from .conftest import Proxy
from .fakes import FakeUpstream, Reply
from .helpers import responses_answer, responses_events

READ = {"name": "Read", "description": "read a file", "input_schema": {
    "type": "object", "properties": {"file_path": {"type": "string"}, "offset": {"type": "number"}},
    "required": ["file_path"]}}


def _post(proxy: Proxy, key: str, cid: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{proxy.url}/c/{cid}/v1/messages", headers={"x-api-key": key}, json=body, timeout=30)


def test_function_tools_stay_non_strict(mproxy: Proxy, upstream: FakeUpstream, key: str, cid: str) -> None:
    """Anthropic's tools (as chat's) are not strict, the Responses API's are unless they say so:
    Read's optional offset would have become required."""
    r = _post(mproxy, key, cid, {"model": "native-1", "max_tokens": 50, "tools": [READ],
                                 "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text
    (tool,) = upstream.responses_requests[-1].body["tools"]
    assert (tool["type"], tool["name"], tool["strict"]) == ("function", "Read", False)
    assert tool["parameters"]["required"] == ["file_path"]


def test_a_small_max_tokens_is_raised_to_the_responses_minimum(mproxy: Proxy, upstream: FakeUpstream, key: str,
                                                               cid: str) -> None:
    """Anthropic takes max_tokens 1 (Claude Code's quota probe asks it); OpenAI's Responses API
    refuses max_output_tokens below 16."""
    r = _post(mproxy, key, cid, {"model": "native-1", "max_tokens": 1, "messages": [{"role": "user", "content": "quota"}]})
    assert r.status_code == 200, r.text
    assert upstream.responses_requests[-1].body["max_output_tokens"] == 16


def test_a_tool_result_with_more_than_text_reaches_the_model_as_text(mproxy: Proxy, upstream: FakeUpstream, key: str,
                                                                     cid: str) -> None:
    """A tool result holding search results beside its text reached the upstream's
    function_call_output as the JSON of chat content parts."""
    upstream.enqueue(Reply(content=None, tool_calls=[
        {"id": "call_1", "type": "function", "function": {"name": "Read", "arguments": '{"file_path": "a"}'}}]))
    c = anthropic.Anthropic(base_url=f"{mproxy.url}/c/{cid}", api_key=key, max_retries=0)
    first = c.messages.create(model="native-1", max_tokens=50, tools=[READ], messages=[{"role": "user", "content": "go"}])
    assert first.stop_reason == "tool_use"
    r = _post(mproxy, key, cid, {"model": "native-1", "max_tokens": 50, "tools": [READ], "messages": [
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": [
            {"type": "text", "text": "file says hi"},
            {"type": "search_result", "source": "https://x", "title": "X", "content": [{"type": "text", "text": "found"}]},
        ]}]}]})
    assert r.status_code == 200, r.text
    output = next(i for i in upstream.responses_requests[-1].body["input"] if i.get("type") == "function_call_output")
    assert output["output"] == "file says hi\n[search result X: https://x]\nfound"


def test_a_key_split_across_text_deltas_is_masked_in_what_is_stored(mproxy: Proxy, upstream: FakeUpstream, key: str,
                                                                    cid: str) -> None:
    text = f"Your key is {key} ok"
    cut = text.index(key) + 8
    message = {"type": "message", "role": "assistant", "id": "msg_u", "status": "completed",
               "content": [{"type": "output_text", "text": text, "annotations": []}]}
    final = responses_answer([message])
    upstream.enqueue(Reply(kind="raw", content_type="text/event-stream", body=responses_events(
        {"type": "response.created", "response": {**final, "status": "in_progress", "output": []}},
        {"type": "response.output_item.added", "output_index": 0, "item": {**message, "content": []}},
        {"type": "response.output_text.delta", "output_index": 0, "content_index": 0, "delta": text[:cut]},
        {"type": "response.output_text.delta", "output_index": 0, "content_index": 0, "delta": text[cut:]},
        {"type": "response.output_item.done", "output_index": 0, "item": message},
        {"type": "response.completed", "response": final})))
    r = _post(mproxy, key, cid, {"model": "native-1", "max_tokens": 50, "stream": True,
                                 "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 200
    assert key not in r.text  # (the client's deltas: the outer translator masks across them)
    stored = httpx.get(f"{mproxy.url}/admin/nodes/{r.headers['x-node-id']}", headers={"x-api-key": key}).json()
    assert key not in json.dumps(stored["received"]) and "Your key is" in json.dumps(stored["received"])


def test_an_encrypted_reasoning_items_summary_is_the_answers_thinking(mproxy: Proxy, upstream: FakeUpstream, key: str,
                                                                     cid: str) -> None:
    """As a stream shows it (its summary deltas): the whole answer dropped it."""
    reasoning = {"type": "reasoning", "id": "rs_2", "summary": [{"type": "summary_text", "text": "hmm"}],
                 "encrypted_content": "ENC-BLOB"}
    upstream.enqueue(Reply(content="third", extra_message={"reasoning_item": reasoning}))
    r = _post(mproxy, key, cid, {"model": "native-1", "max_tokens": 50, "messages": [{"role": "user", "content": "q3"}]})
    assert r.status_code == 200, r.text
    assert [(b["type"], b.get("thinking") or b.get("text")) for b in r.json()["content"]] == [("thinking", "hmm"),
                                                                                            ("text", "third")]


def test_a_field_the_upstream_cannot_honour_is_refused_under_the_clients_own_name(
        mproxy: Proxy, upstream: FakeUpstream, claude_server: Any, key: str, cid: str) -> None:
    """A request translated through chat is refused for a field the upstream's API has no
    equivalent of under the name its client sent: an Anthropic client's stop_sequences towards a
    Responses model (chat's 'stop' was named), an OpenAI Responses client's text.format of JSON
    without a schema towards an Anthropic model (chat's 'response_format' was). Nothing is sent upstream."""
    before = len(upstream.responses_requests)
    c = anthropic.Anthropic(base_url=f"{mproxy.url}/c/{cid}", api_key=key, max_retries=0)
    try:
        c.messages.create(model="native-1", max_tokens=50, stop_sequences=["END"],
                          messages=[{"role": "user", "content": "hi"}])
        raise AssertionError("stop_sequences reached a Responses upstream")
    except anthropic.BadRequestError as exc:
        error = exc.body["error"]  # type: ignore[index]
        assert error["type"] == "invalid_request_error", error
        assert error["message"].startswith("'stop_sequences' has no equivalent in the Responses API"), error
    assert len(upstream.responses_requests) == before

    claude_before = len(claude_server[0].requests)
    r = httpx.post(f"{mproxy.url}/c/{cid}-r/v1/responses", headers={"Authorization": f"Bearer {key}"}, timeout=30,
                   json={"model": "claude-x", "input": "hi", "text": {"format": {"type": "json_object"}}})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "text.format" and error["message"].startswith("'text.format' of type 'json_object' has no equivalent"), error
    assert len(claude_server[0].requests) == claude_before
