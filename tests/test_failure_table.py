"""The failure table, row by row, at the upstream boundary: respx stands in for the network under
the upstream client (``create_app(upstream_transport=...)``), so each row -- including transport
errors no real server produces on demand -- is one fast call through the real app and database."""

import httpx
import pytest
import respx

from .conftest import Db, make_settings, serve_proxy
from .helpers import user

UPSTREAM = "http://upstream.test/v1"
OVERFLOW = {"error": {"message": "This model's maximum context length is 8192 tokens", "type": "invalid_request_error",
                      "param": "messages", "code": "context_length_exceeded"}}
COMPLETION = {"id": "c", "object": "chat.completion", "model": "m", "usage": {"prompt_tokens": 3, "completion_tokens": 1},
              "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "fine"}}]}

ROWS = {
    # name: (what the upstream does, client status, error code, outcome, head moves to the failed node)
    "5xx": (httpx.Response(503, json={"error": {"message": "overloaded", "type": "server_error"}}), 503, None, "transient", True),
    "429": (httpx.Response(429, json={"error": {"message": "slow down", "type": "rate_limit"}}), 429, None, "transient", True),
    "408": (httpx.Response(408, text="timeout"), 408, "http_408", "transient", True),
    "overflow": (httpx.Response(400, json=OVERFLOW), 400, "context_length_exceeded", "overflow", False),
    "401": (httpx.Response(401, json={"error": {"message": "bad key", "type": "auth"}}), 401, None, "invalid", False),
    "422": (httpx.Response(422, json={"error": {"message": "bad field", "type": "invalid"}}), 422, None, "invalid", False),
    "connect": (httpx.ConnectError("refused"), 502, "upstream_unreachable", "transient", True),
    "timeout": (httpx.ReadTimeout("slow"), 504, "upstream_timeout", "transient", True),
    "protocol": (httpx.RemoteProtocolError("half a response"), 502, "upstream_unreachable", "transient", True),
    "error-in-200": (httpx.Response(200, json={"error": {"message": "quota", "type": "server_error"}}), 502, None,
                     "transient", True),
    "garbage-200": (httpx.Response(200, text="<html>"), 502, "upstream_bad_response", "transient", True),
    # an overflow said in a 200 (an error body in disguise, a Responses upstream's failed response):
    # an overflow, as the same said in a stream's error event -- it was a 502 the SDKs retried, and
    # the oversized question became the head's context
    "overflow-in-200": (httpx.Response(200, json=OVERFLOW), 400, "context_length_exceeded", "overflow", False),
    # a request refused for its bytes (Anthropic's request_too_large: "exceeds the maximum allowed
    # number of bytes") is no overflow: no summary makes it fit
    "413-bytes": (httpx.Response(413, json={"type": "error", "error": {
        "type": "request_too_large", "message": "Request exceeds the maximum allowed number of bytes."}}),
        413, None, "invalid", False),
}


class _RouterTransport(httpx.AsyncBaseTransport):
    """The respx router as the proxy's upstream transport, its answers left unread for the proxy to
    stream (httpx.MockTransport reads them first; respx's own transport class is deprecated)."""

    def __init__(self, router: respx.Router) -> None:
        self.router = router

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self.router.async_handler(request)


@pytest.fixture(scope="module")
def mocked(database_url):
    router = respx.Router(base_url=UPSTREAM, assert_all_called=False)
    route = router.post("/chat/completions")
    settings = make_settings(database_url, UPSTREAM)
    with serve_proxy(settings, upstream_transport=_RouterTransport(router)) as p:
        yield p, route


@pytest.mark.parametrize("row", ROWS)
def test_each_row_of_the_failure_table(mocked, db: Db, key, cid, row):
    proxy, route = mocked
    effect, status, code, outcome, moves_head = ROWS[row]
    http = proxy.http(key)
    route.side_effect = None
    route.return_value = httpx.Response(200, json=COMPLETION)
    first = http.post("/v1/chat/completions", headers={"X-Conversation-Id": cid},
                      json={"model": "m", "messages": [user("first")]})
    assert first.status_code == 200, first.text
    head = first.headers["x-node-id"]

    if isinstance(effect, Exception):
        route.side_effect = effect
    else:
        route.return_value = effect
    r = http.post("/v1/chat/completions", headers={"X-Conversation-Id": cid},
                  json={"model": "m", "messages": [user("second")]})
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"}
    if code is not None:
        assert error["code"] == code
    node = db.node(r.headers["x-node-id"])
    assert node["status"] == "failed" and node["outcome"] == outcome and node["received"] is None
    assert db.head(cid) == (r.headers["x-node-id"] if moves_head else head)
    # the upstream was sent the assembled context: the first turn and the new question
    sent = route.calls.last.request
    assert [m["content"] for m in __import__("json").loads(sent.content)["messages"]] == ["first", "fine", "second"]
