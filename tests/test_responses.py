"""The Responses API on the tree, driven by the official openai SDK: stored calls, branching with
previous_response_id, translation over a chat upstream (plain, streamed, tools, formats), a native
Responses upstream, retrieval, input items, deletion, tenancy -- asserted on what the fake
upstream received."""

import json
import uuid

import httpx
import openai
import pytest

from .conftest import new_key
from .fakes import Reply
from .helpers import MODEL, tool_call

WEATHER_TOOL = {"type": "function", "name": "weather", "description": "The weather in a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def raw_create(client, **kw):
    raw = client.responses.with_raw_response.create(**{"model": MODEL, **kw})
    return raw.parse(), raw.headers


def test_a_stored_response_and_its_continuation(proxy, upstream, key, cid, db):
    client = proxy.openai(key, conversation=cid)
    first, h1 = raw_create(client, input="What is the capital of France?")
    assert first.id == "resp_" + uuid.UUID(h1["x-node-id"]).hex and first.object == "response"
    assert first.status == "completed" and first.output_text == "echo: What is the capital of France?"
    assert h1["x-conversation-id"] == cid and h1["x-parent-node-id"] == "root"
    assert upstream.last.messages == [{"role": "user", "content": "What is the capital of France?"}]
    node = db.node(h1["x-node-id"])
    assert node["api"] == "responses" and node["kind"] == "turn" and node["status"] == "success"
    assert node["sent"] == [{"type": "message", "role": "user", "content": "What is the capital of France?"}]
    assert node["received"][0]["type"] == "message" and node["usage"]["input_tokens"] > 0
    # continuing: the conversation's head (delta), or explicitly from the first response
    second, h2 = raw_create(client, input="And of Italy?", previous_response_id=first.id)
    assert h2["x-parent-node-id"] == h1["x-node-id"] and second.previous_response_id == first.id
    assert [m["content"] for m in upstream.last.messages] == [
        "What is the capital of France?", "echo: What is the capital of France?", "And of Italy?"]
    assert db.head(cid) == h2["x-node-id"]


def test_previous_response_id_alone_continues_and_branches(proxy, upstream, key, cid, db):
    named = proxy.openai(key, conversation=cid)
    first, h1 = raw_create(named, input="one")
    second, _ = raw_create(named, input="two")
    plain = proxy.openai(key)  # no conversation named: the previous response's conversation
    branch, hb = raw_create(plain, input="two, edited", previous_response_id=first.id)
    assert hb["x-conversation-id"] == cid and hb["x-parent-node-id"] == h1["x-node-id"]
    assert "two" not in [m["content"] for m in upstream.last.messages]  # the other branch is not context
    assert db.head(cid) == hb["x-node-id"]  # a turn like any other
    # a response that names no conversation and continues nothing stored passes through
    passed, hp = raw_create(plain, input="just passing")
    assert passed.id == "resp_upstream_fake" and "x-node-id" not in hp
    assert upstream.responses_requests[-1].body["input"] == "just passing"


def test_another_tenants_response_is_not_found(proxy, upstream, key, cid):
    first, _ = raw_create(proxy.openai(key, conversation=cid), input="private")
    stranger = proxy.openai(new_key())
    for client in (stranger, proxy.openai(new_key(), conversation=cid)):
        with pytest.raises(openai.NotFoundError) as e:
            client.responses.create(model=MODEL, input="peek", previous_response_id=first.id)
        assert e.value.body["code"] == "node_not_found"
    with pytest.raises(openai.NotFoundError):
        stranger.responses.retrieve(first.id)
    # the same tenant's response from another conversation than the one named: 404, pointing at
    # the field the client sent (not at a header it never did)
    with pytest.raises(openai.NotFoundError) as e:
        proxy.openai(key, conversation=f"{cid}-other").responses.create(model=MODEL, input="x",
                                                                        previous_response_id=first.id)
    assert e.value.body["code"] == "node_not_found" and e.value.body["param"] == "previous_response_id"


def test_instructions_are_the_system_message(proxy, upstream, key, cid, db):
    client = proxy.openai(key, conversation=cid)
    raw_create(client, input="hi", instructions="Answer in French.")
    assert upstream.last.messages[0] == {"role": "system", "content": "Answer in French."}
    raw_create(client, input="and again")  # no instructions: the path's system prompt still applies
    assert upstream.last.messages[0] == {"role": "system", "content": "Answer in French."}
    assert [m["role"] for m in upstream.last.messages] == ["system", "user", "assistant", "user"]


def test_a_function_tool_round_trip_over_a_chat_upstream(proxy, upstream, key, cid, db):
    client = proxy.openai(key, conversation=cid)
    upstream.enqueue(Reply(content=None, tool_calls=[tool_call("call_1", "weather", '{"city": "Paris"}')]))
    first, _ = raw_create(client, input="Weather in Paris?", tools=[WEATHER_TOOL], tool_choice="auto",
                          text={"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}}})
    sent = upstream.last.body
    assert sent["tools"] == [{"type": "function", "function": {k: WEATHER_TOOL[k] for k in ("name", "description", "parameters")}}]
    assert sent["tool_choice"] == "auto"
    assert sent["response_format"] == {"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object"}}}
    call = next(o for o in first.output if o.type == "function_call")
    assert call.call_id == "call_1" and call.name == "weather" and json.loads(call.arguments) == {"city": "Paris"}
    upstream.enqueue(Reply(content="It is 21 C in Paris."))
    second, _ = raw_create(client, previous_response_id=first.id, tools=[WEATHER_TOOL],
                           input=[{"type": "function_call_output", "call_id": "call_1", "output": "21 C"}])
    assert second.output_text == "It is 21 C in Paris."
    messages = upstream.last.messages
    assert messages[1]["tool_calls"][0]["id"] == "call_1" and messages[2] == {"role": "tool", "tool_call_id": "call_1",
                                                                             "content": "21 C"}


@pytest.mark.parametrize("part", [
    {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="},
    {"type": "input_file", "filename": "a.pdf", "file_data": "data:application/pdf;base64,JVBERi0xLjQK"},
])
def test_an_image_or_file_a_tool_returned_reaches_a_chat_upstream_as_text(mproxy, upstream, claude, key, cid, part):
    """The Agents SDK's ToolOutputImage: a function_call_output of an input_text and an image (or
    a file). A chat tool message takes text only -- OpenAI refuses it, and every later call, which
    resends it -- so a chat upstream gets a line saying what was there, as a Messages client's
    image in a tool result; an Anthropic upstream still gets it, in its tool result."""
    client = mproxy.openai(key, conversation=cid)
    upstream.enqueue(Reply(content=None, tool_calls=[tool_call("call_1", "weather", '{"city": "Paris"}')]))
    raw_create(client, input="Screenshot the weather in Paris", tools=[WEATHER_TOOL])
    output = [{"type": "input_text", "text": "the screen:"}, part]
    raw_create(client, tools=[WEATHER_TOOL], input=[{"type": "function_call_output", "call_id": "call_1", "output": output}])
    tool_message = upstream.last.messages[-1]
    assert tool_message["role"] == "tool" and tool_message["tool_call_id"] == "call_1"
    assert isinstance(tool_message["content"], str) and tool_message["content"].startswith("the screen:")
    assert ("image/png" if part["type"] == "input_image" else "a.pdf") in tool_message["content"]
    assert "base64" not in json.dumps(tool_message)
    raw_create(client, model="claude-x", input="and now?")
    result = claude.last.body["messages"][2]["content"][0]
    assert result["type"] == "tool_result" and result["tool_use_id"] == "call_1"
    assert [b["type"] for b in result["content"]] == ["text", "image" if part["type"] == "input_image" else "document"]


def test_streamed_responses_over_a_chat_upstream(proxy, upstream, key, cid, db):
    client = proxy.openai(key, conversation=cid)
    upstream.enqueue(Reply(content="Streaming works.", pieces=["Stream", "ing ", "works."]))
    with client.responses.stream(model=MODEL, input="stream please") as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert kinds.count("response.output_text.delta") == 3 and "response.output_item.done" in kinds
    assert final.output_text == "Streaming works." and final.usage.input_tokens > 0
    node = db.node(uuid.UUID(final.id[5:]))
    assert node["status"] == "success" and node["received"][0]["content"][0]["text"] == "Streaming works."
    assert upstream.last.body["stream"] is True
    # a tool call streams as function_call events
    upstream.enqueue(Reply(content=None, tool_calls=[tool_call("call_s", "weather", '{"city": "Oslo"}')]))
    with client.responses.stream(model=MODEL, input="weather?", tools=[WEATHER_TOOL]) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert "response.function_call_arguments.delta" in kinds and "response.function_call_arguments.done" in kinds
    assert final.output[0].type == "function_call" and json.loads(final.output[0].arguments) == {"city": "Oslo"}


def _sse(*deltas, finish="stop"):
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": MODEL}
    events = [{**chunk, "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
    events.append({**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"


@pytest.mark.parametrize("deltas, types", [
    ([{"reasoning_content": "Let me "}, {"reasoning_content": "think."}, {"content": "Done."}], ["reasoning", "message"]),
    # reasoning whose end looks like the start of the client's key: held back until the answer ends
    ([{"reasoning_content": "Let me think: s"}, {"content": "Done."}], ["reasoning", "message"]),
    # a call before the text: announced first, so first in the response too (a chat upstream gets
    # them back as one assistant message all the same)
    ([{"tool_calls": [{"index": 0, "id": "call_t", "type": "function", "function": {"name": "weather", "arguments": ""}}]},
      {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": "Oslo"}'}}]}, {"content": "Checking."}],
     ["function_call", "message"]),
    ([{"role": "assistant", "content": ""}, {"refusal": "I can't "}, {"refusal": "help with that."}], ["message"]),
])
def test_a_streams_items_are_the_final_responses_and_the_stored_ones(proxy, upstream, key, cid, deltas, types):
    """Over a chat upstream, what the events say -- each item with its id, reasoning as a reasoning
    item, a refusal as a refusal part -- is what the completed response and a later GET say, each
    item at its output_index (its place in the response's output, as OpenAI's are): a client that
    keeps the items as streamed, by index, holds the answer as stored."""
    client = proxy.openai(key, conversation=cid)
    upstream.enqueue(Reply(kind="raw", body=_sse(*deltas), content_type="text/event-stream"))
    with client.responses.stream(model=MODEL, input="go", tools=[WEATHER_TOOL]) as stream:
        events = list(stream)
        final = stream.get_final_response()
    done = {e.output_index: e.item for e in events if e.type == "response.output_item.done"}
    added = {e.output_index: e.item.id for e in events if e.type == "response.output_item.added"}
    assert [i.type for i in final.output] == types
    finals = {i.id: i.model_dump(exclude_none=True) for i in final.output}
    assert {d.id: d.model_dump(exclude_none=True) for d in done.values()} == finals
    assert [done[k].id for k in sorted(done)] == [added[k] for k in sorted(added)] == [i.id for i in final.output]
    numbers = [e.sequence_number for e in events]
    assert numbers == list(range(len(numbers)))
    stored = client.responses.retrieve(final.id)
    assert [i.model_dump(exclude_none=True) for i in stored.output] == [i.model_dump(exclude_none=True) for i in final.output]
    kinds = [e.type for e in events]
    if types[0] == "reasoning":
        assert "response.reasoning_summary_text.delta" in kinds
        assert final.output[0].summary[0].text == "".join(d["reasoning_content"] for d in deltas if "reasoning_content" in d)
    if any("refusal" in d for d in deltas):
        assert kinds.count("response.refusal.delta") == 2 and "response.output_text.delta" not in kinds
        assert final.output[0].content[0].type == "refusal"
        assert final.output[0].content[0].refusal == "I can't help with that."


def _streamed_done_items(client, **create) -> tuple[str, list[dict]]:
    """A streamed Responses call's node and its output items as the stream finished them
    (``output_item.done``), in output_index order: what a client keeping them resends."""
    with client.responses.with_streaming_response.create(model=MODEL, stream=True, **create) as r:
        node = r.headers["x-node-id"]
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    done = sorted((e for e in events if e["type"] == "response.output_item.done"), key=lambda e: e["output_index"])
    return node, [e["item"] for e in done]


@pytest.mark.parametrize("order", ["streamed", "message_first"])
def test_a_streamed_call_before_its_text_resent_whole_keeps_its_tool_round(proxy, upstream, order):
    """A chat upstream streamed a call, then text: the call is output_index 0, the message 1. A
    full-history client resends the items in that order (or the message first, as a whole answer
    has them), then the call's result: the message and its calls are one assistant message -- read
    as two, the pairing check dropped the call and its result, and the history matched nothing."""
    client = openai.OpenAI(base_url=f"{proxy.url}/auto/v1", api_key=new_key(), max_retries=0)
    upstream.enqueue(Reply(kind="raw", content_type="text/event-stream", body=_sse(
        {"tool_calls": [{"index": 0, "id": "call_t", "type": "function", "function": {"name": "weather",
                                                                                       "arguments": '{"city": "Oslo"}'}}]},
        {"content": "Checking."}, finish="tool_calls")))
    question = {"role": "user", "content": "Weather in Oslo?"}
    first_node, items = _streamed_done_items(client, input=[question], tools=[WEATHER_TOOL])
    assert [i["type"] for i in items] == ["function_call", "message"]
    if order == "message_first":
        items.reverse()
    result = {"type": "function_call_output", "call_id": "call_t", "output": "-3 C"}
    _, h2 = raw_create(client, input=[question, *items, result], tools=[WEATHER_TOOL])
    assert h2["x-parent-node-id"] == first_node and h2["x-context-matched"] == "2"
    sent = upstream.last.messages
    assert [m["role"] for m in sent] == ["user", "assistant", "tool"]
    assert sent[1]["content"] == "Checking." and [c["id"] for c in sent[1]["tool_calls"]] == ["call_t"]
    assert sent[2] == {"role": "tool", "tool_call_id": "call_t", "content": "-3 C"}


@pytest.mark.parametrize("with_call", [True, False])
def test_streamed_text_parted_by_reasoning_resent_whole_matches_its_answer(proxy, upstream, with_call):
    """A chat upstream streamed reasoning, text, more reasoning, more text (and a call): the
    second reasoning and the text after it are items of their own in the stream (``rs_<node>_2``,
    ``msg_<node>_3``). A full-history client that keeps the items as streamed (Codex keeps each
    ``output_item.done``) resends them: the second message item is its answer's, as after a call --
    read as an assistant message of its own, the history matched nothing and every such turn began
    a new root, the model reading the answer as two."""
    client = openai.OpenAI(base_url=f"{proxy.url}/auto/v1", api_key=new_key(), max_retries=0)
    deltas = [{"reasoning_content": "one"}, {"content": "Text one."}, {"reasoning_content": "two"}, {"content": " Text two."}]
    if with_call:
        deltas.append({"tool_calls": [{"index": 0, "id": "call_t", "type": "function",
                                       "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}]})
    upstream.enqueue(Reply(kind="raw", content_type="text/event-stream",
                           body=_sse(*deltas, finish="tool_calls" if with_call else "stop")))
    question = {"role": "user", "content": f"Weather in Oslo? {uuid.uuid4().hex[:6]}"}
    first_node, items = _streamed_done_items(client, input=[question], tools=[WEATHER_TOOL])
    assert [i["type"] for i in items][:4] == ["reasoning", "message", "reasoning", "message"]
    after = [{"type": "function_call_output", "call_id": "call_t", "output": "-3 C"}] if with_call else \
        [{"role": "user", "content": "And tomorrow?"}]
    _, h2 = raw_create(client, input=[question, *items, *after], tools=[WEATHER_TOOL])
    assert h2["x-parent-node-id"] == first_node and h2["x-context-matched"] == "2"
    sent = upstream.last.messages
    assert [m["role"] for m in sent] == ["user", "assistant", "tool" if with_call else "user"]
    assert sent[1]["content"] == "Text one. Text two."


def test_the_next_answers_call_after_a_joined_message_is_its_own(proxy, upstream):
    """Items resent call, result, message (the message joins its answer's call, as stored), then
    the next answer's call and its result: that call is the next answer's -- it was appended to the
    joined message, before the first call's result, so the history matched nothing and the model
    read both calls as asked before either result came."""
    client = openai.OpenAI(base_url=f"{proxy.url}/auto/v1", api_key=new_key(), max_retries=0)
    upstream.enqueue(Reply(kind="raw", content_type="text/event-stream", body=_sse(
        {"tool_calls": [{"index": 0, "id": "call_t", "type": "function", "function": {"name": "weather",
                                                                                       "arguments": '{"city": "Oslo"}'}}]},
        {"content": "Checking."}, finish="tool_calls")))
    question = {"role": "user", "content": f"Weather in Oslo? {uuid.uuid4().hex[:6]}"}
    _, (call, message) = _streamed_done_items(client, input=[question], tools=[WEATHER_TOOL])
    result = {"type": "function_call_output", "call_id": "call_t", "output": "-3 C"}
    upstream.enqueue(Reply(content=None, tool_calls=[tool_call("call_m", "weather", '{"city": "Bergen"}')]))
    second, h2 = raw_create(client, input=[question, call, result, message], tools=[WEATHER_TOOL])
    next_call = next(i.model_dump(exclude_none=True) for i in second.output if i.type == "function_call")
    upstream.enqueue(Reply(content="Done."))
    _, h3 = raw_create(client, input=[question, call, result, message, next_call,
                                      {"type": "function_call_output", "call_id": "call_m", "output": "5 C"}],
                       tools=[WEATHER_TOOL])
    assert h3["x-parent-node-id"] == h2["x-node-id"] and h3["x-context-matched"] == "4"
    sent = upstream.last.messages
    assert [m["role"] for m in sent] == ["user", "assistant", "tool", "assistant", "tool"]
    assert [c["id"] for c in sent[1]["tool_calls"]] == ["call_t"] and [c["id"] for c in sent[3]["tool_calls"]] == ["call_m"]


def test_a_streamed_calls_ids_do_not_depend_on_the_chat_upstreams_index_numbering(proxy, upstream, key, cid):
    """A chat upstream that numbers its calls from 1 (its text was 0, as servers relaying
    Anthropic's content blocks do) and sends no call ids: the streamed items had ids and call ids
    made from that index (``fc_<node>_1``, ``call_<node>_1``), the completed response and the
    stored answer from the call's place (``_0``) -- the SDK's accumulator saw an item change its
    id, and the client answered ``call_<node>_1``, which pairs with nothing stored: the pairing
    check dropped the call and its result, the model never saw the tool round."""
    client = proxy.openai(key, conversation=cid)
    upstream.enqueue(Reply(kind="raw", content_type="text/event-stream", body=_sse(
        {"role": "assistant", "content": "Checking."},
        {"tool_calls": [{"index": 1, "type": "function", "function": {"name": "weather", "arguments": ""}},
                        {"index": 2, "type": "function", "function": {"name": "weather", "arguments": ""}}]},
        {"tool_calls": [{"index": 1, "function": {"arguments": '{"city": "Oslo"}'}}]},
        {"tool_calls": [{"index": 2, "function": {"arguments": '{"city": "Rome"}'}}]}, finish="tool_calls")))
    with client.responses.stream(model=MODEL, input="weather?", tools=[WEATHER_TOOL]) as stream:
        events = list(stream)
        final = stream.get_final_response()
    done = [e.item for e in sorted((e for e in events if e.type == "response.output_item.done"), key=lambda e: e.output_index)]
    assert [(i.id, getattr(i, "call_id", None)) for i in done] == [(i.id, getattr(i, "call_id", None)) for i in final.output]
    calls = [i for i in done if i.type == "function_call"]
    assert len(calls) == 2 and len({c.call_id for c in calls}) == 2
    upstream.enqueue(Reply(content="Cold and warm."))
    client.responses.create(model=MODEL, tools=[WEATHER_TOOL], input=[
        {"type": "function_call_output", "call_id": c.call_id, "output": f"result {n}"} for n, c in enumerate(calls)])
    sent = upstream.last.messages
    assert [m["role"] for m in sent] == ["user", "assistant", "tool", "tool"]
    assert [c["id"] for c in sent[1]["tool_calls"]] == [c.call_id for c in calls]
    assert [m["tool_call_id"] for m in sent[2:]] == [c.call_id for c in calls]


def test_a_failure_mid_stream_ends_with_response_failed(proxy, upstream, key, cid, db):
    client = proxy.openai(key, conversation=cid)
    upstream.enqueue(Reply(pieces=["part"], error_event={"message": "upstream broke", "type": "server_error"}))
    with client.responses.with_streaming_response.create(model=MODEL, input="go", stream=True) as r:
        node = r.headers["x-node-id"]
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    kinds = [e["type"] for e in events]
    assert kinds[0] == "response.created" and kinds[-2:] == ["response.failed", "error"]
    assert events[-2]["response"]["status"] == "failed"
    # the event had no code: the node's says a stream error -- no HTTP status said it (it came with a 200)
    assert events[-1]["code"] == "stream_error" and events[-2]["response"]["error"]["code"] == "stream_error"
    stored = db.node(node)
    assert stored["status"] == "failed" and stored["error"]["code"] == "stream_error" and stored["error"]["status"] is None
    upstream.enqueue(Reply(kind="error", status=503))
    with pytest.raises(openai.InternalServerError):
        client.responses.create(model=MODEL, input="fails")


def test_retrieve_input_items_and_delete(proxy, upstream, key, cid, db):
    client = proxy.openai(key, conversation=cid)
    first, _ = raw_create(client, input=[{"role": "user", "content": "a"}, {"role": "user", "content": "b"},
                                         {"role": "user", "content": "c"}], instructions="Be brief.")
    second, h2 = raw_create(client, input="d")
    got = client.responses.retrieve(first.id)
    assert got.id == first.id and got.output_text == first.output_text and got.instructions == "Be brief."
    page = client.responses.input_items.list(first.id, limit=2, order="asc")
    assert [i.content[0].text for i in page.data] == ["a", "b"] and page.has_more
    rest = client.responses.input_items.list(first.id, limit=2, order="asc", after=page.data[-1].id)
    assert [i.content[0].text for i in rest.data] == ["c"] and not rest.has_more
    assert [i.content[0].text for i in client.responses.input_items.list(first.id).data] == ["c", "b", "a"]
    # the first response is context of the second: withdrawn, never cut out of the tree
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=MODEL, input="x", previous_response_id=first.id)
    for where in (f"{cid}-elsewhere", cid):  # nor its items, from anywhere -- its own conversation too
        with pytest.raises(openai.NotFoundError) as e:
            proxy.openai(key, conversation=where).responses.create(
                model=MODEL, input=[{"type": "item_reference", "id": first.output[0].id}])
        assert e.value.body["code"] == "item_not_found"
    with pytest.raises(openai.NotFoundError):  # (nor through a response after it)
        proxy.openai(key).responses.create(model=MODEL, previous_response_id=second.id,
                                           input=[{"type": "item_reference", "id": first.output[0].id}])
    raw_create(client, input="e")  # the withdrawn response's items are still this call's context
    assert [m["content"] for m in upstream.last.messages][:4] == ["Be brief.", "a", "b", "c"]
    # a leaf nobody needs goes with its node
    third, h3 = raw_create(client, input="side", extra_headers={"X-Node-Kind": "transform"})
    client.responses.delete(third.id)
    assert db.fetchval("SELECT count(*) FROM nodes WHERE id = $1", uuid.UUID(h3["x-node-id"])) == 0


def test_a_deleted_conversations_responses_are_gone_though_its_fork_keeps_their_nodes(proxy, upstream, key, cid):
    """Deleting a conversation deletes its responses: one whose node a fork still needs (its
    context) is withdrawn -- not retrievable, not continuable -- and the fork goes on with it."""
    client, http = proxy.openai(key, conversation=cid), proxy.http(key)
    first, _ = raw_create(client, input="shared question")
    http.post(f"/admin/conversations/{cid}/fork", json={"conversation_id": f"{cid}-f"}).raise_for_status()
    assert http.delete(f"/admin/conversations/{cid}").json()["nodes_kept"] == 1
    bare = proxy.openai(key)
    with pytest.raises(openai.NotFoundError):
        bare.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError) as e:
        bare.responses.create(model=MODEL, input="go on", previous_response_id=first.id)
    assert e.value.body["code"] == "node_not_found" and cid not in e.value.message
    sent = len(upstream.requests)
    with pytest.raises(openai.NotFoundError) as e:  # its answer is not sent anywhere again
        proxy.openai(key, conversation=f"{cid}-other").responses.create(
            model=MODEL, input=[{"type": "item_reference", "id": first.output[0].id}, {"role": "user", "content": "?"}])
    assert e.value.body["code"] == "item_not_found" and len(upstream.requests) == sent
    raw_create(proxy.openai(key, conversation=f"{cid}-f"), input="the fork goes on")
    assert [m["content"] for m in upstream.last.messages][0] == "shared question"


def test_chat_and_responses_mix_in_one_conversation(proxy, upstream, key, cid, db):
    client = proxy.openai(key, conversation=cid)
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "chat first"}])
    response, _ = raw_create(client, input="then a response")
    assert [m["content"] for m in upstream.last.messages] == ["chat first", "echo: chat first", "then a response"]
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "chat again"}])
    assert [m["content"] for m in upstream.last.messages] == [
        "chat first", "echo: chat first", "then a response", response.output_text, "chat again"]
    path = proxy.http(key).get(f"/admin/conversations/{cid}/path").json()["data"]
    assert [n["api"] for n in path] == ["chat", "responses", "chat"]


def test_full_history_responses_through_auto(proxy, upstream):
    client = openai.OpenAI(base_url=f"{proxy.url}/auto/v1", api_key=new_key(), max_retries=0)
    first, h1 = raw_create(client, input=[{"role": "user", "content": "first question"}])
    history = [{"role": "user", "content": "first question"}, *[o.model_dump(exclude_none=True) for o in first.output],
               {"role": "user", "content": "second question"}]
    second, h2 = raw_create(client, input=history)
    assert h2["x-conversation-id"] == h1["x-conversation-id"] and h2["x-context-matched"] == "2"
    assert h2["x-parent-node-id"] == h1["x-node-id"]
    assert [m["content"] for m in upstream.last.messages] == ["first question", first.output_text, "second question"]


@pytest.mark.parametrize("order", ["grouped", "interleaved"])
def test_parallel_calls_resent_each_with_its_result_match_as_one_answer(proxy, upstream, order):
    """OpenAI's function-calling guide appends each call of an answer, then its result: the
    answer's calls -- told apart from a later answer's by their ids -- are still one answer, and
    the resent history matches it (not a conversation of its own)."""
    client = openai.OpenAI(base_url=f"{proxy.url}/auto/v1", api_key=new_key(), max_retries=0)
    upstream.enqueue(Reply(content=None, tool_calls=[tool_call("call_a", "f", '{"x": 1}'),
                                                     tool_call("call_b", "g", '{"y": 2}')]))
    first, h1 = raw_create(client, input=[{"role": "user", "content": "do both"}], store=False)
    calls = [o.model_dump(exclude_none=True) for o in first.output]
    results = [{"type": "function_call_output", "call_id": c["call_id"], "output": f"done {c['name']}"} for c in calls]
    resent = [*calls, *results] if order == "grouped" else [calls[0], results[0], calls[1], results[1]]
    second, h2 = raw_create(client, input=[{"role": "user", "content": "do both"}, *resent], store=False)
    assert h2["x-conversation-id"] == h1["x-conversation-id"] and h2["x-context-matched"] == "2"
    assert h2["x-parent-node-id"] == h1["x-node-id"]
    sent = upstream.last.messages
    assert [m["role"] for m in sent] == ["user", "assistant", "tool", "tool"]
    assert [c["id"] for c in sent[1]["tool_calls"]] == ["call_a", "call_b"]
    # a later answer's call after a result is an answer of its own
    upstream.enqueue(Reply(content=None, tool_calls=[tool_call("call_c", "f", '{"x": 3}')]))
    third, h3 = raw_create(client, input=[{"role": "user", "content": "do both"}, *resent], store=False)
    later = [o.model_dump(exclude_none=True) for o in third.output]
    _, h4 = raw_create(client, store=False, input=[
        {"role": "user", "content": "do both"}, *resent, *later,
        {"type": "function_call_output", "call_id": later[0]["call_id"], "output": "done c"}])
    assert h4["x-parent-node-id"] == h3["x-node-id"]
    assert [m["role"] for m in upstream.last.messages] == ["user", "assistant", "tool", "tool", "assistant", "tool"]


def test_the_tree_previews_an_answer_that_begins_with_its_reasoning(native, upstream, key, cid):
    client = native.openai(key, conversation=cid)
    reasoning = {"id": "rs_1", "type": "reasoning", "summary": [], "encrypted_content": "gAAAA-secret"}
    upstream.enqueue(Reply(content="the answer itself", extra_message={"reasoning_item": reasoning}))
    response = client.responses.create(model="native-1", input="think first")
    assert [o.type for o in response.output] == ["reasoning", "message"]
    tree = native.http(key).get(f"/admin/conversations/{cid}/tree").json()["data"]
    assert [n["preview"] for n in tree] == ["the answer itself"]


def test_a_responses_upstream_gets_the_assembled_input_natively(native, upstream, key, cid):
    client = native.openai(key, conversation=cid)
    reasoning = {"id": "rs_1", "type": "reasoning", "summary": [], "encrypted_content": "gAAAA-secret"}
    upstream.enqueue(Reply(content="first answer", extra_message={"reasoning_item": reasoning}))
    first = client.responses.create(model="native-1", input="one", instructions="Be exact.", store=True)
    request = upstream.responses_requests[-1].body
    assert request["store"] is False and "previous_response_id" not in request and request["model"] == "native-1"
    assert request["input"] == [{"type": "message", "role": "system", "content": "Be exact."},
                                {"type": "message", "role": "user", "content": "one"}]
    assert first.id.startswith("resp_") and first.id != "resp_upstream_fake" and first.store is True
    second = client.responses.create(model="native-1", input="two", previous_response_id=first.id)
    request = upstream.responses_requests[-1].body
    assert "previous_response_id" not in request and request["store"] is False
    kinds = [i.get("type") for i in request["input"]]
    assert kinds == ["message", "message", "reasoning", "message", "message"]
    assert request["input"][2]["encrypted_content"] == "gAAAA-secret"  # back to the provider that made it
    assert request["input"][3] == {"type": "message", "role": "assistant",
                                   "content": [{"type": "output_text", "text": "first answer", "annotations": []}]}
    assert second.previous_response_id == first.id
    # the same conversation on a chat upstream: the encrypted reasoning stays behind
    client.responses.create(model="gpt-4o-mini", input="three")
    assert "gAAAA-secret" not in json.dumps(upstream.last.body)
    with client.responses.stream(model="native-1", input="four") as stream:
        final = stream.get_final_response()
    assert final.id.startswith("resp_") and final.id != "resp_upstream_fake" and final.output_text.startswith("echo")
    node = native.db.node(uuid.UUID(final.id[5:]))
    assert node["status"] == "success" and node["received"][0]["type"] == "message"


@pytest.mark.parametrize("stream", [False, True])
def test_a_responses_upstreams_tool_call_is_stored_finished_by_tool_calls(native, upstream, key, cid, stream):
    """A node's finish reason is chat's terms whatever the APIs: a Responses client's answer from a
    Responses upstream that calls a function is ``tool_calls``, as the same answer is through a chat
    client or over a chat upstream -- it was ``stop`` (the admin API's and the viewer's "finish"),
    beside ``tool_calls`` on every other node of a tool round (found driving Cline's ``openai-native``
    provider, the AI SDK's Responses model, against a ``native-*`` model)."""
    client = native.openai(key, conversation=cid)
    tools = [{"type": "function", "name": "read_files", "parameters": {"type": "object", "properties": {}}}]
    upstream.enqueue(Reply(content=None, tool_calls=[tool_call("call_1", "read_files", "{}")]), Reply(content="done"))
    if stream:
        with client.responses.stream(model="native-1", input="read it", tools=tools) as events:
            first = events.get_final_response()
    else:
        first = client.responses.create(model="native-1", input="read it", tools=tools)
    assert [o.type for o in first.output] == ["function_call"]
    second = client.responses.create(model="native-1", previous_response_id=first.id, tools=tools, input=[
        {"type": "function_call_output", "call_id": "call_1", "output": "ok"}])
    assert native.db.node(uuid.UUID(first.id[5:]))["finish_reason"] == "tool_calls"
    assert native.db.node(uuid.UUID(second.id[5:]))["finish_reason"] == "stop"


def test_an_image_by_file_id_reaches_chat_and_anthropic_as_a_line_and_a_responses_upstream_as_it_came(
        mproxy, upstream, claude, key, cid):
    """An input_image by OpenAI file id is nothing a chat model or Anthropic can fetch: it reaches
    them as a line naming it -- before, its id went as the URL ``file:<id>``, which both refuse,
    on every later call of the conversation -- and a Responses upstream as the client sent it."""
    client = mproxy.openai(key, conversation=cid)
    content = [{"type": "input_text", "text": "What is in it?"},
               {"type": "input_image", "file_id": "file-img123", "detail": "auto"}]
    client.responses.create(model="native-x", input=[{"type": "message", "role": "user", "content": content}])
    assert upstream.responses_requests[-1].body["input"][0]["content"] == content
    line = "[image (file file-img123): not readable by this model]"
    client.responses.create(model="gpt-x", input="and now?")
    assert upstream.last.messages[0]["content"] == [{"type": "text", "text": "What is in it?"},
                                                    {"type": "text", "text": line}]
    client.responses.create(model="claude-x", input="and now?")
    assert claude.last.body["messages"][0]["content"] == [{"type": "text", "text": "What is in it?"},
                                                          {"type": "text", "text": line}]
    client.responses.create(model="native-x", input="and now?")
    assert upstream.responses_requests[-1].body["input"][0]["content"] == content


def test_request_replay_verifies_for_responses(proxy, upstream, key, cid):
    client = proxy.openai(key, conversation=cid)
    raw_create(client, input="one", instructions="Be brief.")
    _, h = raw_create(client, input=[{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "two"}]}])
    r = httpx.get(f"{proxy.url}/admin/nodes/{h['x-node-id']}/request", headers={"Authorization": f"Bearer {key}"})
    assert r.headers["x-request-verified"] == "true" and r.json()["messages"][-1]["content"] == "two"


def test_item_references_to_stored_items_are_resolved(proxy, upstream, key, cid):
    client = proxy.openai(key, conversation=cid)
    first, _ = raw_create(client, input="remember 42")
    message_id = first.output[0].id
    raw_create(client, input=[{"role": "user", "content": "remember 42"}, {"type": "item_reference", "id": message_id},
                              {"role": "user", "content": "what number?"}], extra_headers={"X-Context-Mode": "full"})
    assert [m["content"] for m in upstream.last.messages] == ["remember 42", first.output_text, "what number?"]
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model=MODEL, input=[{"type": "item_reference", "id": "msg_" + "0" * 32}])
    assert e.value.body["code"] == "item_not_found"


def test_a_responses_upstreams_stream_is_renumbered_and_says_the_clients_instructions(native, upstream, key, cid):
    """Relayed from a Responses upstream: the response carries the client's instructions (sent
    upstream as a system message, so never echoed), as a later GET does; the events are numbered in
    one sequence, the proxy's own among them (a failure's), and a failed response is a whole one."""
    client = native.openai(key, conversation=cid)
    plain = client.responses.create(model="native-1", input="one", instructions="Be brief.")
    assert plain.instructions == "Be brief." == client.responses.retrieve(plain.id).instructions
    with client.responses.stream(model="native-1", input="two", instructions="Be brief.") as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert final.instructions == "Be brief." == client.responses.retrieve(final.id).instructions
    assert [e.sequence_number for e in events] == list(range(len(events)))
    upstream.enqueue(Reply(kind="stream", content="half", error_event={"code": "server_error", "message": "boom"}))
    with client.responses.with_streaming_response.create(model="native-1", input="three", stream=True) as r:
        lines = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert [e["sequence_number"] for e in lines] == list(range(len(lines)))
    failed = next(e for e in lines if e["type"] == "response.failed")["response"]
    assert failed["status"] == "failed" and failed["model"] == "native-1" and failed["created_at"]
    assert failed["instructions"] is None and failed["id"] == f"resp_{uuid.UUID(r.headers['x-node-id']).hex}"


def _stream(proxy, key, cid, body):
    with httpx.stream("POST", f"{proxy.url}/c/{cid}/v1/responses", json={"stream": True, "model": MODEL, **body},
                      headers={"Authorization": f"Bearer {key}"}, timeout=30) as r:
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]


