"""The chat endpoint through the official openai SDK: turns, tools, system prompts, the pairing
check, both ways of naming a conversation, pass-through. Assertions are on what the fake upstream
received -- that is where a context bug shows."""

import json
import logging

import httpx
import openai
import pytest

from .conftest import tenant_of
from .fakes import Reply
from .helpers import MODEL, say, tool_call, user

TOOLS = [{"type": "function", "function": {"name": "run_sql", "parameters": {"type": "object", "properties": {"sql": {"type": "string"}}}}}]


def test_second_turn_carries_the_first(client, upstream, cid, db):
    c1, h1 = say(client, cid, user("hello"))
    assert c1.choices[0].message.content == "echo: hello"
    assert h1["x-conversation-id"] == cid
    assert h1["x-parent-node-id"] == "root"
    c2, h2 = say(client, cid, user("and again"))
    assert h2["x-parent-node-id"] == h1["x-node-id"]
    assert upstream.last.messages == [user("hello"), {"role": "assistant", "content": "echo: hello"}, user("and again")]
    assert db.head(cid) == h2["x-node-id"]

    n1 = db.node(h1["x-node-id"])
    assert n1["status"] == "success" and n1["kind"] == "turn" and n1["parent_id"] is None
    assert n1["sent"] == [user("hello")]
    assert n1["received"][0]["content"] == "echo: hello"
    assert n1["usage"]["prompt_tokens"] > 0
    assert n1["finish_reason"] == "stop"
    assert n1["provider"] == "fake" and n1["model"] == MODEL
    assert n1["finished_at"] is not None and n1["depth"] == 0
    n2 = db.node(h2["x-node-id"])
    assert str(n2["parent_id"]) == h1["x-node-id"] and n2["depth"] == 1


def test_path_prefix_names_the_conversation(proxy, upstream, key, cid, db):
    prefixed = proxy.openai(key, conversation=cid)
    r1 = prefixed.chat.completions.with_raw_response.create(model=MODEL, messages=[user("one")])
    assert r1.headers["x-conversation-id"] == cid
    # the header form reaches the same conversation
    plain = proxy.openai(key)
    _, h2 = say(plain, cid, user("two"))
    assert h2["x-parent-node-id"] == r1.headers["x-node-id"]
    assert [m["content"] for m in upstream.last.messages] == ["one", "echo: one", "two"]
    # both given and equal: fine; disagreeing: 400
    prefixed.chat.completions.create(model=MODEL, messages=[user("three")], extra_headers={"X-Conversation-Id": cid})
    with pytest.raises(openai.BadRequestError) as e:
        prefixed.chat.completions.create(model=MODEL, messages=[user("x")], extra_headers={"X-Conversation-Id": "other"})
    assert e.value.body["code"] == "invalid_conversation_id"


@pytest.mark.parametrize("bad", ["has space", "x" * 129, "slash/inside", "ümlaut"])
def test_invalid_conversation_id(proxy, key, bad):
    with httpx.Client(base_url=proxy.url) as http:
        r = http.post("/v1/chat/completions", headers={"Authorization": f"Bearer {key}", "X-Conversation-Id": bad.encode("utf-8")},
                      json={"model": MODEL, "messages": [user("x")]})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "invalid_conversation_id" and set(err) == {"message", "type", "param", "code"}


def test_unknown_fields_are_forwarded_untouched(client, upstream, cid, db):
    _, h = say(client, cid, user("q"), temperature=0.3, tools=TOOLS, tool_choice="auto",
               response_format={"type": "json_object"}, extra_body={"future_field": {"nested": [1, 2]}, "top_k": 5})
    body = upstream.last.body
    assert body["temperature"] == 0.3 and body["tools"] == TOOLS and body["tool_choice"] == "auto"
    assert body["response_format"] == {"type": "json_object"}
    assert body["future_field"] == {"nested": [1, 2]} and body["top_k"] == 5
    params = db.node(h["x-node-id"])["params"]
    assert params["future_field"] == {"nested": [1, 2]} and "messages" not in params


