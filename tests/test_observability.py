"""Metrics move when calls happen; logs are structured, carry ids, and never message contents."""

import json
import logging
import os
import re
import threading
import time
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from proxy.logs import JsonFormatter, TextFormatter

from .anthropic_fake import AReply
from .conftest import wait_for
from .fakes import Reply
from .helpers import MODEL, say, user


def metric(proxy, name, **labels):
    text = httpx.get(f"{proxy.url}/metrics").text
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = re.escape(name) + (r"\{" + re.escape(want) + r"\}" if want else "") + r" ([0-9.e+]+)"
    m = re.search("^" + pattern + "$", text, re.M)
    return float(m.group(1)) if m else 0.0


def test_metrics_move(proxy, upstream, key, cid):
    client = proxy.openai(key)
    route = "/v1/chat/completions"
    before = {
        "requests": metric(proxy, "branchpoint_requests_total", route=route, status="200"),
        "calls": metric(proxy, "branchpoint_calls_total", kind="turn", outcome="success"),
        "failed": metric(proxy, "branchpoint_calls_total", kind="turn", outcome="transient"),
        "tokens_in": metric(proxy, "branchpoint_tokens_total", direction="in"),
        "upstream": metric(proxy, "branchpoint_upstream_seconds_count", route=route),
        "overhead": metric(proxy, "branchpoint_overhead_seconds_count", route=route),
        "busy": metric(proxy, "branchpoint_busy_rejections_total"),
        "drops": metric(proxy, "branchpoint_pairing_drops_total"),
        "statements": metric(proxy, "branchpoint_db_statements_total"),
        "passthrough": metric(proxy, "branchpoint_requests_total", route="/v1/{path}", status="200"),
    }
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], extra_headers={"X-Conversation-Id": cid})
    upstream.enqueue(Reply(kind="error", status=503))
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], extra_headers={"X-Conversation-Id": cid})
    upstream.enqueue(Reply(content=None, tool_calls=[{"id": "c9", "type": "function", "function": {"name": "f", "arguments": "{}"}}]))
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "y"}], extra_headers={"X-Conversation-Id": cid})
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "abandon"}], extra_headers={"X-Conversation-Id": cid})
    client.models.list()
    import threading

    upstream.enqueue(Reply(delay=0.8))
    t = threading.Thread(target=lambda: client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "slow"}], extra_headers={"X-Conversation-Id": cid}))
    t.start()
    upstream.wait_for(5)
    with pytest.raises(openai.ConflictError):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "busy"}], extra_headers={"X-Conversation-Id": cid})
    t.join()
    assert metric(proxy, "branchpoint_requests_total", route=route, status="200") == before["requests"] + 4
    assert metric(proxy, "branchpoint_requests_total", route=route, status="503") >= 1
    assert metric(proxy, "branchpoint_calls_total", kind="turn", outcome="success") == before["calls"] + 4
    assert metric(proxy, "branchpoint_calls_total", kind="turn", outcome="transient") == before["failed"] + 1
    assert metric(proxy, "branchpoint_tokens_total", direction="in") > before["tokens_in"]
    assert metric(proxy, "branchpoint_upstream_seconds_count", route=route) >= before["upstream"] + 5
    assert metric(proxy, "branchpoint_overhead_seconds_count", route=route) >= before["overhead"] + 5
    assert metric(proxy, "branchpoint_busy_rejections_total") == before["busy"] + 1
    assert metric(proxy, "branchpoint_pairing_drops_total") >= before["drops"] + 1
    assert metric(proxy, "branchpoint_db_statements_total") > before["statements"]
    # the pool at rest: its connections idle (a background job may hold one a moment), nobody waiting
    idle, lent = (metric(proxy, "branchpoint_db_connections", state=s) for s in ("idle", "lent"))
    assert idle >= 1 and 1 <= idle + lent <= proxy.runtime.settings.database.pool_max
    assert metric(proxy, "branchpoint_db_waiting") == 0
    assert metric(proxy, "branchpoint_requests_total", route="/v1/{path}", status="200") == before["passthrough"] + 1
    text = httpx.get(f"{proxy.url}/metrics").text
    for name in ("branchpoint_request_seconds_bucket", "branchpoint_pending_nodes ", "branchpoint_inflight_calls ",
                 "branchpoint_db_waiting "):
        assert f"\n{name}" in text, name  # a sample line, not only its HELP
    for family in ("branchpoint_compactions", "branchpoint_reaped"):  # no samples until one happens
        assert f"# TYPE {family}_total counter" in text or f"# TYPE {family} counter" in text, family


