"""Streaming through the SDK: chunks relayed as they arrive, the stored message reassembled,
usage captured (and stripped again when the client did not ask), disconnects recorded."""

import json
import threading
import time

import httpx
import pytest

from .conftest import wait_for
from .fakes import Reply
from .helpers import MODEL, say, user


def wait_status(db, node_id, status, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = db.node(node_id)
        if row["status"] == status:
            return row
        time.sleep(0.02)
    raise AssertionError(f"node {node_id} is {db.node(node_id)['status']}, expected {status}")


def stream(client, cid, *messages, **kw):
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=list(messages), stream=True, extra_headers={"X-Conversation-Id": cid}, **kw)
    return raw.headers, list(raw.parse())


def test_stream_is_reassembled_and_stored(client, upstream, cid, db):
    upstream.enqueue(Reply(content="The answer is forty-two.", reasoning="think hard"))
    headers, chunks = stream(client, cid, user("question"))
    assert headers["x-node-id"] and headers["x-conversation-id"] == cid
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "The answer is forty-two."
    # we asked upstream for usage, the client did not: no usage chunk reaches it
    assert upstream.last.body["stream_options"] == {"include_usage": True}
    assert all(c.choices for c in chunks)
    node = wait_status(db, headers["x-node-id"], "success")
    assert node["received"] == [{"role": "assistant", "content": "The answer is forty-two.", "reasoning_content": "think hard"}]
    assert node["usage"]["completion_tokens"] == 7
    assert node["finish_reason"] == "stop"
    assert db.head(cid) == headers["x-node-id"]
    # and it is context for the next turn (reasoning not sent back to this provider)
    client.chat.completions.create(model=MODEL, messages=[user("next")], extra_headers={"X-Conversation-Id": cid})
    assert upstream.last.messages[1] == {"role": "assistant", "content": "The answer is forty-two."}


def test_usage_chunk_kept_when_the_client_asked(client, upstream, cid, db):
    headers, chunks = stream(client, cid, user("q"), stream_options={"include_usage": True})
    usage_chunks = [c for c in chunks if c.usage]
    assert len(usage_chunks) == 1 and usage_chunks[0].usage.completion_tokens == 7
    assert wait_status(db, headers["x-node-id"], "success")["usage"]["completion_tokens"] == 7