def test_tool_rounds_node_k_plus_1_carries_the_results_of_node_k(client, upstream, cid, db):
    upstream.enqueue(Reply(content=None, tool_calls=[tool_call("call_a"), tool_call("call_b", args='{"sql": "select 2"}')]))
    c1, h1 = say(client, cid, user("top customers?"), tools=TOOLS)
    msg = c1.choices[0].message
    assert [tc.id for tc in msg.tool_calls] == ["call_a", "call_b"]
    results = [{"role": "tool", "tool_call_id": "call_a", "content": "rows A"},
               {"role": "tool", "tool_call_id": "call_b", "content": "rows B"}]
    upstream.enqueue(Reply(content="Customers are A and B"))
    _, h2 = say(client, cid, *results, tools=TOOLS)
    sent = upstream.last.messages
    assert [m["role"] for m in sent] == ["user", "assistant", "tool", "tool"]
    assert [tc["id"] for tc in sent[1]["tool_calls"]] == ["call_a", "call_b"]
    assert sent[2:] == results
    n2 = db.node(h2["x-node-id"])
    assert n2["sent"] == results and str(n2["parent_id"]) == h1["x-node-id"]
    assert db.node(h1["x-node-id"])["finish_reason"] == "tool_calls"
    # the next question sees the whole turn
    say(client, cid, user("thanks"))
    assert [m["role"] for m in upstream.last.messages] == ["user", "assistant", "tool", "tool", "assistant", "user"]


def test_system_prompt_sent_once_with_the_first_call_stays_first(client, upstream, cid):
    system = {"role": "system", "content": "You are terse."}
    say(client, cid, system, user("a"))
    say(client, cid, user("b"))
    assert upstream.last.messages[0] == system
    assert [m["role"] for m in upstream.last.messages] == ["system", "user", "assistant", "user"]
    # a client that resends its system prompt every call does not get it twice
    say(client, cid, system, user("c"))
    assert sum(m["role"] == "system" for m in upstream.last.messages) == 1
    # a new one replaces it
    dev = {"role": "developer", "content": "Now be verbose."}
    say(client, cid, dev, user("d"))
    assert upstream.last.messages[0] == dev and system not in upstream.last.messages
    say(client, cid, user("e"))
    assert upstream.last.messages[0] == dev


def test_pairing_check_drops_abandoned_tool_calls_with_a_warning(client, upstream, cid, caplog):
    upstream.enqueue(Reply(content=None, tool_calls=[tool_call("call_x")]))
    say(client, cid, user("look it up"), tools=TOOLS)
    caplog.set_level(logging.WARNING, logger="branchpoint.call")
    # the client abandons the turn: no tool result, a new question instead
    say(client, cid, user("forget it, what is 2+2?"))
    sent = upstream.last.messages
    assert "call_x" not in json.dumps(sent)
    assert sent == [user("look it up"), user("forget it, what is 2+2?")]
    assert any("pairing check dropped" in r.getMessage() for r in caplog.records)


def test_pairing_check_drops_orphan_tool_result(client, upstream, cid, caplog):
    caplog.set_level(logging.WARNING, logger="branchpoint.call")
    say(client, cid, user("hi"))
    say(client, cid, {"role": "tool", "tool_call_id": "nobody_called_me", "content": "x"}, user("ok"))
    assert "nobody_called_me" not in upstream.last.text()
    assert any("pairing check dropped" in r.getMessage() for r in caplog.records)


def test_normal_tool_path_logs_no_pairing_warning(client, upstream, cid, caplog):
    caplog.set_level(logging.WARNING, logger="branchpoint.call")
    upstream.enqueue(Reply(content=None, tool_calls=[tool_call("c1")]))
    say(client, cid, user("q"), tools=TOOLS)
    say(client, cid, {"role": "tool", "tool_call_id": "c1", "content": "r"})
    say(client, cid, user("next"))
    # the whole round reached the upstream as it was: the call, its result, the answer, the question
    assert upstream.last.messages == [
        user("q"), {"role": "assistant", "content": None, "tool_calls": [tool_call("c1")]},
        {"role": "tool", "tool_call_id": "c1", "content": "r"}, {"role": "assistant", "content": "echo: r"}, user("next")]
    assert not [r for r in caplog.records if "pairing" in r.getMessage()]


def stored(db, key):
    """What the shared database holds for ``key``'s tenant: (nodes, conversations)."""
    tenant = tenant_of(key)
    return (db.fetchval("SELECT count(*) FROM nodes WHERE tenant = $1", tenant),
            db.fetchval("SELECT count(*) FROM conversations WHERE tenant = $1", tenant))