def test_the_pending_gauge_counts_calls_in_flight(fresh_database_url, upstream_url, upstream, key, cid):
    """``branchpoint_pending_nodes``: the database's pending nodes, read on every scrape."""
    import threading

    from .conftest import make_settings, serve_proxy

    hold = threading.Event()
    upstream.enqueue(Reply(hold=hold))
    with serve_proxy(make_settings(fresh_database_url, upstream_url)) as p:
        assert metric(p, "branchpoint_pending_nodes") == 0
        call = threading.Thread(target=lambda: p.openai(key).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "wait"}], extra_headers={"X-Conversation-Id": cid}))
        call.start()
        try:
            deadline = time.monotonic() + 10
            while metric(p, "branchpoint_pending_nodes") != 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert metric(p, "branchpoint_pending_nodes") == 1
        finally:
            hold.set()
            call.join(10)
        assert metric(p, "branchpoint_pending_nodes") == 0


def test_structured_logs_with_ids_and_no_contents(proxy, upstream, key, cid, caplog):
    caplog.set_level(logging.INFO)
    secret_text = "PURPLE-ELEPHANT-CONTENT"
    r = httpx.post(f"{proxy.url}/v1/chat/completions", headers={"Authorization": f"Bearer {key}", "X-Conversation-Id": cid,
                                                               "X-Request-Id": "req-from-client-1"},
                   json={"model": MODEL, "messages": [{"role": "user", "content": secret_text}]})
    assert r.status_code == 200 and r.headers["x-branchpoint-request-id"] == "req-from-client-1"
    assert r.headers["x-request-id"] == "req_fake"  # the upstream's own, relayed untouched
    r2 = httpx.get(f"{proxy.url}/healthz")
    assert re.fullmatch(r"[0-9a-f]{32}", r2.headers["x-branchpoint-request-id"])  # made up when absent
    formatter = JsonFormatter()
    lines = [json.loads(formatter.format(rec)) for rec in caplog.records if rec.levelno >= logging.INFO]
    access = [x for x in lines if x["logger"] == "branchpoint.access" and x.get("request_id") == "req-from-client-1"]
    assert access, lines
    line = access[0]
    assert line["conversation_id"] == cid and line["node_id"] == r.headers["x-node-id"]
    assert line["status"] == 200 and line["duration_ms"] > 0 and line["route"] == "/v1/chat/completions"
    assert all(secret_text not in json.dumps(x) for x in lines)


@pytest.mark.parametrize("stream", [False, True])
def test_the_wait_for_an_upstream_the_client_left_is_upstream_time(proxy, upstream, key, cid, caplog, stream):
    """A client that gave up while the upstream kept it waiting: the wait is the upstream's
    (upstream_ms, branchpoint_upstream_seconds), not the proxy's own -- a stream's was counted as
    the proxy's (its upstream time is counted when it ends: this one never began)."""
    caplog.set_level(logging.INFO, logger="branchpoint.access")
    hold = threading.Event()
    upstream.enqueue(Reply(hold=hold))
    try:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{proxy.url}/v1/chat/completions", timeout=0.6, headers={
                "Authorization": f"Bearer {key}", "X-Conversation-Id": cid, "X-Request-Id": f"req-left-{stream}"},
                json={"model": MODEL, "messages": [user("q")], "stream": stream})
        formatter = JsonFormatter()
        line = wait_for(lambda: next((x for x in (json.loads(formatter.format(r)) for r in caplog.records)
                                      if x.get("request_id") == f"req-left-{stream}"), None), 10, "the access line")
    finally:
        hold.set()
    assert line["upstream_ms"] >= 500 and line["upstream_ms"] <= line["duration_ms"], line