def test_usage_on_the_finishing_chunk_is_stripped_too(client, upstream, cid, db):
    """Some servers put the usage on the finishing chunk, beside its choices (not a chunk of its
    own): the client that did not ask gets that chunk without it, and the node keeps it."""
    def chunk(delta, finish=None, **extra):
        return ("data: " + json.dumps({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": MODEL,
                                       "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra})
                + "\n\n").encode()
    usage = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
    upstream.enqueue(Reply(kind="raw", content_type="text/event-stream", body=b"".join([
        chunk({"role": "assistant", "content": "hi"}), chunk({}, "stop", usage=usage), b"data: [DONE]\n\n"])))
    headers, chunks = stream(client, cid, user("q"))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "hi"
    assert [c.choices[0].finish_reason for c in chunks] == [None, "stop"] and all(c.usage is None for c in chunks)
    assert wait_status(db, headers["x-node-id"], "success")["usage"] == usage


def test_streamed_tool_calls_merge_by_index(client, upstream, cid, db):
    calls = [{"id": "call_1", "type": "function", "function": {"name": "run_sql", "arguments": '{"sql": "select * from sales"}'}},
             {"id": "call_2", "type": "function", "function": {"name": "lookup", "arguments": '{"k": "v"}'}}]
    upstream.enqueue(Reply(content=None, tool_calls=calls))
    headers, chunks = stream(client, cid, user("q"))
    node = wait_status(db, headers["x-node-id"], "success")
    assert node["received"][0]["tool_calls"] == calls
    assert node["finish_reason"] == "tool_calls"
    client.chat.completions.create(model=MODEL, extra_headers={"X-Conversation-Id": cid}, messages=[
        {"role": "tool", "tool_call_id": "call_1", "content": "r1"}, {"role": "tool", "tool_call_id": "call_2", "content": "r2"}])
    sent = upstream.last.messages
    assert sent[1]["tool_calls"] == calls and [m["role"] for m in sent] == ["user", "assistant", "tool", "tool"]


def test_a_streamed_tool_calls_other_fields_are_stored_and_go_back(client, upstream, cid, db):
    """A streamed tool call keeps its fields beyond id, type and function -- Gemini's
    ``extra_content`` holds the call's thought signature, without which Gemini refuses the next
    call of the tool round -- and its producer gets them back."""
    signature = {"google": {"thought_signature": "EjQKMgEMOdbHJChLX75QUCJj"}}

    def chunk(delta, finish=None):
        return ("data: " + json.dumps({"id": "g1", "object": "chat.completion.chunk", "created": 1, "model": MODEL,
                                       "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
                + "\n\n").encode()
    upstream.enqueue(Reply(kind="raw", content_type="text/event-stream", body=b"".join([
        chunk({"role": "assistant", "tool_calls": [{"index": 0, "id": "fc-1", "type": "function", "function": {
            "name": "lookup", "arguments": '{"k": '}, "extra_content": signature}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"v"}'}}]}),
        chunk({}, "tool_calls"), b"data: [DONE]\n\n"])))
    headers, _ = stream(client, cid, user("q"))
    call = {"id": "fc-1", "type": "function", "function": {"name": "lookup", "arguments": '{"k": "v"}'},
            "extra_content": signature}
    assert wait_status(db, headers["x-node-id"], "success")["received"][0]["tool_calls"] == [call]
    client.chat.completions.create(model=MODEL, extra_headers={"X-Conversation-Id": cid},
                                   messages=[{"role": "tool", "tool_call_id": "fc-1", "content": "r"}])
    assert upstream.last.messages[1]["tool_calls"] == [call]


def test_tool_call_deltas_without_index_continue_the_last_call(client, upstream, cid, db):
    """Some OpenAI-compatible servers (Gemini's, reportedly) send tool-call deltas without
    ``index``: one that brings neither id nor name is the last call's next arguments, not a call
    of its own (which stored two broken calls); one with an id begins the next call."""
    def chunk(delta, finish=None):
        return ("data: " + json.dumps({"id": "g1", "object": "chat.completion.chunk", "created": 1, "model": MODEL,
                                       "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
                + "\n\n").encode()
    upstream.enqueue(Reply(kind="raw", content_type="text/event-stream", body=b"".join([
        chunk({"role": "assistant", "tool_calls": [{"id": "fc-1", "type": "function",
                                                    "function": {"name": "lookup", "arguments": '{"k": '}}]}),
        chunk({"tool_calls": [{"function": {"arguments": '"v"}'}}]}),
        chunk({"tool_calls": [{"id": "fc-2", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}]}),
        chunk({}, "tool_calls"), b"data: [DONE]\n\n"])))
    headers, _ = stream(client, cid, user("q"))
    assert wait_status(db, headers["x-node-id"], "success")["received"][0]["tool_calls"] == [
        {"id": "fc-1", "type": "function", "function": {"name": "lookup", "arguments": '{"k": "v"}'}},
        {"id": "fc-2", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}]


def test_chunks_are_forwarded_before_the_upstream_finishes(proxy, key, upstream, cid, db):
    client = proxy.openai(key, timeout=10)  # a buffering proxy makes the reads below time out
    gate = threading.Event()
    upstream.enqueue(Reply(content="abcdefghijkl", gate=gate, gate_after=3))
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[user("q")], stream=True, extra_headers={"X-Conversation-Id": cid})
    it = iter(raw.parse())
    got = []
    # the upstream holds back everything after its third event until the gate opens: if the proxy
    # buffered the stream, these reads would never complete (the gate only opens afterwards)
    while "".join(got) != "abcdef":
        c = next(it)
        got.append(c.choices[0].delta.content or "")
    assert upstream.last  # the upstream is still mid-stream here
    gate.set()
    rest = "".join(c.choices[0].delta.content or "" for c in it if c.choices)
    assert "".join(got) + rest == "abcdefghijkl"
    wait_status(db, raw.headers["x-node-id"], "success")


def test_client_disconnect_marks_the_node_failed(proxy, upstream, key, cid, db):
    gate = threading.Event()
    upstream.enqueue(Reply(content="abcdefghijkl", gate=gate, gate_after=3))
    with httpx.Client(base_url=proxy.url, timeout=10) as http:
        with http.stream("POST", "/v1/chat/completions", json={"model": MODEL, "messages": [user("q")], "stream": True},
                         headers={"Authorization": f"Bearer {key}", "X-Conversation-Id": cid}) as r:
            node_id = r.headers["x-node-id"]
            next(r.iter_raw())  # the first chunk arrived; now hang up
    try:
        node = wait_status(db, node_id, "failed")
    finally:
        gate.set()
    assert node["error"]["code"] == "client_disconnected"
    assert db.head(cid) == node_id  # transient: the failed node is the head
    assert node["received"] is None


_ASKED = {"/v1/chat/completions": {"messages": [user("capital of France?")]},
          "/v1/responses": {"input": "capital of France?"},
          "/v1/messages": {"messages": [user("capital of France?")], "max_tokens": 100}}


@pytest.mark.parametrize("path", list(_ASKED))
def test_a_client_that_leaves_once_its_answer_is_whole_gets_it_stored(proxy, upstream, key, cid, db, path):
    """Many clients stop reading once the answer's end came (``if chunk.choices[0].finish_reason:
    break``), before the usage chunk the proxy asked for and [DONE]: that client had its whole
    answer, so the node is a success -- at once, without waiting for the upstream's rest (its
    usage, still on its way, is not known) -- and the next call's context holds the answer.
    Before, it was stored as client_disconnected: the model never saw the answer its user did.
    (A Responses or Messages client over a chat upstream, leaving after the answer's last text,
    is the same case.)"""
    gate = threading.Event()
    usage = {"id": "chatcmpl-g", "object": "chat.completion.chunk", "created": 0, "model": MODEL, "choices": [],
             "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}}
    upstream.enqueue(Reply(kind="raw", content_type="text/event-stream", gate=gate,
                           body=_chunk({"role": "assistant", "content": "The capital is "}) + _chunk({"content": "Paris."})
                           + _chunk({}, "stop"),
                           rest=b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n"))
    try:
        with httpx.Client(base_url=proxy.url, timeout=10) as http:
            with http.stream("POST", path, json={"model": MODEL, **_ASKED[path], "stream": True},
                             headers={"Authorization": f"Bearer {key}", "X-Conversation-Id": cid}) as r:
                node_id = r.headers["x-node-id"]
                for line in r.iter_lines():
                    if "Paris." in line:  # (the finishing chunk came with it: read in the same turn)
                        break  # the answer is whole: the client leaves
            node = wait_for(lambda: (row := db.node(node_id))["status"] != "pending" and row, 10, "the node stored")
            assert node["status"] == "success" and node["error"] is None, node["error"]
            assert node["finish_reason"] == "stop" and node["usage"] is None  # (the usage had not come)
            assert db.head(cid) == node_id
            upstream.enqueue(Reply(content="Rome."))
            http.post("/v1/chat/completions", json={"model": MODEL, "messages": [user("and of Italy?")]},
                      headers={"Authorization": f"Bearer {key}", "X-Conversation-Id": cid}).raise_for_status()
        assert upstream.last.messages == [user("capital of France?"), {"role": "assistant", "content": "The capital is Paris."},
                                          user("and of Italy?")]
    finally:
        gate.set()


def test_a_client_gone_before_the_first_byte_fails_the_node_and_the_upstream_request_is_dropped(
        proxy, upstream, key, cid, db):
    """A client that gives up while the upstream has not answered yet (its stream not begun):
    the node fails as client_disconnected at once -- its answer, arriving later, is never
    context -- and the upstream request is dropped rather than read to the end."""
    never = threading.Event()
    upstream.enqueue(Reply(kind="stream", content="an answer nobody saw", hold=never))
    try:
        with httpx.Client(base_url=proxy.url) as http, pytest.raises(httpx.ReadTimeout):
            with http.stream("POST", "/v1/chat/completions", timeout=0.5,
                             json={"model": MODEL, "messages": [user("q")], "stream": True},
                             headers={"Authorization": f"Bearer {key}", "X-Conversation-Id": cid}):
                pass
        row = wait_for(lambda: (r := db.fetchrow("SELECT * FROM nodes WHERE conversation_id = $1", cid))
                       and r["status"] != "pending" and r, 10, "the node to fail")
    finally:
        never.set()
    assert row["status"] == "failed" and row["error"]["code"] == "client_disconnected"
    assert row["received"] is None and db.head(cid) == str(row["id"])
    proxy.openai(key).chat.completions.create(model=MODEL, messages=[user("next")],
                                              extra_headers={"X-Conversation-Id": cid})
    assert upstream.last.messages == [user("q"), user("next")]


def _chunk(delta: dict, finish: str | None = None) -> bytes:
    body = {"id": "chatcmpl-g", "object": "chat.completion.chunk", "created": 0, "model": MODEL,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def garbled(garbage: bytes) -> bytes:
    return b"".join([_chunk({"role": "assistant", "content": "part one "}), b": a comment is fine\n\n", b"data:\n\n",
                     _chunk({"content": "part two"}), garbage, _chunk({}, "stop"), b"data: [DONE]\n\n"])


@pytest.mark.parametrize("garbage", [b"data: {not json at all\n\n", b"data: 42\n\n"])
@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"messages": [user("q")]}),
    ("/v1/responses", {"input": "q"}),
    ("/v1/messages", {"messages": [user("q")], "max_tokens": 100}),
])
def test_an_event_whose_data_is_not_json_fails_the_stream(proxy, upstream, key, cid, db, path, body, garbage):
    """An upstream stream holding data that is not a JSON object is broken: the client gets the
    events before it, then one error event (never the garbage, which would break its SDK), and
    the node fails -- its partial answer never context. Comments and empty data are no fault
    (a comment is relayed; an empty data line is not: an SDK parses every event's data)."""
    upstream.enqueue(Reply(kind="raw", body=garbled(garbage), content_type="text/event-stream"))
    with httpx.Client(base_url=proxy.url, timeout=10) as http:
        r = http.post(path, json={"model": MODEL, **body, "stream": True},
                      headers={"Authorization": f"Bearer {key}", "X-Conversation-Id": cid})
    assert r.status_code == 200
    assert garbage not in r.content and b"whose data is not" in r.content and b"\ndata:\n\n" not in r.content
    assert b"part one" in r.content and b"[DONE]" not in r.content
    node = wait_status(db, r.headers["x-node-id"], "failed")
    assert node["error"]["code"] == "upstream_bad_response" and node["received"] is None
    proxy.openai(key).chat.completions.create(model=MODEL, messages=[user("next")],
                                              extra_headers={"X-Conversation-Id": cid})
    assert "part one" not in upstream.last.text()


def test_stream_cut_without_done_fails_with_a_final_error_event(client, upstream, cid, db):
    upstream.enqueue(Reply(content="abcdefghijkl", cut_after=3))
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[user("q")], stream=True, extra_headers={"X-Conversation-Id": cid})
    node_id = raw.headers["x-node-id"]
    body = raw.http_response.read()
    events = [e for e in body.split(b"\n\n") if e]
    assert events[-1].startswith(b'data: {"error"')
    assert b"[DONE]" not in body
    node = wait_status(db, node_id, "failed")
    assert node["error"]["code"] == "stream_interrupted"
    assert db.head(cid) == node_id
    # the partial answer never becomes context
    client.chat.completions.create(model=MODEL, messages=[user("again")], extra_headers={"X-Conversation-Id": cid})
    assert upstream.last.messages == [user("q"), user("again")]


def test_error_event_mid_stream(client, upstream, cid, db):
    upstream.enqueue(Reply(content="partial", error_event={"message": "overloaded", "type": "server_error", "code": "overloaded"}))
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[user("q")], stream=True, extra_headers={"X-Conversation-Id": cid})
    body = raw.http_response.read()
    assert body.count(b'"error"') == 1 and body.rstrip().endswith(b"}")
    node = wait_status(db, raw.headers["x-node-id"], "failed")
    assert node["error"]["message"] == "overloaded"
    assert db.head(cid) == raw.headers["x-node-id"]


def test_overflow_reported_mid_stream_leaves_the_head(client, upstream, cid, db):
    client.chat.completions.create(model=MODEL, messages=[user("first")], extra_headers={"X-Conversation-Id": cid})
    head = db.head(cid)
    upstream.enqueue(Reply(content="", error_event={"message": "maximum context length exceeded", "code": "context_length_exceeded"}))
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[user("huge")], stream=True, extra_headers={"X-Conversation-Id": cid})
    raw.http_response.read()
    node = wait_status(db, raw.headers["x-node-id"], "failed")
    assert node["error"]["code"] == "context_overflow"
    assert db.head(cid) == head


def test_a_stream_that_refuses_the_request_leaves_the_head(client, upstream, cid, db):
    """An error event saying the request is invalid (a 200 stream whose first word is a refusal) is
    an invalid request, as a 400 is: the head stays, so the refused items are not every later
    call's context."""
    client.chat.completions.create(model=MODEL, messages=[user("first")], extra_headers={"X-Conversation-Id": cid})
    head = db.head(cid)
    upstream.enqueue(Reply(content="", error_event={"message": "Invalid value for 'temperature'",
                                                    "type": "invalid_request_error", "code": "invalid_value"}))
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[user("bad")], stream=True, extra_headers={"X-Conversation-Id": cid})
    assert b'"invalid_value"' in raw.http_response.read()
    node = wait_status(db, raw.headers["x-node-id"], "failed")
    assert node["outcome"] == "invalid" and node["error"]["code"] == "invalid_value"
    assert db.head(cid) == head
    client.chat.completions.create(model=MODEL, messages=[user("next")], extra_headers={"X-Conversation-Id": cid})
    assert upstream.last.messages == [user("first"), {"role": "assistant", "content": "echo: first"}, user("next")]


def test_upstream_http_error_on_a_stream_request_is_a_plain_error(client, upstream, cid, db):
    upstream.enqueue(Reply(kind="error", status=429, error={"message": "slow down", "type": "rate_limit_error", "param": None, "code": "rate_limit"}))
    import openai
    import pytest

    with pytest.raises(openai.RateLimitError) as e:
        stream(client, cid, user("q"))
    node_id = e.value.response.headers["x-node-id"]
    assert db.node(node_id)["status"] == "failed" and db.head(cid) == node_id


def test_stream_is_stored_before_the_client_sees_its_end(client, upstream, cid, db):
    # a client that sends its next call the moment it reads [DONE] (every tool loop does) must
    # find the lease released and the head on the answer it just read -- never a 409
    for i in range(8):
        headers, chunks = stream(client, cid, user(f"q{i}"))
        assert db.head(cid) == headers["x-node-id"]  # no waiting: already stored
        assert db.node(headers["x-node-id"])["status"] == "success"
    assert [m["content"] for m in upstream.last.messages][-3:] == ["q6", "echo: q6", "q7"]


def test_end_of_stream_waits_for_the_node_to_be_stored(proxy, upstream, key, cid, database_url):
    import asyncio
    import uuid

    import asyncpg

    async def go():
        conn = await asyncpg.connect(database_url)
        client = proxy.async_openai(key, timeout=20)
        gate = threading.Event()
        upstream.enqueue(Reply(content="abcdef", gate=gate, gate_after=2))
        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[user("q")], stream=True, extra_headers={"X-Conversation-Id": cid})
        node_id = uuid.UUID(raw.headers["x-node-id"])
        tx = conn.transaction()
        await tx.start()
        tree = await conn.fetchval("SELECT tree_id FROM nodes WHERE id = $1", node_id)
        # finalize must wait (by its key: a distributed PostgreSQL locks rows of one shard only)
        await conn.execute("SELECT 1 FROM nodes WHERE tree_id = $1 AND id = $2 FOR UPDATE", tree, node_id)
        gate.set()
        ended = asyncio.Event()

        async def consume():
            async for _ in raw.parse():
                pass
            ended.set()

        task = asyncio.create_task(consume())
        await asyncio.sleep(0.7)
        assert not ended.is_set(), "the client saw the end of the stream before its node was stored"
        await tx.rollback()
        await asyncio.wait_for(task, 10)
        status = await conn.fetchval("SELECT status FROM nodes WHERE id = $1", node_id)
        await conn.close()
        await client.close()
        return status

    assert asyncio.run(go()) == "success"


def test_a_chat_stream_that_ends_without_done_after_its_finish_is_whole(client, upstream, cid, db):
    """Some OpenAI-compatible servers end a stream's body after the finishing chunk, with no
    [DONE]: the answer is whole -- stored, the head on it, and the client gets its [DONE]."""
    upstream.enqueue(Reply(content="all of it", done=False))
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[user("q")], stream=True, extra_headers={"X-Conversation-Id": cid})
    node_id = raw.headers["x-node-id"]
    body = raw.http_response.read()
    assert body.rstrip().endswith(b"data: [DONE]") and b'"error"' not in body
    node = wait_status(db, node_id, "success")
    assert node["received"][0]["content"] == "all of it" and node["finish_reason"] == "stop"
    assert db.head(cid) == node_id
    client.chat.completions.create(model=MODEL, messages=[user("again")], extra_headers={"X-Conversation-Id": cid})
    assert upstream.last.messages == [user("q"), {"role": "assistant", "content": "all of it"}, user("again")]


def test_a_chat_stream_whose_body_ends_before_its_finish_is_cut(client, upstream, cid, db):
    """Without the finishing chunk a clean end of the body is a cut stream, as before."""
    first = {"id": "c1", "object": "chat.completion.chunk", "model": MODEL,
             "choices": [{"index": 0, "delta": {"role": "assistant", "content": "half an ans"}, "finish_reason": None}]}
    upstream.enqueue(Reply(kind="raw", body=b"data: " + json.dumps(first).encode() + b"\n\n",
                           content_type="text/event-stream"))
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[user("q")], stream=True, extra_headers={"X-Conversation-Id": cid})
    body = raw.http_response.read()
    assert b"[DONE]" not in body and [e for e in body.split(b"\n\n") if e][-1].startswith(b'data: {"error"')
    node = wait_status(db, raw.headers["x-node-id"], "failed")
    assert node["error"]["code"] == "stream_interrupted"