def test_allowed_tools_over_chat_offer_only_those(proxy, upstream, key, cid):
    """``tool_choice: {"type": "allowed_tools"}``: a chat upstream is offered only the tools it
    names (the mode alone let the model call one the client excluded)."""
    client = proxy.openai(key, conversation=cid)
    danger = {**WEATHER_TOOL, "name": "delete_everything"}
    namespaced = {"type": "namespace", "name": "fs", "description": "files", "tools": [
        {"type": "function", "name": "read", "parameters": {"type": "object", "properties": {}}}]}
    raw_create(client, input="x", tools=[WEATHER_TOOL, danger, namespaced], tool_choice={
        "type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "weather"},
                                                               {"type": "function", "name": "read"}]})
    assert [t["function"]["name"] for t in upstream.last.body["tools"]] == ["weather", "fs__read"]
    assert upstream.last.body["tool_choice"] == "required"


def test_a_content_filter_finish_is_an_incomplete_response(proxy, native, upstream, key, cid):
    """Over a chat upstream (plain and streamed) and from a Responses upstream, and read back:
    ``incomplete`` with the reason the upstream gave -- before, completed, or max_output_tokens."""
    client = proxy.openai(key, conversation=cid)
    upstream.enqueue(Reply(content="partial", finish_reason="content_filter"))
    r, _ = raw_create(client, input="bad")
    assert (r.status, r.incomplete_details.reason) == ("incomplete", "content_filter")
    assert client.responses.retrieve(r.id).incomplete_details.reason == "content_filter"
    upstream.enqueue(Reply(kind="stream", content="partial", finish_reason="content_filter"))
    events = _stream(proxy, key, cid, {"input": "bad again"})
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "content_filter"}
    answer = {"id": "resp_up", "object": "response", "created_at": 1, "status": "incomplete", "model": "native-1",
              "incomplete_details": {"reason": "content_filter"}, "error": None, "usage": None,
              "output": [{"id": "msg_up", "type": "message", "role": "assistant", "status": "incomplete",
                          "content": [{"type": "output_text", "text": "part", "annotations": []}]}]}
    upstream.enqueue(Reply(kind="raw", body=json.dumps(answer).encode()))
    made = native.openai(key, conversation=f"{cid}-n").responses.create(model="native-1", input="bad")
    assert native.openai(key).responses.retrieve(made.id).incomplete_details.reason == "content_filter"


