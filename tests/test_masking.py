"""Credentials an upstream echoes in a successful answer are masked in what the client gets and in
what is stored (docs/behaviour.md#limits-and-hostile-peers) -- however a stream cuts them -- for
the operator's upstream key (keys mode) and the client's own key (passthrough)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.dialects.responses.relayed import Deltas
from proxy.secrets import MASK, BytesMasker, Masker, TextMasker

from .anthropic_fake import AReply
from .conftest import Db, proxy_with
from .fakes import Reply, completion
from .helpers import MODEL, tool_call, user

UPSTREAM_KEY = "sk-upstream-secret-0123456789"
ALICE = "sk-proxy-alice-0123456789"


@pytest.fixture
def keys_proxy(fresh_database_url, upstream_url, claude_server):
    yield from proxy_with(fresh_database_url, upstream_url,
                          auth={"mode": "keys", "keys": [{"key": ALICE, "tenant": "alice"}]},
                          upstreams=[{"name": "anthropic", "base_url": claude_server[1].url + "/v1",
                                      "models": ["claude-*"], "api": "anthropic", "api_key": UPSTREAM_KEY},
                                     {"name": "native", "base_url": upstream_url, "models": ["native-*"],
                                      "api": "responses", "api_key": UPSTREAM_KEY},
                                     {"name": "fake", "base_url": upstream_url, "models": ["*"],
                                      "api_key": UPSTREAM_KEY}])


def _post(proxy, key: str, cid: str, path: str, body: dict) -> httpx.Response:
    with httpx.Client(base_url=proxy.url, timeout=30) as http:
        return http.post(path, json=body, headers={"Authorization": f"Bearer {key}", "X-Conversation-Id": cid})


def _stored(db: Db, node_id: str) -> str:
    return json.dumps(db.fetchval("SELECT received FROM nodes WHERE id = $1::uuid", node_id))


def test_a_key_echoed_in_an_answer_is_masked_for_the_client_and_in_storage(keys_proxy, upstream, cid):
    upstream.enqueue(Reply(content=f"Your key is {UPSTREAM_KEY}, keep it safe.",
                           tool_calls=[tool_call("call_1", args=json.dumps({"key": UPSTREAM_KEY}))]))
    r = _post(keys_proxy, ALICE, cid, "/v1/chat/completions", {"model": MODEL, "messages": [user("my key?")]})
    assert r.status_code == 200, r.text
    message = r.json()["choices"][0]["message"]
    assert message["content"] == f"Your key is {MASK}, keep it safe."
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {"key": MASK}
    stored = _stored(keys_proxy.db, r.headers["x-node-id"])
    assert UPSTREAM_KEY not in stored and MASK in stored


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", {"model": MODEL, "messages": [user("my key?")], "stream": True}),
    ("/v1/responses", {"model": MODEL, "input": "my key?", "stream": True}),  # a Responses client, chat upstream
])
def test_a_key_streamed_in_pieces_is_masked_however_the_deltas_cut_it(keys_proxy, upstream, cid, path, body):
    # token by token, as a model writes it: no delta holds the key, nor even its start
    pieces = ["Your key is s", "k-ups", "tream-secr", "et-01234", "56789", ". And s", "o on."]
    upstream.enqueue(Reply(kind="stream", pieces=pieces))
    r = _post(keys_proxy, ALICE, cid, path, body)
    assert r.status_code == 200
    text = r.text
    assert UPSTREAM_KEY not in text
    deltas = []
    for line in text.splitlines():
        if line.startswith("data: {"):
            event = json.loads(line[6:])
            if "choices" in event:
                deltas += [c["delta"].get("content") or "" for c in event["choices"] if "delta" in c]
            elif event.get("type") == "response.output_text.delta":
                deltas.append(event["delta"])
    assert "".join(deltas) == f"Your key is {MASK}. And so on."  # nothing lost, nothing doubled
    stored = _stored(keys_proxy.db, r.headers["x-node-id"])
    assert UPSTREAM_KEY not in stored and MASK in stored


def test_a_key_whole_in_a_streamed_event_is_masked_in_any_field(keys_proxy, upstream, cid):
    """A chat stream to a chat client masked the key in its text fields only (cut across deltas
    or not): whole in one event but in another field -- a tool call's name, an audio transcript,
    OpenRouter's reasoning_details -- it reached the client and storage, where an answer read
    whole is masked everywhere."""
    def event(delta: dict, finish: str | None = None) -> bytes:
        return b"data: " + json.dumps({"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": MODEL,
                                        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}).encode() + b"\n\n"

    body = b"".join([
        event({"role": "assistant", "content": "ok",
               "reasoning_details": [{"type": "reasoning.text", "text": f"the key {UPSTREAM_KEY}"}],
               "audio": {"id": "audio_1", "transcript": f"said {UPSTREAM_KEY}"}}),
        event({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                               "function": {"name": f"fn_{UPSTREAM_KEY}", "arguments": "{}"}}]}),
        event({}, "tool_calls"), b"data: [DONE]\n\n"])
    upstream.enqueue(Reply(kind="raw", content_type="text/event-stream", body=body))
    r = _post(keys_proxy, ALICE, cid, "/v1/chat/completions",
              {"model": MODEL, "messages": [user("my key?")], "stream": True})
    assert r.status_code == 200 and UPSTREAM_KEY not in r.text and MASK in r.text, r.text
    stored = json.dumps(keys_proxy.db.fetchval("SELECT received FROM nodes WHERE id = $1::uuid", r.headers["x-node-id"]))
    assert UPSTREAM_KEY not in stored and MASK in stored


def test_a_responses_upstream_echoing_the_key_is_masked_in_the_answer_and_storage(keys_proxy, upstream, cid):
    upstream.enqueue(Reply(content=f"key: {UPSTREAM_KEY}"))
    r = _post(keys_proxy, ALICE, cid, "/v1/responses", {"model": "native-1", "input": "my key?"})
    assert r.status_code == 200, r.text
    assert UPSTREAM_KEY not in r.text and MASK in r.text
    assert UPSTREAM_KEY not in _stored(keys_proxy.db, r.headers["x-node-id"])
    upstream.enqueue(Reply(kind="stream", content=f"key: {UPSTREAM_KEY}", pieces=[f"key: {UPSTREAM_KEY}"]))
    r = _post(keys_proxy, ALICE, cid, "/v1/responses", {"model": "native-1", "input": "again?", "stream": True})
    assert r.status_code == 200 and UPSTREAM_KEY not in r.text and MASK in r.text
    assert UPSTREAM_KEY not in _stored(keys_proxy.db, r.headers["x-node-id"])


def test_in_passthrough_the_clients_own_key_echoed_back_is_masked(proxy, upstream, key, cid, db):
    upstream.enqueue(Reply(content=f"you sent {key}"))
    r = _post(proxy, key, cid, "/v1/chat/completions", {"model": MODEL, "messages": [user("echo")]})
    assert r.status_code == 200 and key not in r.text
    assert r.json()["choices"][0]["message"]["content"] == f"you sent {MASK}"
    assert key not in _stored(db, r.headers["x-node-id"])


@pytest.mark.parametrize("stream", [False, True])
def test_a_pass_through_answer_echoing_a_key_is_masked(keys_proxy, upstream, stream):
    """No conversation named: the answer is relayed untouched but for the credentials -- the
    operator's upstream key echoed in its bytes never reaches a client (however the transport
    cuts them: ``test_bytes_masker_equals_masking_the_whole_body``)."""
    pieces = ["Your key is ", UPSTREAM_KEY, ". And so on."]
    upstream.enqueue(Reply(kind="stream", pieces=pieces) if stream else Reply(content=f"Your key is {UPSTREAM_KEY}."))
    with httpx.Client(base_url=keys_proxy.url, timeout=30) as http:
        r = http.post("/v1/chat/completions", headers={"Authorization": f"Bearer {ALICE}"},
                      json={"model": MODEL, "messages": [user("my key?")], "stream": stream})
    assert r.status_code == 200 and "x-node-id" not in r.headers
    assert UPSTREAM_KEY not in r.text and MASK in r.text
    if not stream:
        assert r.json()["choices"][0]["message"]["content"] == f"Your key is {MASK}."


def _joined(text: str) -> dict[str, str]:
    """The texts a client's stream adds up to, each as the client joins its deltas: a chat
    choice's content, a Responses part's text, an Anthropic block's text or tool input."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if not line.startswith("data: {"):
            continue
        event = json.loads(line[6:])
        for c in event.get("choices") or ():
            out["content"] = out.get("content", "") + (c["delta"].get("content") or "")
        if event.get("type") == "response.output_text.delta":
            out["content"] = out.get("content", "") + event["delta"]
        if event.get("type") == "content_block_delta":
            delta = event["delta"]
            name = f"block {event['index']}"
            out[name] = out.get(name, "") + (delta.get("text") or delta.get("partial_json") or "")
    return out


