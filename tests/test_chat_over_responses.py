"""Chat-completions clients (the official SDK) on an upstream that speaks only the Responses API:
the assembled conversation goes out as input items, the answer comes back as a chat completion
or chat chunks, and the conversation may move between chat and Responses upstreams. Assertions
are on what the fake upstream received."""

import json

import openai
import pytest

from .conftest import Db, tenant_of
from .fakes import Reply
from .helpers import responses_answer, responses_events, say, system, tool, tool_call, user

TOOLS = [{"type": "function", "function": {"name": "run_sql", "description": "Run one query.", "strict": True,
                                           "parameters": {"type": "object", "properties": {"sql": {"type": "string"}}}}}]


def test_a_tool_round_goes_out_as_items_and_comes_back_as_a_completion(native, upstream, key, cid):
    client = native.openai(key)
    upstream.enqueue(Reply(content=None, tool_calls=[tool_call("call_1")]))
    c1, h1 = say(client, cid, system("Be exact."), user("top customers?"), model="native-1", tools=TOOLS,
                 tool_choice={"type": "function", "function": {"name": "run_sql"}}, max_tokens=50, temperature=0.2,
                 presence_penalty=0, stream_options=None,
                 response_format={"type": "json_schema", "json_schema": {"name": "rows", "schema": {"type": "object"}}})
    request = upstream.responses_requests[-1]
    assert request.path.endswith("/v1/responses") and not upstream.chat_requests
    body = request.body
    assert body["input"] == [{"type": "message", "role": "system", "content": "Be exact."},
                             {"type": "message", "role": "user", "content": "top customers?"}]
    assert body["tools"] == [{"type": "function", "name": "run_sql", "description": "Run one query.", "strict": True,
                              "parameters": TOOLS[0]["function"]["parameters"]}]
    assert body["tool_choice"] == {"type": "function", "name": "run_sql"}
    assert body["text"] == {"format": {"type": "json_schema", "name": "rows", "schema": {"type": "object"}}}
    assert body["max_output_tokens"] == 50 and body["temperature"] == 0.2 and body["store"] is False
    assert not {"messages", "max_tokens", "response_format", "presence_penalty", "stream_options"} & set(body)

    choice = c1.choices[0]
    assert choice.finish_reason == "tool_calls" and c1.object == "chat.completion"
    assert [(c.id, c.function.name, c.function.arguments) for c in choice.message.tool_calls] == \
        [("call_1", "run_sql", '{"sql": "select 1"}')]
    assert (c1.usage.prompt_tokens, c1.usage.completion_tokens, c1.usage.total_tokens) == (11, 7, 18)
    node = native.db.node(h1["x-node-id"])
    assert node["status"] == "success" and node["provider"] == "native" and node["api"] == "chat"
    assert node["received"] == [{"role": "assistant", "content": None, "tool_calls": [tool_call("call_1")]}]
    assert node["usage"]["prompt_tokens"] == 11 and node["finish_reason"] == "tool_calls"

    # the next round carries the call and its result as items
    upstream.enqueue(Reply(content="Three customers."))
    c2, h2 = say(client, cid, tool("call_1", "42 rows"), model="native-1", tools=TOOLS)
    items = upstream.responses_requests[-1].body["input"]
    assert items[2:] == [{"type": "function_call", "call_id": "call_1", "name": "run_sql", "arguments": '{"sql": "select 1"}'},
                         {"type": "function_call_output", "call_id": "call_1", "output": "42 rows"}]
    assert c2.choices[0].message.content == "Three customers." and c2.choices[0].finish_reason == "stop"
    assert h2["x-parent-node-id"] == h1["x-node-id"]

    # the same conversation on a chat upstream reads the same history as messages
    say(client, cid, user("thanks"), model="gpt-4o-mini")
    assert upstream.last.messages == [system("Be exact."), user("top customers?"),
                                      {"role": "assistant", "content": None, "tool_calls": [tool_call("call_1")]},
                                      tool("call_1", "42 rows"), {"role": "assistant", "content": "Three customers."},
                                      user("thanks")]
    # and the exact request of the Responses round replays, verified
    r = native.http(key).get(f"/admin/nodes/{h2['x-node-id']}/request")
    assert r.headers["x-request-verified"] == "true" and r.json()["input"] == items


