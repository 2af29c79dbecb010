"""The failure table (docs/behaviour.md#failures), row by row: what happens to the node and the head after each kind of failure, what
the client gets, and how retries are recognised."""

import logging
import threading
import time

import httpx
import openai
import pytest

from .conftest import Db, make_settings, serve_proxy, wait_for
from .fakes import Reply, free_port
from .helpers import MODEL, say, user


def fail(client, cid, *messages, exc=openai.APIStatusError):
    with pytest.raises(exc) as e:
        say(client, cid, *messages)
    return e.value


def error_of(e):
    return e.body if isinstance(e.body, dict) and "code" in e.body else e.body.get("error", e.body)


@pytest.mark.parametrize("status", [500, 502, 503, 429, 408])
def test_transient_failure_makes_the_failed_node_the_head(client, upstream, cid, db, status):
    _, h1 = say(client, cid, user("first"))
    upstream.enqueue(Reply(kind="error", status=status))
    e = fail(client, cid, user("second"))
    assert e.status_code == status
    node_id = e.response.headers["x-node-id"]
    assert e.response.headers["x-parent-node-id"] == h1["x-node-id"]
    node = db.node(node_id)
    assert node["status"] == "failed" and node["received"] is None
    assert node["error"]["status"] == status and node["error"]["message"] == "fake failure"
    assert db.head(cid) == node_id


def test_failed_node_keeps_paid_for_tool_results_in_context(client, upstream, cid, db):
    call = {"id": "call_search", "type": "function", "function": {"name": "web_search", "arguments": '{"q": "x"}'}}
    upstream.enqueue(Reply(content=None, tool_calls=[call]))
    say(client, cid, user("search the web"))
    result = {"role": "tool", "tool_call_id": "call_search", "content": "expensive search result"}
    upstream.enqueue(Reply(kind="error", status=503))
    e = fail(client, cid, result)
    failed = e.response.headers["x-node-id"]
    assert db.head(cid) == failed
    # the user says "continue": the new node hangs under the failed one and sees the tool result
    _, h = say(client, cid, user("continue"))
    assert h["x-parent-node-id"] == failed
    assert [m["role"] for m in upstream.last.messages] == ["user", "assistant", "tool", "user"]
    assert "expensive search result" in upstream.last.text()


def test_sdk_retry_of_the_same_items_hangs_beside_the_failed_node(client, upstream, cid, db):
    _, h1 = say(client, cid, user("first"))
    upstream.enqueue(Reply(kind="error", status=500))
    e = fail(client, cid, user("second"))
    failed = e.response.headers["x-node-id"]
    _, h = say(client, cid, user("second"))  # same items again: a retry
    assert h["x-parent-node-id"] == h1["x-node-id"]  # beside the failed node, not under it
    assert [m["content"] for m in upstream.last.messages] == ["first", "echo: first", "second"]
    assert db.node(failed)["status"] == "failed"  # the failed attempt stays as a branch
    assert db.head(cid) == h["x-node-id"]


def test_sdk_automatic_retries_are_recognised(proxy, upstream, key, cid, db):
    client = proxy.openai(key, max_retries=2)
    say(client, cid, user("first"))
    upstream.enqueue(Reply(kind="error", status=500), Reply(kind="error", status=503))
    c, h = say(client, cid, user("second"))  # the SDK retries twice by itself
    assert c.choices[0].message.content == "echo: second"
    assert upstream.last.messages == [user("first"), {"role": "assistant", "content": "echo: first"}, user("second")]
    siblings = db.fetch("SELECT status FROM nodes WHERE parent_id = $1 ORDER BY created_at",
                        db.node(h["x-parent-node-id"])["id"])
    assert [r["status"] for r in siblings] == ["failed", "failed", "success"]


def test_retry_of_a_failed_first_question_makes_a_new_root(client, upstream, cid, db):
    upstream.enqueue(Reply(kind="error", status=500))
    fail(client, cid, user("very first"))
    _, h = say(client, cid, user("very first"))
    assert h["x-parent-node-id"] == "root"
    assert upstream.last.messages == [user("very first")]