@pytest.mark.parametrize("route", ["chat", "responses"])
def test_a_pass_through_stream_is_masked_however_its_deltas_cut_the_key(keys_proxy, upstream, route):
    """No conversation named: the stream was masked in its bytes only, and the operator's key
    spelled out over several deltas reached the client in pieces -- its joined text held the key.
    Its text is masked across the deltas now, as a stored stream's: nothing around the key lost or
    doubled (the text ends in what may begin the key: given out at the end), and a Responses
    stream keeps every event, its sequence numbers the upstream's."""
    text = f"Your key is {UPSTREAM_KEY}. And so on, sk-up"
    if route == "chat":
        upstream.enqueue(Reply(kind="stream", pieces=["Your key is s", "k-ups", "tream-secr", "et-01234", "56789",
                                                      ". And s", "o on, s", "k-up"]))
        path, body = "/v1/chat/completions", {"model": MODEL, "messages": [user("my key?")], "stream": True}
    else:
        upstream.enqueue(Reply(kind="raw", content_type="text/event-stream", body=_responses_events(text)))
        path, body = "/v1/responses", {"model": "native-1", "input": "my key?", "stream": True}
    with httpx.Client(base_url=keys_proxy.url, timeout=30) as http:
        r = http.post(path, json=body, headers={"Authorization": f"Bearer {ALICE}"})
    assert r.status_code == 200 and "x-node-id" not in r.headers
    assert upstream.requests[-1].headers["authorization"] == f"Bearer {UPSTREAM_KEY}"  # (what it had to echo)
    assert UPSTREAM_KEY not in r.text
    assert _joined(r.text)["content"] == text.replace(UPSTREAM_KEY, MASK)
    if route == "responses":
        events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
        assert [e["sequence_number"] for e in events] == list(range(_responses_events(text).count(b"\n\n")))