def test_a_stream_comes_back_as_chat_chunks(native, upstream, key, cid):
    client = native.openai(key)
    stream, h1 = say(client, cid, user("hi"), model="native-1", stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    body = upstream.responses_requests[-1].body
    assert body["stream"] is True and "stream_options" not in body
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "echo: hi"
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens == 11
    node = native.db.node(h1["x-node-id"])
    assert node["status"] == "success" and node["received"] == [{"role": "assistant", "content": "echo: hi"}]

    # a streamed tool call: its id, name and arguments; without include_usage no usage chunk
    upstream.enqueue(Reply(content=None, tool_calls=[tool_call("call_9", args='{"sql": "select 9"}')]))
    stream, h2 = say(client, cid, user("query"), model="native-1", tools=TOOLS, stream=True)
    chunks = list(stream)
    calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or ()]
    assert calls[0].id == "call_9" and calls[0].function.name == "run_sql"
    assert "".join(tc.function.arguments or "" for tc in calls) == '{"sql": "select 9"}'
    assert chunks[-1].choices[0].finish_reason == "tool_calls" and all(c.usage is None for c in chunks)
    assert native.db.node(h2["x-node-id"])["received"][0]["tool_calls"] == [tool_call("call_9", args='{"sql": "select 9"}')]


def test_a_failed_stream_ends_with_the_chat_error_event(native, upstream, key, cid):
    client = native.openai(key)
    upstream.enqueue(Reply(error_event={"code": "server_error", "message": "the model fell over"}))
    stream, h = say(client, cid, user("hi"), model="native-1", stream=True)
    with pytest.raises(openai.APIError):
        list(stream)
    node = native.db.node(h["x-node-id"])
    assert node["status"] == "failed" and "fell over" in json.dumps(node["error"])


@pytest.mark.parametrize(("field", "value"), [("n", 2), ("stop", ["END"]), ("logit_bias", {"50256": -100}),
                                              ("frequency_penalty", 0.5)])
def test_a_field_the_responses_api_cannot_honour_is_refused_before_anything_happens(native, upstream, key, cid, field, value):
    client = native.openai(key)
    with pytest.raises(openai.BadRequestError) as e:
        say(client, cid, user("hi"), model="native-1", extra_body={field: value})
    assert e.value.body["code"] == "invalid_request" and e.value.body["param"] == field
    assert "x-node-id" not in e.value.response.headers and not upstream.responses_requests
    assert native.db.fetchval("SELECT count(*) FROM nodes") == 0


def test_items_sent_whole_without_deltas_still_reach_the_client(native, upstream, key, cid):
    # an upstream that announces each item and only then gives it whole (no delta events)
    def event(kind: str, **data) -> bytes:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode()

    message = {"type": "message", "role": "assistant", "id": "msg_u",
               "content": [{"type": "output_text", "text": "All at once.", "annotations": []}]}
    call = {"type": "function_call", "id": "fc_u", "call_id": "call_w", "name": "run_sql", "arguments": '{"sql": "w"}'}
    final = {"id": "resp_u", "object": "response", "status": "completed", "model": "native-1", "output": [message, call],
             "usage": {"input_tokens": 3, "output_tokens": 4, "total_tokens": 7}}
    events = [event("response.created", response={**final, "status": "in_progress", "output": []}),
              event("response.output_item.added", output_index=0, item={**message, "content": []}),
              event("response.output_item.done", output_index=0, item=message),
              event("response.output_item.added", output_index=1, item={**call, "arguments": ""}),
              event("response.output_item.done", output_index=1, item=call),
              event("response.completed", response=final)]
    upstream.enqueue(Reply(kind="raw", body=b"".join(events), content_type="text/event-stream"))
    stream, h = say(native.openai(key), cid, user("hi"), model="native-1", tools=TOOLS, stream=True)
    chunks = list(stream)
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.content or "" for d in deltas) == "All at once."
    calls = [tc for d in deltas for tc in d.tool_calls or ()]
    assert calls[0].id == "call_w" and "".join(tc.function.arguments or "" for tc in calls) == '{"sql": "w"}'
    stored = native.db.node(h["x-node-id"])["received"]
    assert stored == [{"role": "assistant", "content": "All at once.",
                       "tool_calls": [tool_call("call_w", args='{"sql": "w"}')]}]


def test_compaction_summarises_through_the_responses_api(native, upstream, key, cid):
    client = native.openai(key)
    for i in range(4):
        upstream.enqueue(Reply(content=f"answer {i}"))
        say(client, cid, user(f"question {i}"), model="native-1")
    upstream.enqueue(Reply(content="Facts: four questions were answered."))
    r = native.http(key).post(f"/admin/conversations/{cid}/compact")
    assert r.status_code == 200 and r.json()["compacted"] is True, r.text
    summariser = upstream.responses_requests[-1].body
    assert summariser["store"] is False and "messages" not in summariser
    assert summariser["input"][0]["role"] == "system" and summariser["input"][0]["content"].startswith("You compress")
    assert "question 0" in json.dumps(summariser["input"])
    node = native.db.node(r.json()["node_id"])
    assert node["kind"] == "compaction" and "four questions were answered" in node["sent"][0]["content"]
    # the next call sends the summary and the recent messages as items
    say(client, cid, user("next"), model="native-1")
    items = upstream.responses_requests[-1].body["input"]
    assert "four questions were answered" in items[0]["content"] and items[-1]["content"] == "next"