def test_text_after_a_call_in_a_stream_over_chat_is_a_message_item_of_its_own(proxy, upstream, key, cid):
    """A chat stream whose text goes on after a tool call began: items are said one after the
    other (the message closes before the call opens), the text after the call in a message item
    of its own; every delta comes before its item's done event, and the done events hold the
    whole text the final response's one message has."""
    base = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": MODEL}
    deltas = [{"role": "assistant", "content": ""}, {"content": "Sure, "},
              {"tool_calls": [{"index": 0, "id": "call_q", "type": "function",
                               "function": {"name": "weather", "arguments": "{}"}}]},
              {"content": "checking now."}]
    chunks = [{**base, "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
    chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    body = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
    upstream.enqueue(Reply(kind="raw", body=body, content_type="text/event-stream"))
    events = _stream(proxy, key, cid, {"input": "x", "tools": [WEATHER_TOOL]})
    final = next(i for i in events[-1]["response"]["output"] if i["type"] == "message")
    done = [e["text"] for e in events if e["type"] == "response.output_text.done"]
    assert final["content"][0]["text"] == "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert done == ["Sure, ", "checking now."] and final["content"][0]["text"] == "Sure, checking now."
    closed = {e["output_index"]: n for n, e in enumerate(events) if e["type"] == "response.output_item.done"}
    assert all(n < closed[e["output_index"]] for n, e in enumerate(events) if e["type"].endswith(".delta"))
    added = [e["item"]["type"] for e in events if e["type"] == "response.output_item.added"]
    assert added == ["message", "function_call", "message"]


def test_an_item_reference_to_a_chat_calls_answer(proxy, upstream, key, cid):
    """GET /v1/responses/{id} reads a chat call's node as a response, naming its items: a later
    input may reference them like any response's."""
    client = proxy.openai(key, conversation=cid)
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    ref = client.responses.retrieve("resp_" + uuid.UUID(raw.headers["x-node-id"]).hex).output[0].id
    raw_create(client, input=[{"role": "user", "content": "hi"}, {"type": "item_reference", "id": ref},
                              {"role": "user", "content": "more"}], extra_headers={"X-Context-Mode": "full"})
    assert [m["content"] for m in upstream.last.messages] == ["hi", "echo: hi", "more"]


def test_x_parent_node_id_names_a_responses_calls_parent_as_for_chat(proxy, upstream, key, cid, db):
    """Without previous_response_id, X-Parent-Node-Id says where the call hangs, as for a chat
    call: ``root`` edits the first question (a second root), a node branches there. Both at once
    are refused; so is the header in full-history mode, where the input decides."""
    client = proxy.openai(key, conversation=cid)
    first, h1 = raw_create(client, input="first question")
    second, h2 = raw_create(client, input="second question")
    edited, h3 = raw_create(client, input="edited first question", extra_headers={"X-Parent-Node-Id": "root"})
    assert h3["x-parent-node-id"] == "root" and db.node(h3["x-node-id"])["parent_id"] is None
    assert [m["content"] for m in upstream.last.messages] == ["edited first question"]
    _, h4 = raw_create(client, input="another second", extra_headers={"X-Parent-Node-Id": h1["x-node-id"]})
    assert h4["x-parent-node-id"] == h1["x-node-id"] and "second question" not in str(upstream.last.messages)
    with pytest.raises(openai.BadRequestError):
        raw_create(client, input="x", previous_response_id=second.id, extra_headers={"X-Parent-Node-Id": "root"})
    with pytest.raises(openai.BadRequestError):
        raw_create(client, input="x", extra_headers={"X-Parent-Node-Id": "root", "X-Context-Mode": "full"})


@pytest.mark.parametrize("swap", ["data", "url", "file_id"])
def test_a_tool_outputs_other_image_in_a_resent_history_is_not_matched(mproxy, upstream, claude, key, swap):
    """A tool output's image reaches a chat model as a line (a chat tool message takes no image),
    and full history compares that line: one alike for any image ("an image (image/png)") made a
    resent history with another screenshot for the same call match the stored one -- and the
    upstream was sent the stored screenshot, not the one the client sent. The line names the
    image (a digest of its bytes, its URL, its file id)."""
    from .anthropic_fake import AReply

    def image(which: str) -> dict:
        if swap == "data":
            return {"type": "input_image", "image_url": f"data:image/png;base64,{which * 24}"}
        if swap == "url":
            return {"type": "input_image", "image_url": f"https://example.com/{which}.png"}
        return {"type": "input_image", "file_id": f"file-{which * 6}"}

    client = openai.OpenAI(base_url=f"{mproxy.url}/auto/v1", api_key=key, max_retries=0)
    q = {"type": "message", "role": "user", "content": f"Screenshot please {uuid.uuid4().hex[:6]}"}
    upstream.enqueue(Reply(content=None, tool_calls=[tool_call("call_1", "weather", '{"city": "Paris"}')]))
    first = client.responses.create(model="gpt-x", input=[q], tools=[WEATHER_TOOL])
    call = next(i.model_dump(exclude_none=True) for i in first.output if i.type == "function_call")

    def output(which: str) -> dict:
        return {"type": "function_call_output", "call_id": "call_1",
                "output": [{"type": "input_text", "text": "the screen:"}, image(which)]}

    claude.enqueue(AReply(content=[{"type": "text", "text": "I see it."}]))
    second = client.responses.with_raw_response.create(model="claude-x", input=[q, call, output("A")],
                                                       tools=[WEATHER_TOOL])
    said = next(i.model_dump(exclude_none=True) for i in second.parse().output if i.type == "message")
    claude.enqueue(AReply(content=[{"type": "text", "text": "ok"}]))
    third = client.responses.with_raw_response.create(
        model="claude-x", tools=[WEATHER_TOOL],
        input=[q, call, output("B"), said, {"type": "message", "role": "user", "content": "what did you see?"}])
    assert third.headers["x-parent-node-id"] != second.headers["x-node-id"]  # (another history)
    sent = json.dumps(claude.last.body["messages"])
    assert ("BBBBBB" in sent or "B.png" in sent) and "AAAAAA" not in sent and "A.png" not in sent


SIGNATURE = {"google": {"thought_signature": "EjQKMgEMOdbHJChLX75QUCJj"}}


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_calls_signature_reaches_a_responses_client_and_goes_back_to_its_provider(database_url, upstream_url,
                                                                                          upstream, stream):
    """Gemini signs a tool call (``extra_content``) and refuses the next call when it comes back
    unsigned. A ``function_call`` item has no place for it: the answer carries it in a reasoning
    item of its own (its ``encrypted_content``), which the stored answer, a stream's events and
    the completed response all hold -- so a client continuing by ``previous_response_id`` and one
    resending the items it got both send Gemini its signed call again; another provider never
    gets the signature."""
    from .conftest import make_settings, serve_proxy

    settings = make_settings(database_url, upstream_url, upstreams=[
        {"name": "gemini", "base_url": upstream_url, "models": ["gemini-*"]},
        {"name": "plain", "base_url": upstream_url, "models": ["*"]},
    ])
    signed = {**tool_call("fc-1", "weather", '{"city": "Oslo"}'), "extra_content": SIGNATURE}
    question = {"role": "user", "content": f"Weather in Oslo? {uuid.uuid4().hex[:6]}"}
    with serve_proxy(settings) as p:
        client = openai.OpenAI(base_url=f"{p.url}/auto/v1", api_key=new_key(), max_retries=0)
        upstream.enqueue(Reply(content=None, tool_calls=[signed]))
        if stream:
            with client.responses.stream(model="gemini-3-flash-preview", input=[question], tools=[WEATHER_TOOL]) as s:
                events = list(s)
                first = s.get_final_response()
            done = [e.item.model_dump(exclude_none=True) for e in events if e.type == "response.output_item.done"]
            assert done == [i.model_dump(exclude_none=True) for i in first.output]
        else:
            first, _ = raw_create(client, model="gemini-3-flash-preview", input=[question], tools=[WEATHER_TOOL])
        assert [i.type for i in first.output] == ["function_call", "reasoning"]
        assert first.output[1].summary == [] and first.output[1].encrypted_content
        stored = client.responses.retrieve(first.id)
        assert [i.model_dump(exclude_none=True) for i in stored.output] == \
            [i.model_dump(exclude_none=True) for i in first.output]
        result = {"type": "function_call_output", "call_id": "fc-1", "output": "-3 C"}
        upstream.enqueue(Reply(content="Cold."))
        raw_create(client, model="gemini-3-flash-preview", previous_response_id=first.id, input=[result],
                   tools=[WEATHER_TOOL])
        assert upstream.last.messages[1]["tool_calls"] == [signed]
        items = [i.model_dump(exclude_none=True) for i in first.output]
        upstream.enqueue(Reply(content="Cold."))
        _, headers = raw_create(client, model="gemini-3-flash-preview", input=[question, *items, result],
                                tools=[WEATHER_TOOL])
        assert headers["x-context-matched"] == "2"  # (the stored answer: the history resent matched it)
        assert upstream.last.messages[1]["tool_calls"] == [signed]
        upstream.enqueue(Reply(content="Cold."))
        raw_create(client, model="gpt-4o-mini", previous_response_id=first.id, input=[result], tools=[WEATHER_TOOL])
        assert upstream.last.messages[1]["tool_calls"] == [tool_call("fc-1", "weather", '{"city": "Oslo"}')]


@pytest.mark.parametrize("stream", [False, True])
def test_claudes_signed_thinking_goes_back_to_claude_in_a_responses_clients_tool_loop(mproxy, claude, key, cid,
                                                                                      stream):
    """Over an Anthropic upstream, an answer of signed thinking and a tool call: a Responses
    client gets the thinking as a reasoning summary -- which keeps no signature -- and, after the
    call, a reasoning item keeping the signed blocks (``encrypted_content``). So the next call of
    the tool loop, by ``previous_response_id`` or by resending the items, gives Claude its
    thinking back signed, first in the assistant turn (with thinking on, Anthropic refuses a tool
    loop's turn without it); the signature was lost with the stored answer."""
    from .anthropic_fake import AReply

    tools = [{"type": "function", "name": "shell", "parameters": {"type": "object"}}]
    thinking = {"type": "thinking", "thinking": "hmm", "signature": "sig1"}
    claude.enqueue(AReply(content=[thinking, {"type": "tool_use", "id": "toolu_7", "name": "shell",
                                              "input": {"cmd": "ls"}}], stop_reason="tool_use"))
    client = mproxy.openai(key, conversation=cid)
    asked = {"model": "claude-x", "tools": tools, "max_output_tokens": 2000}
    if stream:
        with client.responses.stream(input="go", **asked) as s:
            events = list(s)
            first = s.get_final_response()
        done = [e.item.model_dump(exclude_none=True) for e in events if e.type == "response.output_item.done"]
        assert done == [i.model_dump(exclude_none=True) for i in first.output]
    else:
        first, _ = raw_create(client, input="go", **asked)
    assert [i.type for i in first.output] == ["reasoning", "function_call", "reasoning"]
    assert first.output[0].summary[0].text == "hmm" and first.output[2].encrypted_content
    result = {"type": "function_call_output", "call_id": "toolu_7", "output": "files"}
    claude.enqueue(AReply(content=[{"type": "text", "text": "Done."}]))
    raw_create(client, previous_response_id=first.id, input=[result], **asked)
    assert claude.last.messages[1]["content"] == [thinking, {"type": "tool_use", "id": "toolu_7", "name": "shell",
                                                             "input": {"cmd": "ls"}}]
    stateless = openai.OpenAI(base_url=f"{mproxy.url}/auto/v1", api_key=new_key(), max_retries=0)
    items = [i.model_dump(exclude_none=True) for i in first.output]
    claude.enqueue(AReply(content=[{"type": "text", "text": "Done."}]))
    raw_create(stateless, input=[{"role": "user", "content": "go"}, *items, result], **asked)
    assert claude.last.messages[1]["content"][0] == thinking


def test_without_a_conversation_a_claude_model_is_translated_and_not_stored(mproxy, upstream, claude, key):
    """A Responses call naming no conversation passes through -- but an Anthropic upstream has no
    Responses endpoint (it answered 404): the call is translated both ways, answered and streamed,
    and nothing is stored, as a chat or Messages call for an upstream of another API is."""
    client = mproxy.openai(key)
    r = client.responses.with_raw_response.create(model="claude-x", instructions="Be brief.",
                                                  input=[{"role": "user", "content": "plain"}])
    answer = r.parse()
    assert answer.output_text == "echo: plain" and answer.status == "completed" and answer.store is False
    assert not any(h in r.headers for h in ("x-node-id", "x-conversation-id", "x-parent-node-id"))
    sent = claude.last.body
    assert claude.last.path.endswith("/v1/messages") and sent["system"] == "Be brief."
    assert sent["messages"] == [{"role": "user", "content": [{"type": "text", "text": "plain"}]}]

    with client.responses.stream(model="claude-x", input="streamed") as stream:
        assert "".join(e.delta for e in stream if e.type == "response.output_text.delta") == "echo: streamed"
        assert stream.get_final_response().output_text == "echo: streamed"
    assert claude.last.body["stream"] is True

    with pytest.raises(openai.NotFoundError) as missing:  # (an upstream's response: nothing here continues it)
        client.responses.create(model="claude-x", input="more", previous_response_id="resp_upstreams_own")
    assert missing.value.body["param"] == "previous_response_id"

    upstream.reset()
    client.responses.create(model=MODEL, input="to the chat upstream")  # (it serves the Responses API: passed through)
    assert upstream.requests[-1].path.endswith("/v1/responses")
    listed = httpx.get(f"{mproxy.url}/admin/conversations", headers={"Authorization": f"Bearer {key}"}, timeout=30)
    assert listed.json()["data"] == []  # nothing stored for this tenant


def test_a_chained_responses_input_items_hold_the_turns_before_it(proxy, upstream, key, cid):
    """``input_items`` lists what the model was given, as OpenAI's does for a response chained by
    ``previous_response_id``: the earlier turns' input and output, then the call's own input --
    not the call's new items alone."""
    first = proxy.openai(key, conversation=cid).responses.create(model=MODEL, input="a")
    client = proxy.openai(key)  # (the chain names the conversation)
    second = client.responses.create(model=MODEL, input="b", previous_response_id=first.id)
    listed = client.responses.input_items.list(second.id, order="asc").data
    assert [i.content[0].text for i in listed] == ["a", first.output_text, "b"]
    assert [i.id for i in listed][:2] == [i.id for i in client.responses.input_items.list(first.id).data] + [
        first.output[0].id]  # (the same ids as the earlier response gave them)
    assert second.output_text not in [i.content[0].text for i in listed]


def test_a_completed_response_says_when_it_completed(proxy, upstream, key, cid):
    """``completed_at``, as OpenAI's response object has it: set when the status is completed --
    answered, streamed, and retrieved (when the node was finished) -- and null otherwise."""
    client = proxy.openai(key, conversation=cid)
    answered = client.responses.create(model=MODEL, input="one")
    with client.responses.stream(model=MODEL, input="two") as stream:
        streamed = stream.get_final_response()
    for r in (answered, streamed, client.responses.retrieve(answered.id)):
        assert r.status == "completed" and r.completed_at is not None and r.created_at <= r.completed_at
    upstream.enqueue(Reply(kind="stream", content="half", error_event={"code": "server_error", "message": "boom"}))
    with client.responses.with_streaming_response.create(model=MODEL, input="three", stream=True) as r:
        lines = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    failed = next(e for e in lines if e["type"] == "response.failed")["response"]
    assert failed["status"] == "failed" and failed["completed_at"] is None
    assert client.responses.retrieve(failed["id"]).completed_at is None