def test_a_pass_through_anthropic_stream_is_masked_however_its_deltas_cut_the_key(keys_proxy, claude):
    """An Anthropic upstream's stream passed through (no conversation named) writes its text four
    characters a delta and a tool's input five: the operator's key in either reached the client's
    joined text whole. Masked across the deltas of each block now, the rest of the text intact."""
    text, tool_input = f"key {UPSTREAM_KEY} end, sk", {"key": UPSTREAM_KEY}
    claude.enqueue(AReply(content=[{"type": "text", "text": text},
                                   {"type": "tool_use", "id": "toolu_1", "name": "save", "input": tool_input}],
                          stop_reason="tool_use"))
    with httpx.Client(base_url=keys_proxy.url, timeout=30) as http:
        r = http.post("/v1/messages", headers={"Authorization": f"Bearer {ALICE}"},
                      json={"model": "claude-x", "max_tokens": 10, "stream": True, "messages": [user("my key?")]})
    assert r.status_code == 200 and "x-node-id" not in r.headers
    assert claude.last.headers["x-api-key"] == UPSTREAM_KEY
    assert UPSTREAM_KEY not in r.text
    joined = _joined(r.text)
    assert joined["block 0"] == f"key {MASK} end, sk"
    assert json.loads(joined["block 1"]) == {"key": MASK}