def test_context_overflow_leaves_the_head_unchanged(client, upstream, cid, db):
    _, h1 = say(client, cid, user("small"))
    upstream.enqueue(Reply(kind="error", status=400, error={
        "message": "This model's maximum context length is 128000 tokens. However, your messages resulted in 200000 tokens.",
        "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}))
    e = fail(client, cid, user("HUGE " * 50), exc=openai.BadRequestError)
    assert error_of(e)["code"] == "context_length_exceeded"  # the upstream's own body
    node = db.node(e.response.headers["x-node-id"])
    assert node["status"] == "failed" and node["error"]["code"] == "context_overflow" and node["error"]["status"] == 400
    assert db.head(cid) == h1["x-node-id"]
    # the oversized items stay on a side branch: the next turn does not carry them
    say(client, cid, user("shorter"))
    assert "HUGE" not in upstream.last.text()


@pytest.mark.parametrize("status", [400, 401, 403, 404, 413, 422])
def test_invalid_request_leaves_the_head_unchanged(client, upstream, cid, db, status):
    _, h1 = say(client, cid, user("fine"))
    upstream.enqueue(Reply(kind="error", status=status, error={"message": "nope", "type": "invalid_request_error", "param": None, "code": "bad"}))
    e = fail(client, cid, user("bad one"))
    assert e.status_code == status
    assert db.node(e.response.headers["x-node-id"])["error"]["status"] == status
    assert db.head(cid) == h1["x-node-id"]


def test_upstream_timeout_is_504_and_transient(database_url, upstream_url, upstream, key, cid):
    settings = make_settings(database_url, upstream_url, upstream_defaults={"read_timeout": 0.5})
    late = threading.Event()  # (the upstream answers only after the test)
    with serve_proxy(settings) as p:
        client = p.openai(key)
        upstream.enqueue(Reply(hold=late))
        try:
            e = fail(client, cid, user("slow"))
        finally:
            late.set()
        assert e.status_code == 504
        assert error_of(e) == {"message": error_of(e)["message"], "type": "upstream_error", "param": None, "code": "upstream_timeout"}
        node_id = e.response.headers["x-node-id"]
        from .conftest import Db
        db = Db(database_url)
        assert db.node(node_id)["error"]["code"] == "upstream_timeout"
        assert db.node(node_id)["error"]["status"] is None
        assert db.head(cid) == node_id


def test_unreachable_upstream_is_502(database_url, key, cid, caplog):
    settings = make_settings(database_url, f"http://127.0.0.1:{free_port()}/v1")
    caplog.set_level(logging.INFO, logger="branchpoint.call")
    with serve_proxy(settings) as p:
        e = fail(p.openai(key), cid, user("anyone there?"))
        assert e.status_code == 502
        assert error_of(e)["code"] == "upstream_unreachable"
        assert "x-node-id" in e.response.headers
        # the operator's line: at warning, naming the model, the upstream and what failed, never the question
        failed = [r for r in caplog.records if r.getMessage() == "call failed"]
        assert len(failed) == 1 and failed[0].levelno == logging.WARNING
        line = failed[0].__dict__
        assert (line["node_id"], line["conversation_id"], line["model"], line["upstream"], line["code"]) == \
            (e.response.headers["x-node-id"], cid, MODEL, settings.upstreams[0].name, "upstream_unreachable")
        assert "anyone there" not in str(line)
        # pass-through too, and streaming
        with pytest.raises(openai.APIStatusError) as e2:
            p.openai(key).models.list()
        assert e2.value.status_code == 502
        with httpx.Client(base_url=p.url) as http:
            r = http.post("/v1/chat/completions", headers={"Authorization": f"Bearer {key}", "X-Conversation-Id": cid},
                          json={"model": MODEL, "messages": [user("s")], "stream": True})
            assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_unreachable"


@pytest.mark.parametrize("reply, status, code", [
    # a 2xx without a completion: 502 (proxy/failures.py: not_a_completion)
    (Reply(kind="raw", status=200, body=b"this is not json"), 502, "upstream_bad_response"),
    (Reply(kind="raw", status=200, body=b'{"object": "chat.completion", "choices": []}'), 502, "upstream_bad_response"),
    # ... an error body in disguise: relayed as the upstream said it (no code), its missing keys filled in
    (Reply(kind="raw", status=200, body=b'{"error": {"message": "quota", "type": "insufficient_quota"}}'), 502, None),
    # an error status keeps its status (classify), the body wrapped
    (Reply(kind="raw", status=500, body=b"<html>oops</html>", content_type="text/html"), 500, "http_500"),
])
def test_garbage_from_upstream_is_a_clean_error(client, upstream, cid, db, reply, status, code):
    upstream.enqueue(reply)
    e = fail(client, cid, user("q"))
    assert e.status_code == status
    err = error_of(e)
    assert set(err) >= {"message", "type", "param", "code"}
    assert err["code"] == code
    assert e.response.headers["content-type"] == "application/json"  # (not the upstream page's type)
    node = db.node(e.response.headers["x-node-id"])
    assert node["status"] == "failed"
    assert node["error"]["status"] == reply.status  # the status the upstream answered with, 2xx too
    assert db.head(cid) == str(node["id"])  # all transient


def test_client_disconnect_before_a_non_streamed_answer(proxy, upstream, key, cid, db):
    never = threading.Event()  # the upstream answers only once the test is over
    upstream.enqueue(Reply(hold=never))
    try:
        with httpx.Client(base_url=proxy.url) as http:
            with pytest.raises(httpx.ReadTimeout):
                http.post("/v1/chat/completions", timeout=0.5, json={"model": MODEL, "messages": [user("q")]},
                          headers={"Authorization": f"Bearer {key}", "X-Conversation-Id": cid})
        row = wait_for(lambda: (r := db.fetchrow("SELECT * FROM nodes WHERE conversation_id = $1", cid))
                       and r["status"] != "pending" and r, 10, "the node to fail")
    finally:
        never.set()
    assert row["status"] == "failed" and row["error"]["code"] == "client_disconnected"
    assert db.head(cid) == str(row["id"])
    # the SDK's retry (same items) then hangs beside it
    _, h = say(proxy.openai(key), cid, user("q"))
    assert h["x-parent-node-id"] == "root"


def test_a_client_gone_while_its_answer_is_read_does_not_get_it_as_context(proxy, upstream, key, cid, db, monkeypatch):
    """The upstream answered, and the client gave up while the proxy read the answer (a large one
    takes a while): the client never had it, so it is no context -- the node fails as
    client_disconnected, and the SDK's retry of the same question hangs beside it, the question
    once in what the upstream gets next. (Stored as a success, the retry hung under an answer the
    client never saw: its question twice in every later call.)"""
    from proxy.dialects.chat import ChatExchange

    reading = threading.Event()
    answer = ChatExchange.answer

    def slow(self, content):
        reading.set()
        time.sleep(1.5)  # (holds the proxy's event loop, as parsing a multi-megabyte answer does)
        return answer(self, content)

    monkeypatch.setattr(ChatExchange, "answer", slow)
    say(proxy.openai(key), cid, user("first"))
    upstream.enqueue(Reply(content="an answer nobody read",
                           usage={"prompt_tokens": 1000, "completion_tokens": 500, "total_tokens": 1500}))
    with httpx.Client(base_url=proxy.url) as http:
        with pytest.raises(httpx.ReadTimeout):
            http.post("/v1/chat/completions", timeout=0.5, json={"model": MODEL, "messages": [user("second")]},
                      headers={"Authorization": f"Bearer {key}", "X-Conversation-Id": cid})
    assert reading.wait(5)
    row = wait_for(lambda: (r := db.fetchrow("SELECT * FROM nodes WHERE conversation_id = $1 AND sent->0->>'content' "
                                             "= 'second'", cid)) and r["status"] != "pending" and r, 10, "its node")
    assert row["status"] == "failed" and row["error"]["code"] == "client_disconnected"
    assert row["usage"]["total_tokens"] == 1500  # (paid for all the same: counted)
    monkeypatch.setattr(ChatExchange, "answer", answer)
    say(proxy.openai(key), cid, user("second"))  # the SDK's retry
    say(proxy.openai(key), cid, user("third"))
    assert [m["content"] for m in upstream.last.messages if m["role"] == "user"] == ["first", "second", "third"]


def test_a_failed_calls_log_line_never_holds_the_upstreams_words(client, upstream, cid, caplog):
    """An upstream's error message may quote the request -- and may come with any code, the
    proxy's own among them: the line says the code and the status, never the message."""
    caplog.set_level(logging.INFO, logger="branchpoint.call")
    upstream.enqueue(Reply(kind="raw", status=500, body=b'{"error": {"message": "could not process: the user wrote '
                                                        b'SECRET-PROMPT-TEXT", "type": "server_error", '
                                                        b'"code": "internal_error"}}'))
    fail(client, cid, user("SECRET-PROMPT-TEXT"))
    failed = [r for r in caplog.records if r.getMessage() == "call failed"]
    assert len(failed) == 1 and failed[0].levelno == logging.WARNING and failed[0].__dict__["status"] == 500
    assert "SECRET-PROMPT-TEXT" not in str(failed[0].__dict__)


def test_upstream_key_replaces_the_clients_and_never_reaches_the_client(database_url, upstream_url, upstream, key, cid):
    settings = make_settings(database_url, upstream_url,
                             upstreams=[{"name": "fake", "base_url": upstream_url, "models": ["*"], "api_key": "sk-upstream-secret"}])
    with serve_proxy(settings) as p:
        raw = p.openai(key).chat.completions.with_raw_response.create(
            model=MODEL, messages=[user("q")], extra_headers={"X-Conversation-Id": cid, "OpenAI-Organization": "org-client"})
        assert upstream.last.headers["authorization"] == "Bearer sk-upstream-secret"
        assert "openai-organization" not in upstream.last.headers
        assert "sk-upstream-secret" not in str(raw.headers) and "sk-upstream-secret" not in raw.http_response.text


def test_busy_conversation_is_409(proxy, upstream, key, cid, db):
    answer = threading.Event()
    upstream.enqueue(Reply(hold=answer))  # (in flight until the second call has been refused)
    client = proxy.openai(key)
    t = threading.Thread(target=lambda: say(client, cid, user("slow")))
    t.start()
    upstream.wait_for(1)
    try:
        with pytest.raises(openai.ConflictError) as e:
            say(client, cid, user("impatient"))
    finally:
        answer.set()
    assert e.value.body["code"] == "conversation_busy"
    t.join(20)
    _, h = say(client, cid, user("later"))  # the lease was released
    assert db.node(h["x-node-id"])["status"] == "success"


def test_invariants_hold_after_every_row_of_the_failure_table(fresh_database_url, upstream_url, upstream, key, cid):
    from .conftest import assert_invariants

    overflow = {"message": "maximum context length exceeded", "type": "invalid_request_error", "param": None,
                "code": "context_length_exceeded"}
    with serve_proxy(make_settings(fresh_database_url, upstream_url)) as p:
        client = p.openai(key)
        say(client, cid, user("ok"))
        for reply in (Reply(kind="error", status=503), Reply(kind="error", status=400, error=overflow),
                      Reply(kind="error", status=401), Reply(kind="raw", status=200, body=b"garbage")):
            upstream.enqueue(reply)
            fail(client, cid, user("fails"))
        say(client, cid, user("continue"))
        stream, _ = say(client, cid, user("in a stream"), stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        outcomes = Db(fresh_database_url).fetch("SELECT outcome FROM nodes ORDER BY created_at")
        assert [r["outcome"] for r in outcomes] == ["success", "transient", "overflow", "invalid", "transient",
                                                    "success", "success"]
    assert_invariants(fresh_database_url)


def test_a_pathologically_nested_upstream_answer_is_a_clean_502(client, upstream, cid, db):
    upstream.enqueue(Reply(kind="raw", status=200, body=b"[" * 100_000 + b"]" * 100_000))
    e = fail(client, cid, user("q"))
    assert e.status_code == 502
    assert db.node(e.response.headers["x-node-id"])["status"] == "failed"


def test_a_plain_text_overflow_is_an_overflow_too(client, upstream, cid, db):
    """An upstream that says it in plain text, not JSON (some servers, proxies in front of them)."""
    _, h1 = say(client, cid, user("small"))
    upstream.enqueue(Reply(kind="raw", status=400, content_type="text/plain",
                           body=b"prompt is too long: 300000 tokens > 200000 maximum"))
    e = fail(client, cid, user("HUGE " * 50), exc=openai.BadRequestError)
    node = db.node(e.response.headers["x-node-id"])
    assert node["outcome"] == "overflow" and node["error"]["code"] == "context_overflow"
    assert db.head(cid) == h1["x-node-id"]


def test_a_log_line_holds_a_bounded_model_name():
    from proxy.outcomes import _bounded

    assert _bounded("gpt-x") == "gpt-x" and len(_bounded("m" * 100_000)) == 200 and _bounded({"no": 1}) is None
