"""The Responses API's own features that OpenAI's stateful API offers, served from the tree or
refused by name -- never silently wrong: background mode, stream resumption, cancel, fields a
chat upstream cannot honour, text.verbosity. Through the openai SDK; assertions on what the fake
upstream received and on what the client got back (found by a hostile pass)."""

import json

import openai
import pytest

from .fakes import Reply
from .helpers import MODEL

QUEUED = {"id": "resp_upstream_bg", "object": "response", "created_at": 1, "status": "queued", "model": "native-x",
          "output": [], "error": None, "incomplete_details": None, "usage": None, "background": True}


def test_background_is_answered_as_it_runs_and_a_queued_answer_is_no_answer(native, upstream, key, cid):
    """``background: true`` is not sent upstream -- the proxy answers every call as it runs, and
    an upstream's queued response would be an answer nothing here ever fetches: it was sent, the
    upstream answered 'queued' with no output, and the node was stored a success with nothing
    received (its question then in every later call's context without an answer). The response
    says background, and completed; a queued answer from an upstream is not a completion."""
    client = native.openai(key, conversation=cid)
    done = client.responses.create(model="native-x", input="write a haiku", background=True)
    assert "background" not in upstream.responses_requests[-1].body
    assert done.status == "completed" and done.background is True and done.output_text
    assert client.responses.retrieve(done.id).output_text == done.output_text

    upstream.enqueue(Reply(kind="raw", body=json.dumps(QUEUED).encode()))  # an upstream that queues anyway
    with pytest.raises(openai.APIStatusError) as refused:
        client.responses.create(model="native-x", input="and another")
    assert refused.value.status_code == 502
    failed = native.db.fetchrow("SELECT status, received FROM nodes WHERE conversation_id = $1 ORDER BY created_at DESC "
                         "LIMIT 1", cid)
    assert failed["status"] == "failed" and failed["received"] is None


def test_a_stream_resumption_is_refused_by_name(native, upstream, key, cid):
    """``GET /v1/responses/{id}?stream=true`` (resuming a background stream) answered the stored
    response as JSON, which the SDK read as an empty stream: nothing to resume here (no call runs
    in the background), so a 400 naming ``stream``."""
    client = native.openai(key, conversation=cid)
    r = client.responses.create(model=MODEL, input="hi")
    with pytest.raises(openai.BadRequestError) as refused:
        list(client.responses.retrieve(r.id, stream=True, starting_after=0))
    assert refused.value.body["param"] == "stream"
    assert client.responses.retrieve(r.id).output_text  # (without stream: the response)


def test_cancel_passes_through_for_an_upstreams_response_and_is_refused_for_ours(native, upstream, key, cid):
    """``POST /v1/responses/{id}/cancel``: an id the upstream gave (a pass-through call's) goes to
    the upstream, as every other route does -- it was 404 here, reaching nothing; one of ours is
    refused: only a background response can be cancelled, and none runs here."""
    http = native.http(key)
    before = len(upstream.requests)
    http.post("/v1/responses/resp_upstream_bg/cancel")
    assert [r.path for r in upstream.requests[before:]] == ["/v1/responses/resp_upstream_bg/cancel"]
    ours = native.openai(key, conversation=cid).responses.create(model=MODEL, input="hi")
    r = http.post(f"/v1/responses/{ours.id}/cancel")
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request", r.text
    assert len(upstream.requests) == before + 2  # (the call itself, and the first cancel)


@pytest.mark.parametrize("field, value", [
    ("prompt", {"id": "pmpt_abc", "version": "2", "variables": {"city": "Paris"}}),
    ("include", ["message.output_text.logprobs"]),
])
def test_a_field_a_chat_upstream_cannot_honour_is_refused_by_name(native, upstream, key, cid, field, value):
    """A Responses call to a model of a chat upstream with a field that changes the answer and has
    no chat equivalent here: a reusable prompt (its id, version and variables were dropped: the
    model answered without the prompt), an include of the output's logprobs (dropped, the client
    got none). 400 naming it, nothing sent upstream -- as chat fields a Responses upstream cannot
    honour are refused."""
    client = native.openai(key, conversation=cid)
    before = len(upstream.requests)
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model=MODEL, input="hi", **{field: value})
    assert refused.value.body["param"] == field
    assert len(upstream.requests) == before
    # includes a chat upstream can serve (nothing, or what the answer holds anyway) pass
    client.responses.create(model=MODEL, input="hi", include=["reasoning.encrypted_content"])


def test_text_verbosity_reaches_a_chat_upstream(native, upstream, key, cid):
    """``text.verbosity`` is chat's ``verbosity``: it was dropped while the response said it
    applied."""
    r = native.openai(key, conversation=cid).responses.create(model=MODEL, input="hi", text={"verbosity": "low"})
    assert upstream.last.body["verbosity"] == "low"
    assert r.text.verbosity == "low"