def test_a_pass_through_stream_masks_the_clients_own_key_across_deltas(proxy, upstream, key):
    """Passthrough auth: the client's own key, spelled out by the model over two deltas of a
    stream passed through, reached the client's joined text whole; masked now."""
    half = len(key) // 2
    upstream.enqueue(Reply(kind="stream", pieces=[f"you sent {key[:half]}", f"{key[half:]} ok"]))
    r = httpx.post(f"{proxy.url}/v1/chat/completions", headers={"Authorization": f"Bearer {key}"}, timeout=30,
                   json={"model": MODEL, "messages": [user("my key?")], "stream": True})
    assert r.status_code == 200 and "x-node-id" not in r.headers
    assert upstream.last.headers["authorization"] == f"Bearer {key}"
    assert key not in r.text and key[:half] not in r.text
    assert _joined(r.text)["content"] == f"you sent {MASK} ok"


def test_a_responses_upstreams_stream_is_masked_across_deltas_for_a_responses_client(keys_proxy, upstream, cid):
    """A stored call to a Responses upstream, streamed to a Responses client: each event was
    masked whole, so the key cut across output_text.delta events reached the client's deltas in
    pieces (the done event and the stored answer had it masked). Its deltas join to the text with
    the key masked now -- as the done event says it -- nothing lost or doubled."""
    text = f"so: {UPSTREAM_KEY}, then sk-up"
    upstream.enqueue(Reply(kind="raw", content_type="text/event-stream", body=_responses_events(text)))
    r = _post(keys_proxy, ALICE, cid, "/v1/responses", {"model": "native-1", "input": "my key?", "stream": True})
    assert r.status_code == 200 and UPSTREAM_KEY not in r.text
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    done = [e["text"] for e in events if e["type"] == "response.output_text.done"]
    assert _joined(r.text)["content"] == text.replace(UPSTREAM_KEY, MASK) == done[0]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert UPSTREAM_KEY not in _stored(keys_proxy.db, r.headers["x-node-id"])


@pytest.mark.parametrize(("named", "reply"), [
    (True, Reply()), (True, Reply(kind="stream")), (True, Reply(kind="error", status=401)),
    (False, Reply()), (False, Reply(kind="stream")), (False, Reply(kind="error", status=401)),
])
def test_a_key_echoed_in_an_upstream_response_header_is_masked(keys_proxy, upstream, cid, named, reply):
    """An upstream that says the Authorization it got back in a header (its own, or a
    WWW-Authenticate): the operator's key never reaches the client there either -- stored calls,
    streams, errors, and calls passed through."""
    reply.headers = [("x-echo", f"Bearer {UPSTREAM_KEY}"), ("www-authenticate", f'Bearer realm="{UPSTREAM_KEY}"')]
    upstream.enqueue(reply)
    with httpx.Client(base_url=keys_proxy.url, timeout=30) as http:
        r = http.post("/v1/chat/completions", json={"model": MODEL, "messages": [user("q")], "stream": reply.kind == "stream"},
                      headers={"Authorization": f"Bearer {ALICE}", **({"X-Conversation-Id": cid} if named else {})})
    assert upstream.last.headers["authorization"] == f"Bearer {UPSTREAM_KEY}"  # (what the upstream had to echo)
    assert r.headers["x-echo"] == f"Bearer {MASK}" and r.headers["www-authenticate"] == f'Bearer realm="{MASK}"'
    assert UPSTREAM_KEY not in str(r.headers)


