"""Hostile and malformed input: always a clear OpenAI-shaped 4xx, never a 5xx."""

import httpx
import pytest

CASES = [
    ("empty body", b"", {}, (400, "invalid_request", None)),
    ("not json", b"model=gpt", {}, (400, "invalid_request", None)),
    ("invalid utf-8", b'{"model": "m", "messages": [{"role": "user", "content": "\xff\xfe"}]}', {}, (400, "invalid_request", None)),
    ("json nesting bomb", b"[" * 100_000 + b"]" * 100_000, {}, (400, "invalid_request", None)),
    ("number as body", b"42", {}, (400, "invalid_request", None)),
    ("null model", b'{"model": null, "messages": []}', {}, (400, "invalid_request", "model")),
    ("messages object", b'{"model": "m", "messages": {"role": "user"}}', {}, (400, "invalid_request", "messages")),
    ("message not object", b'{"model": "m", "messages": ["hi"]}', {}, (400, "invalid_request", "messages[0]")),
    ("unknown role", b'{"model": "m", "messages": [{"role": "root", "content": "x"}]}', {}, (400, "invalid_request", "messages[0].role")),
    ("stream_options string", b'{"model": "m", "messages": [], "stream": true, "stream_options": "yes"}', {}, (400, "invalid_request", "stream_options")),
    ("parent header garbage", b'{"model": "m", "messages": []}', {"X-Parent-Node-Id": "../../etc/passwd"}, (400, "invalid_request", "X-Parent-Node-Id")),
    ("kind header garbage", b'{"model": "m", "messages": []}', {"X-Node-Kind": "compaction"}, (400, "invalid_request", "X-Node-Kind")),
    ("conversation id too long", b'{"model": "m", "messages": []}', {"X-Conversation-Id": "c" * 500}, (400, "invalid_conversation_id", "X-Conversation-Id")),
    ("conversation id with newline-ish", b'{"model": "m", "messages": []}', {"X-Conversation-Id": "a b"}, (400, "invalid_conversation_id", "X-Conversation-Id")),
    ("path and header disagree", b'{"model": "m", "messages": []}', {"X-Conversation-Id": "other"}, (400, "invalid_conversation_id", "X-Conversation-Id")),
]


@pytest.mark.parametrize("name, body, headers, expected", CASES, ids=[c[0] for c in CASES])
def test_hostile_chat_input(proxy, key, name, body, headers, expected):
    """``expected``: the status, the error's code and its param."""
    path = "/c/hostile/v1/chat/completions" if name == "path and header disagree" else "/v1/chat/completions"
    h = {"Authorization": f"Bearer {key}", "content-type": "application/json", **headers}
    h.setdefault("X-Conversation-Id", "hostile")
    r = httpx.post(proxy.url + path, content=body, headers=h, timeout=10)
    error = r.json()["error"]
    assert (r.status_code, error["code"], error["param"]) == expected, (name, r.text[:200])
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error", name


@pytest.mark.parametrize("method, path, body, expected", [
    ("get", "/admin/conversations/%00", None, (400, "invalid_conversation_id", "conversation_id")),
    ("get", "/admin/conversations/" + "x" * 300, None, (400, "invalid_conversation_id", "conversation_id")),
    ("get", "/admin/nodes/00000000-0000-0000-0000-00000000000g", None, (400, "invalid_request", "node_id")),
    ("get", "/admin/conversations?limit=-1", None, (400, "invalid_request", "limit")),
    ("get", "/admin/conversations?limit=abc", None, (400, "invalid_request", "limit")),
    ("get", "/admin/conversations?cursor=%ff%fe", None, (400, "invalid_request", "cursor")),
    ("get", "/admin/conversations?search=a%00b", None, (400, "invalid_request", "search")),  # PostgreSQL's text cannot hold NUL
    ("get", "/admin/conversations?cursor=WyIyMDI2LTAxLTAxVDAwOjAwOjAwKzAwOjAwIiwgImFcdTAwMDBiIl0", None, (400, "invalid_request", "cursor")),  # a cursor naming an id with NUL
    ("put", "/admin/conversations/x/head", b"{not json", (400, "invalid_request", None)),
    ("put", "/admin/conversations/x/head", b'{"node_id": 12}', (400, "invalid_request", "node_id")),
    ("post", "/admin/conversations/x/fork", b'{"node_id": "x", "extra": true}', (400, "invalid_request", "node_id")),
    ("post", "/admin/conversations/x/switch", b"[]", (400, "invalid_request", None)),
    ("delete", "/admin/nodes/x", None, (405, "method_not_allowed", None)),
    ("patch", "/admin/conversations/x", b"{}", (405, "method_not_allowed", None)),
])
def test_hostile_admin_input(proxy, key, method, path, body, expected):
    """``expected``: the status, the error's code and its param."""
    r = httpx.request(method.upper(), proxy.url + path, content=body, timeout=10,
                      headers={"Authorization": f"Bearer {key}", "content-type": "application/json"})
    error = r.json()["error"]
    assert (r.status_code, error["code"], error["param"]) == expected, (path, r.text[:200])
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error", path