def test_without_conversation_id_it_is_a_plain_pass_through(proxy, client, upstream, key, db):
    body = {"model": MODEL, "messages": [user("stateless")], "seed": 7, "unknown_thing": True}
    r = client.chat.completions.with_raw_response.create(model=MODEL, messages=[user("stateless")], seed=7,
                                                         extra_body={"unknown_thing": True})
    assert "x-node-id" not in r.headers
    assert upstream.last.body == body
    assert upstream.last.headers["authorization"] == f"Bearer {key}"  # passthrough key
    assert stored(db, key) == (0, 0)
    # other routes pass through, also under the conversation prefix
    assert [m.id for m in client.models.list()] == ["fake-model"]
    emb = proxy.openai(key, conversation="some-conv").embeddings.create(model="e", input="x")
    assert emb.data[0].embedding == [0.1, 0.2]
    assert upstream.requests[-1].path == "/v1/embeddings"
    assert stored(db, key) == (0, 0)


def test_pass_through_stream(client, upstream):
    chunks = list(client.chat.completions.create(model=MODEL, messages=[user("abcdef")], stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "echo: abcdef"
    assert "stream_options" not in upstream.last.body  # untouched


def test_upstream_error_body_and_status_reach_the_client_with_node_headers(client, upstream, cid, db):
    upstream.enqueue(Reply(kind="error", status=404, error={"message": "The model does not exist", "type": "invalid_request_error",
                                                            "param": "model", "code": "model_not_found"}))
    with pytest.raises(openai.NotFoundError) as e:
        say(client, cid, user("q"))
    assert e.value.body["code"] == "model_not_found"
    node_id = e.value.response.headers["x-node-id"]
    assert db.node(node_id)["status"] == "failed"
    assert db.node(node_id)["error"]["status"] == 404


def test_async_client_turns(proxy, upstream, key, cid):
    import asyncio

    async def go():
        client = proxy.async_openai(key)
        h = {"X-Conversation-Id": cid}
        await client.chat.completions.create(model=MODEL, messages=[user("async one")], extra_headers=h)
        stream = await client.chat.completions.create(model=MODEL, messages=[user("async two")], extra_headers=h, stream=True)
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        await client.close()
        return text

    assert asyncio.run(go()) == "echo: async two"
    assert [m["content"] for m in upstream.last.messages] == ["async one", "echo: async one", "async two"]


def test_tenants_do_not_share_conversations(proxy, upstream, cid):
    a, b = proxy.openai(), proxy.openai()
    say(a, cid, user("secret of A"))
    say(b, cid, user("hello from B"))
    assert "secret of A" not in upstream.last.text()
    assert upstream.last.messages == [user("hello from B")]


def test_missing_api_key_is_401(proxy):
    with httpx.Client(base_url=proxy.url) as http:
        r = http.post("/v1/chat/completions", headers={"X-Conversation-Id": "c"}, json={"model": MODEL, "messages": []})
    assert r.status_code == 401
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("payload, param", [
    (b"{not json", None),
    (b"[1, 2]", None),
    (json.dumps({"messages": [user("x")]}).encode(), "model"),
    (json.dumps({"model": MODEL}).encode(), "messages"),
    (json.dumps({"model": MODEL, "messages": "hi"}).encode(), "messages"),
    (json.dumps({"model": MODEL, "messages": [{"content": "no role"}]}).encode(), "messages[0].role"),
    (json.dumps({"model": MODEL, "messages": [], "stream": "yes"}).encode(), "stream"),
])
def test_bad_bodies_are_400_openai_shaped(proxy, key, payload, param):
    with httpx.Client(base_url=proxy.url) as http:
        r = http.post("/v1/chat/completions", content=payload,
                      headers={"Authorization": f"Bearer {key}", "X-Conversation-Id": "bad-body", "content-type": "application/json"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "invalid_request" and err["param"] == param


def test_invalid_node_kind_and_parent_header(proxy, key, cid):
    with proxy.http(key) as http:
        r = http.post("/v1/chat/completions", headers={"X-Conversation-Id": cid, "X-Node-Kind": "sideways"},
                      json={"model": MODEL, "messages": [user("x")]})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request"
        r = http.post("/v1/chat/completions", headers={"X-Conversation-Id": cid, "X-Parent-Node-Id": "not-a-uuid"},
                      json={"model": MODEL, "messages": [user("x")]})
        assert r.status_code == 400 and r.json()["error"]["param"] == "X-Parent-Node-Id"


def test_body_over_the_limit_is_413(database_url, upstream_url, key):
    from .conftest import make_settings, serve_proxy

    with serve_proxy(make_settings(database_url, upstream_url, server={"max_body_bytes": 2048})) as p:
        big = json.dumps({"model": MODEL, "messages": [user("x" * 4096)]}).encode()
        for path, headers in (("/v1/chat/completions", {"X-Conversation-Id": "big"}),
                              ("/v1/chat/completions", {}),  # pass-through too
                              ("/v1/embeddings", {})):
            r = httpx.post(p.url + path, content=big, headers={"Authorization": f"Bearer {key}", **headers})
            assert r.status_code == 413, (path, r.text)
            assert r.json()["error"]["code"] == "payload_too_large"
            assert set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_reasoning_goes_back_only_to_providers_that_accept_it(database_url, upstream_url, upstream, key, cid):
    from .conftest import make_settings, serve_proxy

    settings = make_settings(database_url, upstream_url, upstreams=[
        {"name": "thinker", "base_url": upstream_url, "models": ["deepseek-*"], "accepts_reasoning": True},
        {"name": "plain", "base_url": upstream_url, "models": ["*"]},
    ])
    with serve_proxy(settings) as p:
        client = p.openai(key)
        upstream.enqueue(Reply(content="42", reasoning="6 times 7"))
        client.chat.completions.create(model="deepseek-reasoner", messages=[user("6*7?")], extra_headers={"X-Conversation-Id": cid})
        client.chat.completions.create(model="deepseek-reasoner", messages=[user("and 6*8?")], extra_headers={"X-Conversation-Id": cid})
        assert upstream.last.messages[1] == {"role": "assistant", "content": "42", "reasoning_content": "6 times 7"}
        client.chat.completions.create(model="gpt-4o-mini", messages=[user("and 6*9?")], extra_headers={"X-Conversation-Id": cid})
        assert upstream.last.messages[1] == {"role": "assistant", "content": "42"}  # another provider: stripped


def test_a_whole_answers_thinking_part_is_reasoning(database_url, upstream_url, upstream, key, cid, db):
    """Mistral's reasoning models answer with content as parts, a ``thinking`` part first: a whole
    answer is stored as its stream is, the thinking as reasoning_content and the text joined --
    sent back as it came, the thinking reached a provider not configured to take reasoning, and
    another provider (OpenAI refuses a part of type thinking: the conversation stuck there)."""
    from .conftest import make_settings, serve_proxy

    settings = make_settings(database_url, upstream_url, upstreams=[
        {"name": "thinker", "base_url": upstream_url, "models": ["magistral-*"], "accepts_reasoning": True},
        {"name": "plain", "base_url": upstream_url, "models": ["*"]},
    ])
    parts = [{"type": "thinking", "thinking": [{"type": "text", "text": "the chain "}, {"type": "text", "text": "of it"}]},
             {"type": "text", "text": "Hello "}, {"type": "text", "text": "world"}]
    answer = {"role": "assistant", "content": "Hello world", "reasoning_content": "the chain of it"}
    with serve_proxy(settings) as p:
        client = p.openai(key)
        upstream.enqueue(Reply(extra_message={"content": parts}))
        first, h1 = say(client, cid, user("hi"), model="magistral-medium-latest")
        assert first.choices[0].message.content == parts  # (the client gets the answer as it came)
        stored = db.node(h1["x-node-id"])["received"][0]
        assert {k: stored[k] for k in ("content", "reasoning_content")} == {k: answer[k] for k in ("content", "reasoning_content")}
        say(client, cid, user("next"), model="magistral-medium-latest")
        assert upstream.last.messages[1] == answer
        say(client, cid, user("and then?"), model="gpt-4o-mini")
        assert upstream.last.messages[1] == {"role": "assistant", "content": "Hello world"}


SIGNATURE = {"google": {"thought_signature": "EjQKMgEMOdbHJChLX75QUCJj"}}


def test_a_tool_calls_signature_goes_back_only_to_the_provider_that_made_it(database_url, upstream_url, upstream,
                                                                            key, cid):
    """Gemini's OpenAI-compatible endpoint signs a tool call (``extra_content.google.
    thought_signature``) and refuses the next call when the call comes back without it -- with or
    without ``accepts_reasoning``, so the signature goes back to the provider that made it
    whatever it accepts; another provider (which knows no such field) never gets it."""
    from .conftest import make_settings, serve_proxy

    settings = make_settings(database_url, upstream_url, upstreams=[
        {"name": "gemini", "base_url": upstream_url, "models": ["gemini-*"]},
        {"name": "plain", "base_url": upstream_url, "models": ["*"]},
    ])
    signed = {**tool_call("fc-1"), "extra_content": SIGNATURE}
    with serve_proxy(settings) as p:
        client = p.openai(key)
        upstream.enqueue(Reply(content=None, tool_calls=[signed]))
        say(client, cid, user("q"), model="gemini-3-flash-preview", tools=TOOLS)
        say(client, cid, {"role": "tool", "tool_call_id": "fc-1", "content": "1"}, model="gemini-3-flash-preview",
            tools=TOOLS)
        assert upstream.last.messages[1]["tool_calls"] == [signed]
        say(client, cid, user("and now?"), model="gpt-4o-mini", tools=TOOLS)
        assert upstream.last.messages[1]["tool_calls"] == [tool_call("fc-1")]  # another provider: not sent


@pytest.mark.parametrize("method, path, upstream_path", [
    ("GET", "/v1/chat/completions", "/v1/chat/completions"),
    ("GET", "/c/some-conv/v1/chat/completions", "/v1/chat/completions"),
    ("GET", "/v1/chat/completions/chatcmpl-1", "/v1/chat/completions/chatcmpl-1"),
    ("DELETE", "/c/some-conv/v1/chat/completions/chatcmpl-1", "/v1/chat/completions/chatcmpl-1"),
    ("GET", "/c/some-conv/v1/chat/completions/chatcmpl-1/messages", "/v1/chat/completions/chatcmpl-1/messages"),
    ("POST", "/v1/completions", "/v1/completions"),
    ("GET", "/v1/models/gpt-4o?x=1", "/v1/models/gpt-4o"),
])
def test_every_other_openai_route_passes_through(proxy, upstream, key, db, method, path, upstream_path):
    r = httpx.request(method, proxy.url + path, headers={"Authorization": f"Bearer {key}"},
                      content=b'{"model": "m"}' if method == "POST" else None)
    assert upstream.requests[-1].path == upstream_path and upstream.requests[-1].method == method
    assert r.headers["x-request-id"] == "req_fake"  # the upstream's own answer, relayed
    assert stored(db, key) == (0, 0)


def _two_choices(model: str) -> dict:
    first = {"role": "assistant", "content": "first choice", "refusal": None}
    second = {"role": "assistant", "content": "second choice", "refusal": None}
    return {"id": "chatcmpl-n2", "object": "chat.completion", "created": 0, "model": model,
            "choices": [{"index": 0, "message": first, "logprobs": None, "finish_reason": "stop"},
                        {"index": 1, "message": second, "logprobs": None, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11}}


def test_several_choices_reach_the_client_and_the_first_becomes_context(client, upstream, cid, db):
    upstream.enqueue(Reply(kind="raw", body=json.dumps(_two_choices(MODEL)).encode()))
    c1, h1 = say(client, cid, user("two answers please"), n=2)
    assert upstream.last.body["n"] == 2
    assert [c.message.content for c in c1.choices] == ["first choice", "second choice"]
    node = db.node(h1["x-node-id"])
    assert [m["content"] for m in node["received"]] == ["first choice"]
    assert node["finish_reason"] == "stop" and node["usage"]["completion_tokens"] == 6
    say(client, cid, user("go on"))
    assert [m["content"] for m in upstream.last.messages] == ["two answers please", "first choice", "go on"]


def test_the_choice_of_index_0_becomes_context_wherever_it_stands_in_the_list(client, upstream, cid, db):
    """choices are keyed by ``index``: a body listing choice 1 before choice 0 still stores choice 0
    (docs/behaviour.md: "the node stores the first (``index`` 0)")."""
    body = _two_choices(MODEL)
    body["choices"].reverse()
    upstream.enqueue(Reply(kind="raw", body=json.dumps(body).encode()))
    _, h1 = say(client, cid, user("two answers please"), n=2)
    node = db.node(h1["x-node-id"])
    assert [m["content"] for m in node["received"]] == ["first choice"] and node["finish_reason"] == "stop"
    say(client, cid, user("go on"))
    assert [m["content"] for m in upstream.last.messages] == ["two answers please", "first choice", "go on"]


def test_several_streamed_choices_reach_the_client_and_the_first_becomes_context(client, upstream, cid, db):
    def chunk(index: int, delta: dict, finish: str | None = None) -> bytes:
        body = {"id": "chatcmpl-n2", "object": "chat.completion.chunk", "created": 0, "model": MODEL,
                "choices": [{"index": index, "delta": delta, "finish_reason": finish}]}
        return b"data: " + json.dumps(body).encode() + b"\n\n"

    events = [chunk(0, {"role": "assistant", "content": ""}), chunk(1, {"role": "assistant", "content": ""}),
              chunk(0, {"content": "first "}), chunk(1, {"content": "second "}),
              chunk(1, {"content": "choice"}), chunk(0, {"content": "choice"}),
              chunk(1, {}, "length"), chunk(0, {}, "stop"), b"data: [DONE]\n\n"]
    upstream.enqueue(Reply(kind="raw", body=b"".join(events), content_type="text/event-stream"))
    stream, h1 = say(client, cid, user("two answers please"), n=2, stream=True)
    text = {0: "", 1: ""}
    for part in stream:
        for choice in part.choices:
            text[choice.index] += choice.delta.content or ""
    assert text == {0: "first choice", 1: "second choice"}
    node = db.node(h1["x-node-id"])
    assert node["status"] == "success" and node["finish_reason"] == "stop"
    assert [m["content"] for m in node["received"]] == ["first choice"]
    say(client, cid, user("go on"))
    assert [m["content"] for m in upstream.last.messages] == ["two answers please", "first choice", "go on"]


def test_a_stored_calls_body_goes_out_without_the_headers_of_the_clients(proxy, upstream, key, cid):
    """A stored call's upstream body is the proxy's own JSON: the client's Content-Encoding (a
    label its body did not even need) and Content-Type do not travel with it; a pass-through's
    body is the client's, and they do."""
    body = json.dumps({"model": MODEL, "messages": [user("hi")]}).encode()
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "text/plain", "Content-Encoding": "identity"}
    r = httpx.post(f"{proxy.url}/v1/chat/completions", content=body, headers={**headers, "X-Conversation-Id": cid})
    assert r.status_code == 200, r.text
    got = {k.lower(): v for k, v in upstream.last.headers.items()}
    assert got["content-type"] == "application/json" and "content-encoding" not in got
    r = httpx.post(f"{proxy.url}/v1/chat/completions", content=body, headers=headers)
    got = {k.lower(): v for k, v in upstream.last.headers.items()}
    assert r.status_code == 200 and got["content-type"] == "text/plain" and got["content-encoding"] == "identity"


def _audio(expires_in: int = 3600) -> dict:
    import time
    return {"id": "audio_abc123", "data": "UklGRiQAAABXQVZF", "expires_at": int(time.time()) + expires_in,
            "transcript": "The capital of France is Paris."}


def _sse(*deltas: dict) -> bytes:
    chunks = [{"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 1, "model": MODEL,
               "choices": [{"index": 0, "delta": d, "finish_reason": "stop" if not d else None}]} for d in deltas]
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


AUDIO_ASKED = {"modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "wav"}}


def test_an_audio_answer_goes_back_as_its_reference_and_once_expired_as_its_words(client, upstream, cid):
    """An audio answer (``content`` null, ``audio`` with an id, the data and a transcript) is the
    model's turn: the next call sends it back to the provider that made it as ``audio: {"id"}``,
    as OpenAI's API takes an earlier audio answer -- and once the provider no longer keeps it
    (``expires_at``), as its transcript. Never an empty turn."""
    upstream.enqueue(Reply(content=None, extra_message={"audio": _audio()}))
    first, _ = say(client, cid, user("capital of France?"), **AUDIO_ASKED)
    assert first.choices[0].message.audio.transcript == "The capital of France is Paris."
    say(client, cid, user("and of Spain?"), **AUDIO_ASKED)
    assert upstream.last.messages[1] == {"role": "assistant", "audio": {"id": "audio_abc123"}, "content": None}
    other = f"{cid}-expired"
    upstream.enqueue(Reply(content=None, extra_message={"audio": _audio(expires_in=-5)}))
    say(client, other, user("capital of France?"), **AUDIO_ASKED)
    say(client, other, user("and of Spain?"))
    assert upstream.last.messages[1] == {"role": "assistant", "content": "The capital of France is Paris."}


def test_a_full_history_client_sends_its_audio_answer_back_by_its_reference(client, upstream, cid):
    full = {"X-Context-Mode": "full"}
    upstream.enqueue(Reply(content=None, extra_message={"audio": _audio()}))
    say(client, cid, user("capital of France?"), headers=full, **AUDIO_ASKED)
    _, h = say(client, cid, user("capital of France?"), {"role": "assistant", "audio": {"id": "audio_abc123"}},
               user("and of Spain?"), headers=full, **AUDIO_ASKED)
    assert h["x-context-matched"] == "2"
    assert upstream.last.messages[1] == {"role": "assistant", "audio": {"id": "audio_abc123"}, "content": None}


def test_a_streamed_audio_answer_is_stored_as_the_whole_one_is(client, upstream, cid, db):
    """OpenAI streams an audio answer as deltas: the id and an empty transcript, the transcript's
    and the data's pieces, the expiry. Stored, they are the one ``audio`` a non-streamed answer
    has (each delta replaced the one before: the id, the transcript and the data were lost)."""
    audio = _audio()
    upstream.enqueue(Reply(kind="raw", content_type="text/event-stream", body=_sse(
        {"role": "assistant", "content": None, "audio": {"id": audio["id"], "transcript": ""}},
        {"audio": {"transcript": "The capital "}}, {"audio": {"transcript": "of France is Paris."}},
        {"audio": {"data": "UklGRiQA"}}, {"audio": {"data": "AABXQVZF"}}, {"audio": {"expires_at": audio["expires_at"]}},
        {})))
    stream, h = say(client, cid, user("capital of France?"), stream=True, **AUDIO_ASKED)
    list(stream)
    assert db.node(h["x-node-id"])["received"][0]["audio"] == audio


def test_a_stored_call_keeps_the_key_order_of_its_schemas(proxy, upstream, key, cid):
    """OpenAI's Structured Outputs write an answer's keys in the order of the schema's properties
    (a ``reasoning`` key first: thought out before the answer), and a tool's parameters reach the
    model in their order: a stored call's body keeps the client's order there, as a pass-through
    does -- for the call, for ``/request``'s rebuild (verified) and for the next turn's body,
    which still begins with the previous one byte for byte."""
    from .helpers import prefix_extends

    schema = {"type": "object", "properties": {"reasoning": {"type": "string"}, "answer": {"type": "string"}},
              "required": ["reasoning", "answer"], "additionalProperties": False}
    fields = {"response_format": {"type": "json_schema", "json_schema": {"name": "step", "strict": True, "schema": schema}},
              "tools": [{"type": "function", "function": {"name": "f", "parameters": schema}}],
              "stream_options": {"include_usage": False, "include_obfuscation": False}}

    def properties(body):
        return (list(body["response_format"]["json_schema"]["schema"]["properties"]),
                list(body["tools"][0]["function"]["parameters"]["properties"]))

    client = proxy.openai(key, conversation=cid)
    bodies = []
    for text, stream in (("first", False), ("second", False), ("third", True)):
        extra = dict(fields) if stream else {k: v for k, v in fields.items() if k != "stream_options"}
        raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=[user(text)], stream=stream, **extra)
        list(raw.parse()) if stream else raw.parse()
        sent = upstream.last.raw
        assert properties(json.loads(sent)) == (["reasoning", "answer"], ["reasoning", "answer"])
        replay = proxy.http(key).get(f"/admin/nodes/{raw.headers['x-node-id']}/request")
        assert replay.headers["x-request-verified"] == "true" and replay.content == sent
        bodies.append(sent)
    assert prefix_extends(bodies[0], bodies[1])
    assert json.loads(bodies[2])["stream_options"] == {"include_usage": True, "include_obfuscation": False}