def _responses_events(text: str) -> bytes:
    """A Responses upstream's event stream writing ``text`` three characters a delta."""
    response = {"id": "resp_u", "object": "response", "created_at": 1, "status": "in_progress", "model": "native-1",
                "output": [], "usage": None}
    item = {"id": "msg_1", "type": "message", "role": "assistant", "status": "in_progress", "content": []}
    done = {**item, "status": "completed", "content": [{"type": "output_text", "text": text, "annotations": []}]}
    where = {"item_id": "msg_1", "output_index": 0, "content_index": 0}
    events = [("response.created", {"response": response}),
              ("response.output_item.added", {"output_index": 0, "item": item}),
              ("response.content_part.added", {**where, "part": {"type": "output_text", "text": "", "annotations": []}}),
              *[("response.output_text.delta", {**where, "delta": text[i:i + 3]}) for i in range(0, len(text), 3)],
              ("response.output_text.done", {**where, "text": text}),
              ("response.output_item.done", {"output_index": 0, "item": done}),
              ("response.completed", {"response": {**response, "status": "completed", "output": [done],
                                                   "usage": {"input_tokens": 3, "output_tokens": 3, "total_tokens": 6}}})]
    return b"".join(f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': n, **data})}\n\n".encode()
                    for n, (kind, data) in enumerate(events))


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
def test_a_responses_upstreams_stream_is_masked_across_deltas_for_a_chat_or_messages_client(
        keys_proxy, upstream, cid, path):
    """A Responses upstream's text deltas that cut the key: a chat client gets no done events, only
    the deltas -- they join to the text with the key masked, as an Anthropic client's do."""
    upstream.enqueue(Reply(kind="raw", content_type="text/event-stream", body=_responses_events(f"key {UPSTREAM_KEY} end")))
    r = _post(keys_proxy, ALICE, cid, path, {"model": "native-1", "stream": True, "messages": [user("k?")],
                                             "max_tokens": 10})
    assert r.status_code == 200 and UPSTREAM_KEY not in r.text
    text = ""
    for line in r.text.splitlines():
        if line.startswith("data: {"):
            event = json.loads(line[6:])
            text += "".join(c["delta"].get("content") or "" for c in event.get("choices") or ())
            if isinstance(event.get("delta"), dict):
                text += event["delta"].get("text") or ""
    assert text == f"key {MASK} end"  # nothing lost, nothing doubled
    assert UPSTREAM_KEY not in _stored(keys_proxy.db, r.headers["x-node-id"])


def test_a_summary_echoing_the_key_is_masked_where_stored_shown_and_sent_on(keys_proxy, upstream, cid):
    """A summariser answer is an answer like any other: the operator's key it echoes is masked
    before the summary is stored -- so neither the conversation's path nor the later turns'
    requests (the summary goes upstream with each) hold it."""
    http = keys_proxy.http(ALICE)
    for i in range(4):
        r = http.post("/v1/chat/completions", headers={"X-Conversation-Id": cid},
                      json={"model": MODEL, "messages": [user(f"turn {i} " + "words " * 30)]})
        assert r.status_code == 200, r.text
    upstream.enqueue_summary(Reply(content=f"Facts: the account key is {UPSTREAM_KEY}."))
    r = http.post(f"/admin/conversations/{cid}/compact")
    assert r.status_code == 200 and r.json()["compacted"], r.text
    assert upstream.summariser_requests[-1].headers["authorization"] == f"Bearer {UPSTREAM_KEY}"
    path = http.get(f"/admin/conversations/{cid}/path").text
    assert UPSTREAM_KEY not in path and f"the account key is {MASK}" in path
    stored = json.dumps([dict(row) for row in keys_proxy.db.fetch("SELECT * FROM nodes")], default=str)
    assert UPSTREAM_KEY not in stored
    r = http.post("/v1/chat/completions", headers={"X-Conversation-Id": cid},
                  json={"model": MODEL, "messages": [user("and now?")]})
    assert r.status_code == 200, r.text
    sent = upstream.last.raw.decode()
    assert f"the account key is {MASK}" in sent and UPSTREAM_KEY not in sent


def test_a_compact_answer_echoing_the_key_is_masked(keys_proxy, upstream):
    """/v1/responses/compact gives the summary to the client: the operator's key the summariser
    echoed is masked there too."""
    upstream.enqueue_summary(Reply(content=f"Facts: the account key is {UPSTREAM_KEY}."))
    r = keys_proxy.http(ALICE).post("/v1/responses/compact", json={"model": MODEL, "input": [
        {"role": "user", "content": "hello " * 40}, {"role": "assistant", "content": "hi " * 40},
        {"role": "user", "content": "more " * 40}]})
    assert r.status_code == 200, r.text
    assert upstream.summariser_requests, "no summary was made"
    assert UPSTREAM_KEY not in r.text and f"the account key is {MASK}" in r.text


SLASHED = "sk-live/Ab12+Cd34/Ef56Gh78Ij90"  # a key with characters JSON writers escape


def _escaped(data: dict) -> bytes:
    """JSON as PHP's json_encode writes it (and some Java and .NET serialisers): the solidus escaped."""
    return json.dumps(data).replace("/", "\\/").encode()


