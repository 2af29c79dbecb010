"""A Responses stream translated from a chat upstream says the answer's items one after the other,
as OpenAI streams them: LangChain's ``ChatOpenAI(use_responses_api=True, streaming=True)`` numbers
its content blocks by the order of ``output_index`` -- an event of an earlier item after a later
one began was a block of its own, sent back on the next call as an item of its own. A message
closed only at the end (its ``output_text.done`` after the call's events) came back as an empty
message item after the call, and the reasoning's or text's last characters held back by the
credential masker (anything that may begin the caller's key, ``s`` of ``sk-…``) as a second
reasoning item or message: the resent history then read as an assistant message between the call
and its result -- the pairing check dropped both, the model never saw its tool round, and the
history matched nothing (a new conversation under ``/auto/v1``). Driven here with plain HTTP in
the shapes LangChain sends."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from .fakes import Reply
from .helpers import MODEL, responses_answer, tool_call

WEATHER_TOOL = {"type": "function", "name": "weather", "description": "The weather in a city.",
                "parameters": {"properties": {"city": {"type": "string"}}, "required": ["city"], "type": "object"}}
CALL = tool_call("call_w1", "weather", '{"city":"Paris"}')
# (the events a call's item closes with, which LangChain does not read as a block: a call stays
# open while its arguments may go on, and closes at the end)
CALL_DONE = ("response.function_call_arguments.done", "response.output_item.done")


def _stream(url: str, key: str, body: dict[str, Any]) -> tuple[list[dict[str, Any]], httpx.Headers]:
    with httpx.stream("POST", f"{url}/auto/v1/responses", json={"model": MODEL, "stream": True, **body},
                      headers={"Authorization": f"Bearer {key}"}, timeout=30) as r:
        assert r.status_code == 200
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")], r.headers


def _runs(events: list[dict[str, Any]]) -> list[int]:
    """The output_index of each run of consecutive events of one item, as LangChain makes a content
    block of each (a call's closing events left out)."""
    runs: list[int] = []
    for e in events:
        if "output_index" not in e or (e["type"] in CALL_DONE and e.get("item", {"type": "function_call"})["type"]
                                       == "function_call"):
            continue
        if not runs or runs[-1] != e["output_index"]:
            runs.append(e["output_index"])
    return runs


@pytest.mark.parametrize(("reasoning", "content"), [
    (None, "Checking Rome."),  # nothing held back: the message closed at the end, after the call
    (None, "Checking Paris"),  # its last "s" held back (it may begin the key) until the finishing chunk
    ("thinking about paris", None),  # the reasoning's last "s" held back
    ("thinking about paris", "Checking Paris"),
])
def test_each_item_is_said_whole_before_the_next(proxy, upstream, key, reasoning, content):
    upstream.enqueue(Reply(kind="stream", content=content, reasoning=reasoning, tool_calls=[CALL]))
    events, _ = _stream(proxy.url, key, {"input": "What is the weather in Paris?", "tools": [WEATHER_TOOL],
                                         "reasoning": {"effort": "low", "summary": "auto"}})
    runs = _runs(events)
    assert runs == sorted(set(runs)), [(e["type"], e.get("output_index")) for e in events]
    final = events[-1]["response"]["output"]
    assert [i["type"] for i in final] == [*(["reasoning"] if reasoning else []), *(["message"] if content else []),
                                          "function_call"]
    if content:
        assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == content
        assert [e["text"] for e in events if e["type"] == "response.output_text.done"] == [content]
    if reasoning:
        assert "".join(e["delta"] for e in events if e["type"] == "response.reasoning_summary_text.delta") == reasoning
        assert [e["text"] for e in events if e["type"] == "response.reasoning_summary_text.done"] == [reasoning]


def test_langchains_resent_tool_round_matches_and_reaches_the_model(proxy, upstream, key):
    """The history LangChain sends back after a streamed text-and-call answer -- its blocks as it
    reads them from the events, each an input item -- matches the stored answer, and the upstream
    gets the call and its result."""
    question = {"content": "What is the weather in Paris?", "role": "user", "type": "message"}
    upstream.enqueue(Reply(kind="stream", content="Checking Paris", tool_calls=[CALL]),
                     Reply(kind="stream", content="It is 21 C in Paris."))
    events, first = _stream(proxy.url, key, {"input": [question], "tools": [WEATHER_TOOL]})
    _resend_and_check(proxy.url, upstream, key, [question, *_langchains_items(events)], first, "Checking Paris")


def _resend_and_check(url: str, upstream: Any, key: str, history: list[dict[str, Any]], first: httpx.Headers,
                      text: str) -> None:
    """Send ``history`` back with the call's result: it matches the first answer (the call hangs
    under it), and the upstream gets one assistant message -- ``text`` and the call -- and the result."""
    sent = [*history, {"type": "function_call_output", "output": "21 C in Paris", "call_id": "call_w1"}]
    _, second = _stream(url, key, {"input": sent, "tools": [WEATHER_TOOL]})
    assert second["x-conversation-id"] == first["x-conversation-id"]
    assert (second["x-parent-node-id"], second["x-context-matched"]) == (first["x-node-id"], "2")
    got = upstream.last.messages
    assert [m["role"] for m in got] == ["user", "assistant", "tool"]
    assert got[1]["content"] == text and got[1]["tool_calls"][0]["id"] == "call_w1"
    assert got[2] == {"role": "tool", "tool_call_id": "call_w1", "content": "21 C in Paris"}


def _langchains_items(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The input items LangChain sends back for a streamed answer: one per run of an item's events
    (its content blocks, as it reads them from the events)."""
    items: list[dict[str, Any]] = []
    for e in events:
        if "output_index" not in e or (e["type"] in CALL_DONE and e.get("item", {"type": "function_call"})["type"]
                                       == "function_call"):
            continue
        if not items or items[-1]["_at"] != e["output_index"]:
            items.append({"_at": e["output_index"], "text": "", "id": None, "call": None})
        block = items[-1]
        if e["type"] == "response.output_text.delta":
            block["text"] += e["delta"]
        elif e["type"] == "response.output_text.done":
            block["id"] = e["item_id"]
        elif e["type"] == "response.output_item.added" and e["item"]["type"] == "function_call":
            block["call"] = dict(e["item"])
        elif e["type"] == "response.function_call_arguments.delta":
            block["call"]["arguments"] += e["delta"]
    sent: list[dict[str, Any]] = []
    for block in items:
        if block["call"] is not None:
            c = block["call"]
            sent.append({"type": "function_call", "name": c["name"], "arguments": c["arguments"],
                         "call_id": c["call_id"], "id": c["id"]})
        else:
            sent.append({"type": "message", "content": [{"type": "output_text", "text": block["text"], "annotations": []}],
                         "role": "assistant", **({"id": block["id"]} if block["id"] else {})})
    return sent


def _sse(*deltas: tuple[dict[str, Any], str | None]) -> bytes:
    base = {"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 1, "model": MODEL}
    return b"".join(b"data: " + json.dumps({**base, "choices": [{"index": 0, "delta": d, "finish_reason": f}]}).encode()
                    + b"\n\n" for d, f in deltas) + b"data: [DONE]\n\n"


def test_text_after_a_call_in_one_answer_is_resent_with_it(proxy, upstream, key):
    """A chat answer whose text goes on after its tool call ("Let me look." call " One moment.")
    streams as two message items around the call, as OpenAI streams such an answer; the final
    response and the node hold one message. LangChain sends all three items back: the second
    message joins the first (it names the same answer, ``msg_<node>_<i>``) -- it read as another
    assistant message between the call and its result, the pairing check dropped the tool round
    (the model never saw its result) and the history matched nothing stored."""
    upstream.enqueue(Reply(kind="raw", content_type="text/event-stream", body=_sse(
        ({"role": "assistant", "content": "Let me look."}, None),
        ({"tool_calls": [{"index": 0, **CALL}]}, None),
        ({"content": " One moment."}, None), ({}, "tool_calls"))))
    question = {"content": "What is the weather in Paris?", "role": "user", "type": "message"}
    events, first = _stream(proxy.url, key, {"input": [question], "tools": [WEATHER_TOOL]})
    resent = _langchains_items(events)
    assert [i["type"] for i in resent] == ["message", "function_call", "message"]
    upstream.enqueue(Reply(kind="stream", content="It is 21 C in Paris."))
    _resend_and_check(proxy.url, upstream, key, [question, *resent], first, "Let me look. One moment.")


def test_a_native_answers_two_messages_around_a_call_read_as_one_on_a_chat_upstream(native, upstream, key, cid):
    """A Responses upstream's answer of a message, a call and another message (GPT-5's commentary
    before a call and more after it): a chat upstream later reads it as one assistant message with
    the call -- a second assistant message between the call and its result parted them -- while
    the Responses upstream gets the items back as they were."""
    headers = {"Authorization": f"Bearer {key}", "X-Conversation-Id": cid}

    def message(text: str) -> dict[str, Any]:
        return {"type": "message", "role": "assistant", "id": "msg_up", "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}]}

    call = {"type": "function_call", "id": "fc_up", "call_id": "call_w1", "name": "weather",
            "arguments": '{"city":"Paris"}', "status": "completed"}
    upstream.enqueue(Reply(kind="raw", body=json.dumps(responses_answer(
        [message("Let me look."), call, message(" One moment.")])).encode()))
    r = httpx.post(f"{native.url}/v1/responses", headers=headers, timeout=30,
                   json={"model": "native-1", "input": "What is the weather in Paris?", "tools": [WEATHER_TOOL]})
    assert r.status_code == 200, r.text
    assert [i["type"] for i in r.json()["output"]] == ["message", "function_call", "message"]
    result = {"type": "function_call_output", "output": "21 C in Paris", "call_id": "call_w1"}
    upstream.enqueue(Reply(content="It is 21 C."))
    r = httpx.post(f"{native.url}/v1/responses", headers=headers, timeout=30,
                   json={"model": "gpt-4o-mini", "input": [result], "tools": [WEATHER_TOOL]})
    assert r.status_code == 200, r.text
    got = upstream.last.messages
    assert [m["role"] for m in got] == ["user", "assistant", "tool"], got
    assert got[1]["content"] == "Let me look. One moment." and got[1]["tool_calls"][0]["id"] == "call_w1"
    upstream.enqueue(Reply(kind="raw", body=json.dumps(responses_answer([message("Fine.")])).encode()))
    r = httpx.post(f"{native.url}/v1/responses", headers=headers, timeout=30,
                   json={"model": "native-1", "input": "thanks"})
    assert r.status_code == 200, r.text
    sent = upstream.responses_requests[-1].body["input"]
    assert [(i["type"], i.get("role")) for i in sent] == [
        ("message", "user"), ("message", "assistant"), ("function_call", None), ("message", "assistant"),
        ("function_call_output", None), ("message", "assistant"), ("message", "user")]