def test_text_logs_carry_the_same_ids_and_fields(proxy, upstream, key, cid, caplog):
    """``log_format = "text"`` (for humans) says what the JSON lines say: the request,
    conversation and node ids and the access line's fields, as ``key=value`` -- it once wrote the
    bare message, ``... branchpoint.access request``, nothing to trace a call by."""
    caplog.set_level(logging.INFO)
    r = httpx.post(f"{proxy.url}/v1/chat/completions", headers={"Authorization": f"Bearer {key}", "X-Conversation-Id": cid,
                                                               "X-Request-Id": "req-text-42"},
                   json={"model": MODEL, "messages": [{"role": "user", "content": "SECRET-TEXT-CONTENT"}]})
    assert r.status_code == 200
    formatter = TextFormatter()

    def access_lines() -> list[str]:
        lines = [formatter.format(rec) for rec in caplog.records if rec.levelno >= logging.INFO]
        return [x for x in lines if " branchpoint.access " in x and "request_id=req-text-42" in x]

    # (the access line is written once the answer has gone: a moment after the client has it)
    access = wait_for(access_lines, 10, "the access line")
    lines = [formatter.format(rec) for rec in caplog.records if rec.levelno >= logging.INFO]
    line = access[0]
    assert f"conversation_id={cid}" in line and f"node_id={r.headers['x-node-id']}" in line
    assert "status=200" in line and "route=/v1/chat/completions" in line and "method=POST" in line
    assert all("SECRET-TEXT-CONTENT" not in x for x in lines)
    # a value with spaces or quotes stays one readable field
    record = logging.LogRecord("branchpoint", logging.WARNING, __file__, 1, "odd", (), None)
    record.detail = 'two words "quoted"'
    assert formatter.format(record).endswith(' detail="two words \\"quoted\\""')


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("client, model", [("chat", "native-x"), ("chat", "claude-x"), ("messages", "gpt-x")])
def test_a_translated_call_naming_no_conversation_counts_its_tokens(mproxy, upstream, claude, key, client, model,
                                                                    stream):
    """A call naming no conversation whose upstream speaks another API is translated, so its
    answer -- usage included -- is read, though nothing is stored: the tokens it reports count
    on /metrics as a stored call's do (no call is counted: there is none stored). They were
    never counted: only a stored outcome counted tokens."""
    in_before, out_before = (metric(mproxy, "branchpoint_tokens_total", direction=d) for d in ("in", "out"))
    calls_before = sum(float(v) for v in re.findall(r"^branchpoint_calls_total\{[^}]*\} ([0-9.e+]+)$",
                                                     httpx.get(f"{mproxy.url}/metrics").text, re.M))
    upstream.enqueue(Reply(kind="stream" if stream and model == "gpt-x" else "json",
                           usage={"prompt_tokens": 123, "completion_tokens": 4, "total_tokens": 127}
                           if model == "gpt-x" else {"input_tokens": 123, "output_tokens": 4, "total_tokens": 127}))
    claude.enqueue(AReply(usage={"input_tokens": 123, "output_tokens": 4}))
    if client == "messages":
        c = anthropic.Anthropic(base_url=mproxy.url, api_key=key, max_retries=0)
        if stream:
            with c.messages.stream(model=model, max_tokens=50, messages=[user("hi")]) as s:
                s.get_final_message()
        else:
            c.messages.create(model=model, max_tokens=50, messages=[user("hi")])
    else:
        answer = mproxy.openai(key).chat.completions.create(model=model, messages=[user("hi")], stream=stream)
        if stream:
            list(answer)
    assert wait_for(lambda: metric(mproxy, "branchpoint_tokens_total", direction="in") - in_before, 10,
                    "the tokens counted") == 123
    assert metric(mproxy, "branchpoint_tokens_total", direction="out") - out_before == 4
    assert sum(float(v) for v in re.findall(r"^branchpoint_calls_total\{[^}]*\} ([0-9.e+]+)$",
                                            httpx.get(f"{mproxy.url}/metrics").text, re.M)) == calls_before