def test_a_responses_stream_over_a_chat_upstream_without_done_completes(proxy, upstream, key, cid, db):
    upstream.enqueue(Reply(content="translated whole", done=False))
    client = proxy.openai(key, conversation=cid)
    with client.responses.with_streaming_response.create(model=MODEL, input="go", stream=True) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
        node_id = r.headers["x-node-id"]
    assert events[-1]["type"] == "response.completed"
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == "translated whole"
    assert wait_status(db, node_id, "success")["received"]


def test_a_stream_of_content_parts_is_stored_and_leaves_the_conversation_free(proxy, upstream, key, cid, db):
    """Mistral's reasoning models stream content as a list of parts (thinking, then text); an odd
    server may send a number where text goes. Before, the end of such a stream raised: the
    client's connection broke without an end, the node stayed pending, and every later turn of
    the conversation was 409 until the process restarted."""
    base = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": MODEL}
    deltas = [({"role": "assistant", "content": [{"type": "thinking", "thinking": [{"type": "text", "text": "hmm"}]}]}, None),
              ({"content": [{"type": "text", "text": "Hel"}]}, None), ({"content": "lo", "refusal": 3}, None), ({}, 5)]
    events = [{**base, "choices": [{"index": 0, "delta": d, "finish_reason": f}]} for d, f in deltas]
    upstream.enqueue(Reply(kind="raw", content_type="text/event-stream",
                           body=b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"))
    client = proxy.openai(key, conversation=cid)
    with client.chat.completions.with_streaming_response.create(model=MODEL, stream=True, messages=[
            {"role": "user", "content": "think"}]) as r:
        node_id = r.headers["x-node-id"]
        assert r.read().endswith(b"data: [DONE]\n\n")
    node = db.node(node_id)
    assert node["outcome"] == "success" and node["received"] == [{"role": "assistant", "content": "Hello",
                                                                  "reasoning_content": "hmm"}]
    say(client, cid, user("and now?"))  # (not 409: the conversation is free)
    assert upstream.last.messages[-2]["content"] == "Hello"


def test_a_stream_whose_lines_end_with_a_cr_alone_is_read(proxy, upstream, key, cid, db):
    """The SSE standard lets a line end with CR alone: such a stream is relayed and stored whole
    (it was read as one endless event, and failed as interrupted)."""
    base = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": MODEL}
    events = [{**base, "choices": [{"index": 0, "delta": d, "finish_reason": f}]}
              for d, f in (({"role": "assistant", "content": "Hel"}, None), ({"content": "lo"}, None), ({}, "stop"))]
    body = b"".join(b"data: " + json.dumps(e).encode() + b"\r\r" for e in events) + b"data: [DONE]\r\r"
    upstream.enqueue(Reply(kind="raw", content_type="text/event-stream", body=body))
    chunks = list(proxy.openai(key, conversation=cid).chat.completions.create(
        model=MODEL, stream=True, messages=[user("hi")]))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello"
    node_id = db.fetch("SELECT id FROM nodes WHERE conversation_id = $1", cid)[0]["id"]
    assert db.node(node_id)["received"] == [{"role": "assistant", "content": "Hello"}]


def test_a_responses_stream_whose_lines_end_with_a_cr_alone_ends_with_its_end_event(native, upstream, key, cid):
    """Over a Responses upstream, whose stream must end with response.completed: a stream whose
    lines end with a CR alone ends the body with the CR of its last blank line, which the parser
    held back for a chunk that never came -- the client got the whole text, then an error event,
    and the node failed as stream_interrupted. Now the body's end ends that line."""
    item = {"id": "msg_u", "type": "message", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": "Hello", "annotations": []}]}
    response = {"id": "resp_u", "object": "response", "created_at": 1, "status": "completed", "model": "native-1",
                "output": [item], "usage": {"input_tokens": 5, "output_tokens": 3, "total_tokens": 8}}
    events = [{"type": "response.created", "response": {**response, "status": "in_progress", "output": []}},
              {"type": "response.output_item.added", "output_index": 0, "item": {**item, "content": []}},
              *({"type": "response.output_text.delta", "item_id": "msg_u", "output_index": 0, "content_index": 0,
                 "delta": piece} for piece in ("Hel", "lo")),
              {"type": "response.output_item.done", "output_index": 0, "item": item},
              {"type": "response.completed", "response": response}]
    body = b"".join(b"event: %s\rdata: %s\r\r" % (e["type"].encode(), json.dumps(e).encode()) for e in events)
    upstream.enqueue(Reply(kind="raw", content_type="text/event-stream", body=body))
    client = native.openai(key, conversation=cid)
    with client.chat.completions.with_streaming_response.create(model="native-1", stream=True,
                                                                messages=[user("hi")]) as r:
        node_id = r.headers["x-node-id"]
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert not [c for c in chunks if "error" in c], chunks
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices")) == "Hello"
    node = native.http(key).get(f"/admin/nodes/{node_id}").json()
    assert node["status"] == "success", node