@pytest.mark.parametrize("named", [True, False])
def test_a_key_echoed_json_escaped_in_an_answer_is_masked(proxy, upstream, cid, db, named):
    """The parser decodes ``\\/`` (or any ``\\u`` escape) back into the key: an echo the upstream
    escaped is masked as the bare one is -- in the client's answer and the stored one, and in the
    bytes of an answer passed through."""
    upstream.enqueue(Reply(kind="raw", body=_escaped(completion(Reply(content=f"you sent {SLASHED}"), MODEL, 5))))
    r = httpx.post(f"{proxy.url}/v1/chat/completions", json={"model": MODEL, "messages": [user("echo")]}, timeout=30,
                   headers={"Authorization": f"Bearer {SLASHED}", **({"X-Conversation-Id": cid} if named else {})})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == f"you sent {MASK}"
    if named:
        assert SLASHED not in json.dumps(db.node(r.headers["x-node-id"])["received"])


def test_a_key_echoed_json_escaped_in_an_error_is_masked(proxy, upstream, cid, db):
    """An upstream's error that quotes the key it refused, escaped: masked for the client and in
    the node's stored error."""
    upstream.enqueue(Reply(kind="raw", status=401, body=_escaped({"error": {
        "message": f"Incorrect API key provided: {SLASHED}", "type": "invalid_request_error", "code": "invalid_api_key"}})))
    r = httpx.post(f"{proxy.url}/v1/chat/completions", json={"model": MODEL, "messages": [user("echo")]}, timeout=30,
                   headers={"Authorization": f"Bearer {SLASHED}", "X-Conversation-Id": cid})
    assert r.status_code == 401
    assert r.json()["error"]["message"] == f"Incorrect API key provided: {MASK}"
    assert SLASHED not in json.dumps(db.node(r.headers["x-node-id"])["error"])


OPERATOR = "ABSKQmVkcm9ja0FQSUtleS/0123+abcdEFGH="  # base64, as Bedrock's long-term API keys are


@pytest.fixture
def operator_proxy(fresh_database_url, upstream_url):
    yield from proxy_with(fresh_database_url, upstream_url,
                          auth={"mode": "keys", "keys": [{"key": ALICE, "tenant": "alice"}]},
                          upstreams=[{"name": "fake", "base_url": upstream_url, "models": ["*"], "api_key": OPERATOR}])


@pytest.mark.parametrize("escape", ["\\/", "\\u002F", "\\u002f"])
def test_the_operators_key_echoed_json_escaped_never_reaches_a_tenant(operator_proxy, upstream, cid, escape):
    """The operator's key with ``/``, ``+`` and ``=`` in it, echoed with its ``/`` escaped (PHP)
    or as a ``\\u`` escape, its ``+`` as .NET writes it and its ``=`` as Gson does: masked in the
    error the tenant gets."""
    body = json.dumps({"error": {"message": f"Invalid key {OPERATOR}", "type": "invalid_request_error"}})
    body = body.replace("/", escape).replace("+", "\\u002B").replace("=", "\\u003d")
    upstream.enqueue(Reply(kind="raw", status=401, body=body.encode()))
    r = operator_proxy.http(ALICE).post("/v1/chat/completions", json={"model": MODEL, "messages": [user("x")]},
                                        headers={"X-Conversation-Id": cid})
    assert upstream.last.headers["authorization"] == f"Bearer {OPERATOR}"
    assert r.json()["error"]["message"] == f"Invalid key {MASK}"


@given(st.lists(st.sampled_from([b"hello ", b"s", b"sk-", b"sk-upstream", b"abcab", b"c", b"d ", b"\\", b"\"", b"x\n\n",
                                 b"sk-upstream-secret-0123456789", b"a\"b\\c-secret", b"sk-abcdef", b"-longer",
                                 b"XXsecr", b"etYY", b"secret", b"sk\\u002d", b"sk\\u002Dabcdef", b"ab/c", b"ab\\/c", b"ab\\u00",
                                 b"2fc+d", b"2Fc\\u002bd"]), max_size=12),
       st.lists(st.integers(min_value=0, max_value=400), max_size=8))