def test_a_request_no_route_takes_is_counted_and_logged(proxy, caplog):
    """A request to no route (404) or with a method its route does not take (405) is answered by
    Litestar before any route's middleware runs: it is counted and access-logged all the same, as
    ``route="unmatched"`` (one label, whatever the path), with its request id -- it was neither,
    and the request metrics did not add up to the requests served."""
    caplog.set_level(logging.INFO)
    before = {status: metric(proxy, "branchpoint_requests_total", route="unmatched", status=status)
              for status in (404, 405)}
    r1 = httpx.get(f"{proxy.url}/no/such/route", headers={"X-Request-Id": "req-unrouted-1"})
    r2 = httpx.delete(f"{proxy.url}/v1/chat/completions", headers={"X-Request-Id": "req-unrouted-2"})
    assert (r1.status_code, r2.status_code) == (404, 405)
    assert r1.json()["error"]["code"] == "not_found" and r2.json()["error"]["code"] == "method_not_allowed"
    assert (r1.headers["x-branchpoint-request-id"], r2.headers["x-branchpoint-request-id"]) == ("req-unrouted-1",
                                                                                              "req-unrouted-2")
    formatter = JsonFormatter()

    def access_lines() -> list[dict]:
        lines = [json.loads(formatter.format(rec)) for rec in caplog.records if rec.name == "branchpoint.access"]
        found = [x for x in lines if x.get("request_id") in ("req-unrouted-1", "req-unrouted-2")]
        return found if len(found) == 2 else []

    # (the access line is written once the answer has gone: a moment after the client has it)
    first, second = sorted(wait_for(access_lines, 10, "the access lines"), key=lambda x: x["request_id"])
    assert (first["route"], first["status"], first["method"], first["path"]) == ("unmatched", 404, "GET",
                                                                                 "/no/such/route")
    assert (second["route"], second["status"], second["method"]) == ("unmatched", 405, "DELETE")
    assert [metric(proxy, "branchpoint_requests_total", route="unmatched", status=status) - before[status]
            for status in (404, 405)] == [1, 1]
    assert "/no/such/route" not in httpx.get(f"{proxy.url}/metrics").text


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="Linux's /proc")
def test_metrics_show_the_process_and_its_context_switches(proxy, upstream, key, cid):
    assert metric(proxy, "process_cpu_seconds_total") > 0 and metric(proxy, "process_resident_memory_bytes") > 0
    before = metric(proxy, "branchpoint_process_context_switches_total", kind="voluntary")
    for i in range(3):  # each call waits on the database and the upstream: the threads sleep and wake
        say(proxy.openai(key), cid, user(f"q{i}"))
    after = metric(proxy, "branchpoint_process_context_switches_total", kind="voluntary")
    assert after > before > 0
    assert 'branchpoint_process_context_switches_total{kind="involuntary"}' in httpx.get(f"{proxy.url}/metrics").text


def test_every_metric_is_documented(proxy):
    """docs/behaviour.md#metrics lists exactly the families /metrics exposes."""
    text = httpx.get(f"{proxy.url}/metrics").text
    exposed = {name for name in re.findall(r"^# TYPE (branchpoint_\w+) \w+$", text, re.M)
               if not name.endswith("_created")}  # (the client's creation time of each counter)
    docs = (Path(__file__).parents[1] / "docs" / "behaviour.md").read_text()
    section = docs[docs.index("\n## Metrics\n"):]
    section = section[:section.index("\n## ", 1)]
    documented = set(re.findall(r"^\| `(branchpoint_\w+)`", section, re.M))
    assert exposed == documented, (exposed - documented, documented - exposed)