def test_input_tokens_counts_the_stored_context_and_sends_none_of_our_ids_upstream(native, upstream, key, cid):
    """``POST /v1/responses/input_tokens`` naming state of ours (a previous response, a
    conversation) is counted here, stored context included -- it went upstream with our response
    id, which no upstream knows (a chat one answered 404); one naming nothing goes to a Responses
    upstream as it came, and is estimated for any other."""
    client = native.openai(key, conversation=cid)
    long_question = "tell me about the sea " * 50
    first = client.responses.create(model=MODEL, input=long_question)
    http = native.http(key)
    before = len(upstream.requests)
    alone = http.post("/v1/responses/input_tokens", json={"model": MODEL, "input": "and the sky?"}).json()
    chained = http.post("/v1/responses/input_tokens", json={"model": MODEL, "input": "and the sky?",
                                                            "previous_response_id": first.id}).json()
    by_conversation = http.post("/v1/responses/input_tokens", json={"model": MODEL, "input": "and the sky?",
                                                                    "conversation": cid}).json()
    assert alone["object"] == chained["object"] == "response.input_tokens"
    assert chained["input_tokens"] == by_conversation["input_tokens"] > alone["input_tokens"] + 200
    assert len(upstream.requests) == before  # (all counted here: a chat model's upstream has no such endpoint)
    missing = http.post("/v1/responses/input_tokens", json={"model": MODEL, "input": "x",
                                                            "previous_response_id": "resp_" + "0" * 32})
    assert missing.status_code == 404
    http.post("/v1/responses/input_tokens", json={"model": "native-x", "input": "hi"})  # names nothing of ours
    assert [r.path for r in upstream.requests[before:]] == ["/v1/responses/input_tokens"]
    http.post("/v1/responses/input_tokens", json={"model": "native-x", "input": "hi", "previous_response_id": first.id})
    assert len(upstream.requests) == before + 1


def test_parallel_tool_calls_goes_to_a_chat_upstream_only_with_tools(native, upstream, key, cid):
    """The Responses API takes ``parallel_tool_calls`` with no tools (its default is true, and SDKs
    send it); chat refuses it without tools ("only allowed when tools are specified") -- so with
    none offered, or every one dropped (a hosted tool), it is not sent."""
    client = native.openai(key, conversation=cid)
    client.responses.create(model=MODEL, input="hi", parallel_tool_calls=True, top_logprobs=0)
    assert "parallel_tool_calls" not in upstream.last.body and "top_logprobs" not in upstream.last.body
    client.responses.create(model=MODEL, input="hi", parallel_tool_calls=True, tools=[{"type": "web_search"}])
    assert "parallel_tool_calls" not in upstream.last.body and "tools" not in upstream.last.body
    tool = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}
    client.responses.create(model=MODEL, input="hi", parallel_tool_calls=False, tools=[tool])
    assert upstream.last.body["parallel_tool_calls"] is False


def test_input_tokens_counts_as_the_call_would_be_assembled(native, upstream, key, cid):
    """The count follows the assembly's rules: instructions resent with every call are counted
    once (the system rule: the last in effect -- they were counted per node, ~4x for three calls);
    instructions alone count; an upstream's own previous_response_id, and a body without a model,
    pass through to a Responses upstream; a conversation named by the path that has no call yet
    is empty, not 404."""
    client = native.openai(key, conversation=cid)
    rules = "Always answer in formal English and cite sources. " * 40
    first = client.responses.create(model=MODEL, input="q1", instructions=rules)
    second = client.responses.create(model=MODEL, input="q2", instructions=rules, previous_response_id=first.id)
    http = native.http(key)
    count = lambda **body: http.post("/v1/responses/input_tokens", json={"model": MODEL, **body}).json()  # noqa: E731
    alone = count(instructions=rules)["input_tokens"]
    assert alone > 300
    chained = count(input="q3", instructions=rules, previous_response_id=second.id)["input_tokens"]
    assert alone < chained < alone + 100  # (the rules once, and a few short messages)
    before = len(upstream.requests)
    http.post("/v1/responses/input_tokens", json={"model": "native-x", "previous_response_id": "resp_upstreams1"})
    http.post("/v1/responses/input_tokens", json={"input": "hi"})  # (no model: the default upstream -- a chat one)
    assert [r.path for r in upstream.requests[before:]] == ["/v1/responses/input_tokens"]
    fresh = http.post(f"/c/{cid}-new/v1/responses/input_tokens", json={"model": MODEL, "input": "hi"})
    assert fresh.status_code == 200 and fresh.json()["input_tokens"] > 0
    for odd in ({"model": 5, "input": "x"}, {"model": MODEL, "input": 5}, [1, 2]):
        assert http.post("/v1/responses/input_tokens", json=odd).status_code == 400, odd
