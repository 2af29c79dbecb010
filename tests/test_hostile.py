"""Hostile and malformed input: always a clear OpenAI-shaped 4xx, never a 5xx."""

import httpx
import pytest

CASES = [
    ("empty body", b"", {}),
    ("not json", b"model=gpt", {}),
    ("invalid utf-8", b'{"model": "m", "messages": [{"role": "user", "content": "\xff\xfe"}]}', {}),
    ("json nesting bomb", b"[" * 100_000 + b"]" * 100_000, {}),
    ("number as body", b"42", {}),
    ("null model", b'{"model": null, "messages": []}', {}),
    ("messages object", b'{"model": "m", "messages": {"role": "user"}}', {}),
    ("message not object", b'{"model": "m", "messages": ["hi"]}', {}),
    ("unknown role", b'{"model": "m", "messages": [{"role": "root", "content": "x"}]}', {}),
    ("stream_options string", b'{"model": "m", "messages": [], "stream": true, "stream_options": "yes"}', {}),
    ("parent header garbage", b'{"model": "m", "messages": []}', {"X-Parent-Node-Id": "../../etc/passwd"}),
    ("kind header garbage", b'{"model": "m", "messages": []}', {"X-Node-Kind": "compaction"}),
    ("conversation id too long", b'{"model": "m", "messages": []}', {"X-Conversation-Id": "c" * 500}),
    ("conversation id with newline-ish", b'{"model": "m", "messages": []}', {"X-Conversation-Id": "a b"}),
    ("path and header disagree", b'{"model": "m", "messages": []}', {"X-Conversation-Id": "other"}),
]


@pytest.mark.parametrize("name, body, headers", CASES, ids=[c[0] for c in CASES])
def test_hostile_chat_input(proxy, key, name, body, headers):
    path = "/c/hostile/v1/chat/completions" if name == "path and header disagree" else "/v1/chat/completions"
    h = {"Authorization": f"Bearer {key}", "content-type": "application/json", **headers}
    h.setdefault("X-Conversation-Id", "hostile")
    r = httpx.post(proxy.url + path, content=body, headers=h, timeout=10)
    assert 400 <= r.status_code < 500, (name, r.status_code, r.text[:200])
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"], name


@pytest.mark.parametrize("method, path, body", [
    ("get", "/admin/conversations/%00", None),
    ("get", "/admin/conversations/" + "x" * 300, None),
    ("get", "/admin/nodes/00000000-0000-0000-0000-00000000000g", None),
    ("get", "/admin/conversations?limit=-1", None),
    ("get", "/admin/conversations?limit=abc", None),
    ("get", "/admin/conversations?cursor=%ff%fe", None),
    ("get", "/admin/conversations?search=a%00b", None),  # PostgreSQL's text cannot hold NUL
    ("get", "/admin/conversations?cursor=WyIyMDI2LTAxLTAxVDAwOjAwOjAwKzAwOjAwIiwgImFcdTAwMDBiIl0", None),  # a cursor naming an id with NUL
    ("put", "/admin/conversations/x/head", b"{not json"),
    ("put", "/admin/conversations/x/head", b'{"node_id": 12}'),
    ("post", "/admin/conversations/x/fork", b'{"node_id": "x", "extra": true}'),
    ("post", "/admin/conversations/x/switch", b"[]"),
    ("delete", "/admin/nodes/x", None),
    ("patch", "/admin/conversations/x", b"{}"),
])
def test_hostile_admin_input(proxy, key, method, path, body):
    r = httpx.request(method.upper(), proxy.url + path, content=body, timeout=10,
                      headers={"Authorization": f"Bearer {key}", "content-type": "application/json"})
    assert 400 <= r.status_code < 500, (path, r.status_code, r.text[:200])
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}