def test_the_request_fields_translation_table():
    from proxy.dialects.responses.for_chat import request_fields

    fields = request_fields({
        "model": "m", "max_completion_tokens": 90, "reasoning_effort": "low", "verbosity": "high",
        "response_format": {"type": "json_object"}, "seed": 7, "store": True, "stream_options": {"include_usage": True},
        "tool_choice": {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [
            {"type": "function", "function": {"name": "a"}}]}},
        "tools": [{"type": "custom", "custom": {"name": "grep", "description": "search"}},
                  {"type": "function", "function": {"name": "a", "parameters": {"type": "object"}}},
                  {"type": "function", "function": {"name": "b", "strict": True}}],
        "n": 1, "stop": None, "logprobs": False, "include": ["reasoning.encrypted_content"], "future": {"x": 1},
    })
    assert fields == {
        "model": "m", "max_output_tokens": 90, "reasoning": {"effort": "low"},
        "text": {"format": {"type": "json_object"}, "verbosity": "high"},
        "tool_choice": {"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "a"}]},
        "tools": [{"type": "custom", "name": "grep", "description": "search"},
                  {"type": "function", "name": "a", "parameters": {"type": "object"}, "strict": False},  # (chat's default)
                  {"type": "function", "name": "b", "strict": True}],
        "include": ["reasoning.encrypted_content"], "future": {"x": 1}, "store": False,
    }
    assert "format" not in request_fields({"response_format": {"type": "text"}}).get("text", {})
    assert request_fields({"max_tokens": 1})["max_output_tokens"] == 16  # (the API's minimum)


def test_an_app_resending_its_history_is_matched_on_the_answers_stored_from_items(native, upstream, key):
    # full-history mode (/auto/v1): the answer stored from the Responses output must read back as
    # the message the app resends, or every call would start a new root
    client = openai.OpenAI(base_url=f"{native.url}/auto/v1", api_key=key, max_retries=0)
    history = [system("Be brief."), user("first")]
    raw = client.chat.completions.with_raw_response.create(model="native-1", messages=history)
    h1, answer = raw.headers, raw.parse().choices[0].message
    assert h1["x-context-matched"] == "0"
    history += [answer.model_dump(exclude_none=True), user("second")]
    raw = client.chat.completions.with_raw_response.create(model="native-1", messages=history)
    assert raw.headers["x-conversation-id"] == h1["x-conversation-id"]
    assert raw.headers["x-context-matched"] == "2" and raw.headers["x-parent-node-id"] == h1["x-node-id"]
    items = upstream.responses_requests[-1].body["input"]
    assert [i.get("role") for i in items] == ["system", "user", "assistant", "user"]
    assert native.db.node(raw.headers["x-node-id"])["sent"] == [user("second")]


@pytest.mark.parametrize("fields", [{"tools": "not a list"}, {"tools": [5, None, {"type": 3}]}, {"tool_choice": 5},
                                    {"response_format": [1]}, {"response_format": {"type": None}}, {"stop": 5},
                                    {"max_tokens": "many"}, {"n": "2"}, {"logit_bias": [1]}])
def test_odd_fields_are_answered_by_the_upstream_or_refused_never_a_crash(native, upstream, key, cid, fields):
    r = native.http(key).post("/v1/chat/completions", headers={"X-Conversation-Id": cid},
                              json={"model": "native-1", "messages": [user("hi")], **fields})
    assert r.status_code < 500, r.text
    err = r.json().get("error") if r.status_code >= 400 else None
    assert err is None or set(err) == {"message", "type", "param", "code"}


def test_an_upstream_error_fails_the_node_and_names_it(native, upstream, key, cid):
    client = native.openai(key)
    _, h1 = say(client, cid, user("first"), model="native-1")
    upstream.enqueue(Reply(kind="error", status=503))
    with pytest.raises(openai.InternalServerError) as e:
        say(client, cid, user("second"), model="native-1")
    node_id = e.value.response.headers["x-node-id"]
    assert e.value.response.headers["x-parent-node-id"] == h1["x-node-id"]
    node = native.db.node(node_id)
    assert node["status"] == "failed" and node["error"]["status"] == 503
    assert native.db.head(cid) == node_id  # transient: the head rests on the failed node (its items stay)


# -- after a hostile pass: names, reasoning, odd parts, failures, calls naming no conversation ------

CRM = {"type": "namespace", "name": "crm", "description": "CRM tools",
       "tools": [{"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {}}}]}
LOOKUP = {"type": "function_call", "id": "fc_1", "status": "completed", "call_id": "call_n", "namespace": "crm",
          "name": "lookup", "arguments": "{}"}


def test_a_namespaced_call_has_one_name_streamed_or_whole_and_goes_back_with_its_namespace(native, upstream, key, cid):
    upstream.enqueue(Reply(kind="raw", content_type="text/event-stream", body=responses_events(
        {"type": "response.created", "response": responses_answer([], status="in_progress")},
        {"type": "response.output_item.added", "output_index": 0, "item": {**LOOKUP, "arguments": ""}},
        {"type": "response.function_call_arguments.delta", "output_index": 0, "delta": "{}"},
        {"type": "response.output_item.done", "output_index": 0, "item": LOOKUP},
        {"type": "response.completed", "response": responses_answer([LOOKUP])})))
    client = native.openai(key)
    stream, _ = say(client, cid, user("find"), model="native-1", tools=[CRM], stream=True)
    names = [tc.function.name for c in stream if c.choices for tc in c.choices[0].delta.tool_calls or ()
             if tc.function and tc.function.name]
    assert names == ["crm__lookup"]  # (as the whole answer and the stored message name it)
    upstream.enqueue(Reply(content="found it"))
    say(client, cid, {"role": "tool", "tool_call_id": "call_n", "content": "found"}, model="native-1", tools=[CRM])
    call = next(i for i in upstream.responses_requests[-1].body["input"] if i.get("type") == "function_call")
    assert (call["namespace"], call["name"], call["call_id"]) == ("crm", "lookup", "call_n")


REASONING_TEXT = {"type": "reasoning", "id": "rs_1", "summary": [],
                  "content": [{"type": "reasoning_text", "text": "Step one."}]}
DONE = {"type": "message", "id": "m", "role": "assistant", "status": "completed",
        "content": [{"type": "output_text", "text": "Done.", "annotations": []}]}


def test_raw_reasoning_text_is_the_answers_reasoning_content_streamed_whole_and_stored(native, upstream, key, cid,
                                                                                      fresh_database_url):
    """A server that shows the model's reasoning itself (gpt-oss's reasoning_text, no summary)."""
    upstream.enqueue(Reply(kind="raw", body=json.dumps(responses_answer([REASONING_TEXT, DONE])).encode()))
    whole, h = say(native.openai(key), cid, user("hi"), model="native-1")
    assert whole.choices[0].message.reasoning_content == "Step one."
    assert Db(fresh_database_url).node(h["x-node-id"])["received"][0]["reasoning_content"] == "Step one."


def test_an_image_url_given_as_a_plain_string(native, upstream, key, cid):
    r = native.http(key).post("/v1/chat/completions", headers={"X-Conversation-Id": cid}, json={
        "model": "native-1", "messages": [user([{"type": "text", "text": "see"},
                                                {"type": "image_url", "image_url": "https://x/y.png"}])]})
    assert r.status_code == 200, r.text
    assert upstream.responses_requests[-1].body["input"][0]["content"][1] == {
        "type": "input_image", "image_url": "https://x/y.png", "detail": "auto"}


def test_a_failed_response_with_status_200_is_an_error_body_only(native, upstream, key, cid):
    upstream.enqueue(Reply(kind="raw", body=json.dumps(responses_answer([], status="failed", error={
        "code": "server_error", "message": "The model failed."})).encode()))
    r = native.http(key).post("/v1/chat/completions", headers={"X-Conversation-Id": cid},
                              json={"model": "native-1", "messages": [user("hi")]})
    assert r.status_code >= 500 and set(r.json()) == {"error"} and r.json()["error"]["message"] == "The model failed."


@pytest.mark.parametrize("stream", [False, True])
def test_a_chat_call_naming_no_conversation_is_translated_for_a_responses_upstream(native, upstream, key, stream,
                                                                                   fresh_database_url):
    """A model only the Responses API serves (gpt-5-codex, gpt-5-pro): a pass-through to its
    chat endpoint could only fail. Translated and answered; nothing stored."""
    client = openai.OpenAI(base_url=f"{native.url}/v1", api_key=key, max_retries=0)
    upstream.enqueue(Reply(content="translated"))
    answer = client.chat.completions.create(model="native-1", messages=[user("hi")], stream=stream)
    text = "".join(c.choices[0].delta.content or "" for c in answer if c.choices) if stream \
        else answer.choices[0].message.content
    assert text == "translated"
    assert upstream.responses_requests[-1].body["input"][-1]["content"] == "hi"
    assert [r.path for r in upstream.requests if r.path.endswith("/chat/completions")] == []
    assert Db(fresh_database_url).fetchval("SELECT count(*) FROM nodes WHERE tenant = $1", tenant_of(key)) == 0