def test_bytes_masker_equals_masking_the_whole_body(words, cuts):
    # (one credential may begin another, or hold it: "sk-abcdef" / "sk-abcdef-longer", "secret" / "XXsecretYY";
    # and any may come JSON-escaped, cut in the middle of an escape)
    secrets = ["sk-upstream-secret-0123456789", 'a"b\\c-secret', "abcabcabd", "sk-abcdef", "sk-abcdef-longer",
               "secret", "XXsecretYY", "ab/c+d"]
    body = b"".join(words)
    points = sorted({c % (len(body) + 1) for c in cuts})
    masker = BytesMasker(secrets)
    out = b"".join(masker.feed(body[a:b]) for a, b in zip([0, *points], [*points, len(body)])) + masker.flush()
    assert out == Masker(secrets).bytes(body)


def test_an_answer_without_credentials_is_relayed_byte_for_byte(proxy, upstream, key, cid):
    # the mask costs nothing where there is nothing to mask: not even a re-encoding
    upstream.enqueue(Reply(kind="stream", pieces=["s", "k-", "not a key", " sk"]))
    r = _post(proxy, key, cid, "/v1/chat/completions", {"model": MODEL, "messages": [user("x")], "stream": True})
    deltas = [json.loads(line[6:])["choices"][0]["delta"].get("content") for line in r.text.splitlines()
              if line.startswith("data: {") and json.loads(line[6:]).get("choices")]
    assert "".join(d or "" for d in deltas) == "sk-not a key sk"


SECRETS = ["sk-upstream-secret-0123456789", "sk-proxy-alice-0123456789", "abcabcabd", "sk-abcdef", "sk-abcdef-longer",
           "secret", "XXsecretYY"]


@given(st.lists(st.sampled_from(["hello ", "s", "sk-", "sk-upstream", "sk-proxy-alice-", "abcab", "c", "d ", "-longer",
                                 "XXsecr", "etYY", *SECRETS]), max_size=12),
       st.lists(st.integers(min_value=0, max_value=400), max_size=8))
def test_text_masker_equals_masking_the_whole_text(words, cuts):
    text = "".join(words)
    points = sorted({c % (len(text) + 1) for c in cuts})
    pieces = [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]
    masker = TextMasker(SECRETS)
    out = "".join(masker.feed("k", p) for p in pieces) + masker.flush("k")
    expected = text
    for secret in sorted(SECRETS, key=len, reverse=True):  # (the longest first, as every masker does)
        expected = expected.replace(secret, MASK)
    assert out == expected
    assert not masker.holding


def _sse(*chunks: dict, done: bool = True) -> bytes:
    body = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)
    return body + (b"data: [DONE]\n\n" if done else b"")


def _chunk(**delta) -> dict:
    return {"id": "c", "object": "chat.completion.chunk", "model": MODEL,
            "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", {"model": MODEL, "messages": [user("k?")], "stream": True}),
    ("/v1/responses", {"model": MODEL, "input": "k?", "stream": True}),
])
def test_held_back_text_is_given_out_when_the_stream_ends_without_a_finishing_chunk(
        keys_proxy, upstream, cid, path, body):
    # the answer ends on what looks like the start of the key, and no chunk finishes the choice
    upstream.enqueue(Reply(kind="raw", content_type="text/event-stream",
                           body=_sse(_chunk(role="assistant", content="ends with sk-ups"),
                                     _chunk(reasoning_content=f"thinks {UPSTREAM_KEY[:9]}"),
                                     _chunk(reasoning_content=f"{UPSTREAM_KEY[9:]} done"))))
    r = _post(keys_proxy, ALICE, cid, path, body)
    assert r.status_code == 200 and UPSTREAM_KEY not in r.text
    text, reasoning = "", ""
    for line in r.text.splitlines():
        if line.startswith("data: {"):
            event = json.loads(line[6:])
            for c in event.get("choices") or ():
                text += c["delta"].get("content") or ""
                reasoning += c["delta"].get("reasoning_content") or ""
            if event.get("type") == "response.output_text.delta":
                text += event["delta"]
    assert text == "ends with sk-ups"  # not a key after all: given out at the end, nothing lost
    if path == "/v1/chat/completions":
        assert reasoning == f"thinks {MASK} done"
    stored = _stored(keys_proxy.db, r.headers["x-node-id"])
    assert UPSTREAM_KEY not in stored and "ends with sk-ups" in stored


@given(st.lists(st.sampled_from(["hello ", "s", "sk-", "sk-upstream", "sk-proxy-alice-", "abcab", "c", "d ", "-longer",
                                 "XXsecr", "etYY", *SECRETS]), max_size=12),
       st.lists(st.integers(min_value=0, max_value=400), max_size=8), st.booleans())
def test_responses_deltas_equal_masking_the_whole_text(words, cuts, two_parts):
    """A Responses stream's deltas, however cut: they join to the text masked whole; and with
    another part's delta among them (which gives out what the first part held) every event still
    goes out once, in order -- none added or dropped, as a pass-through that keeps the upstream's
    sequence numbers needs."""
    text = "".join(words)
    points = sorted({c % (len(text) + 1) for c in cuts})
    events = [{"type": "response.output_text.delta", "item_id": "m", "output_index": 0, "content_index": 0,
               "delta": text[a:b]} for a, b in zip([0, *points], [*points, len(text)], strict=True)]
    if two_parts:  # (a reasoning summary's delta among them: it ends what the first part held)
        events.insert(len(events) // 2, {"type": "response.reasoning_summary_text.delta", "item_id": "r",
                                          "output_index": 0, "summary_index": 0, "delta": "s"})
    events.append({"type": "response.output_text.done", "item_id": "m", "output_index": 0, "content_index": 0})
    for n, event in enumerate(events):
        event["sequence_number"] = n
    deltas = Deltas(SECRETS)
    out = [e for event in events for e in deltas.events(event)] + deltas.rest()
    assert [e["sequence_number"] for e in out] == list(range(len(events)))
    expected = text
    for secret in sorted(SECRETS, key=len, reverse=True):
        expected = expected.replace(secret, MASK)
    assert not deltas.text.holding
    if not two_parts:
        assert "".join(e["delta"] for e in out if e["type"] == "response.output_text.delta") == expected


def _masked_pass_through(path: str, chunks: list[bytes]) -> bytes:
    """What a pass-through stream answering ``path`` gives its client, masked for ``KEY_EVENTS``."""
    from proxy.masked_events import event_masker, masked_events

    async def body():
        for c in chunks:
            yield c

    async def collect() -> bytes:
        return b"".join([c async for c in masked_events(body(), event_masker(path, [KEY_EVENTS]))])

    return asyncio.run(collect())


KEY_EVENTS = "sk-upstream-secret-0123456789"


def test_a_masked_pass_through_stream_whose_lines_end_with_a_cr_ends_its_last_event():
    """Lines ending with a CR alone (the SSE standard allows it): the blank line ending the last
    event is the body's last CR, which the reader holds back for a LF that never comes -- read
    at the body's end, the last event (``response.completed``) goes out whole; it went out without
    its blank line, and an SSE client drops an event never ended."""
    events = [{"type": "response.output_text.delta", "delta": "hi", "sequence_number": 0},
              {"type": "response.completed", "sequence_number": 1, "response": {}}]
    body = b"".join(b"event: " + e["type"].encode() + b"\rdata: " + json.dumps(e).encode() + b"\r\r" for e in events)
    out = _masked_pass_through("responses", [body])
    assert out.endswith(b"\n\n") and out.count(b"data: ") == 2, out


@pytest.mark.parametrize("delta", [
    {"choices": [{"index": [0], "delta": {"content": "x sk-up"}}]},
    {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": {"a": 1}, "function": {"arguments": "{sk-up"}}]}}]},
])
def test_a_masked_pass_through_chat_stream_takes_an_odd_index(delta):
    """An upstream's choice or tool call whose ``index`` is a list or an object (nothing a model
    server should send, but a pass-through judges nothing): masked across deltas all the same --
    it raised (an unhashable key for what is held back), and the client's connection dropped."""
    body = b"data: " + json.dumps(delta).encode() + b"\n\ndata: [DONE]\n\n"
    out = _masked_pass_through("chat/completions", [body])
    assert out.endswith(b"data: [DONE]\n\n") and b"sk-up" in out  # (held, then given out: no key followed)
