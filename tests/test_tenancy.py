"""Tenancy (docs/behaviour.md#auth-and-tenancy): one tenant never sees another's conversations or nodes (404, never 403),
proxy-issued keys, an admin key, and keys never leaking into logs, bodies or storage."""

import gzip
import hashlib
import json
import logging
import uuid

import httpx
import openai
import pytest

from proxy.logs import JsonFormatter

from .conftest import Db, make_settings, serve_proxy
from .fakes import Reply
from .helpers import MODEL, say, user


def test_every_id_taking_endpoint_is_404_for_another_tenant(proxy, upstream, key, cid):
    owner, stranger = proxy.http(key), proxy.http(f"sk-stranger-{uuid.uuid4().hex}")
    _, a = say(proxy.openai(key), cid, user("private"))
    _, b = say(proxy.openai(key), cid, user("more private"))
    node = a["x-node-id"]
    # the stranger's own conversation with the same id is a different one
    _, own = say(proxy.openai(stranger.headers["authorization"][7:]), cid, user("stranger's"))
    checks = [
        ("get", f"/admin/nodes/{node}", None),
        ("get", f"/admin/nodes/{node}/children", None),
        ("get", f"/admin/nodes/{node}/request", None),
        ("post", f"/admin/conversations/{cid}-x/fork", {"node_id": node}),
    ]
    for method, url, body in checks:
        r = getattr(stranger, method)(url, **({"json": body} if body is not None else {}))
        assert r.status_code == 404, (url, r.text)
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    other = f"{cid}-owner-only"
    say(proxy.openai(key), other, user("owner only"))
    for method, url, body in [
        ("get", f"/admin/conversations/{other}", None),
        ("delete", f"/admin/conversations/{other}", None),
        ("put", f"/admin/conversations/{other}/head", {"node_id": None}),
        ("post", f"/admin/conversations/{other}/switch", {"node_id": node}),
        ("post", f"/admin/conversations/{other}/fork", {}),
        ("post", f"/admin/conversations/{other}/compact", None),
        ("get", f"/admin/conversations/{other}/path", None),
        ("get", f"/admin/conversations/{other}/tree", None),
    ]:
        r = getattr(stranger, method)(url, **({"json": body} if body is not None else {}))
        assert r.status_code == 404, (url, r.text)
    # moving the stranger's own head onto the owner's node, or hanging under it: 404 too
    r = stranger.put(f"/admin/conversations/{cid}/head", json={"node_id": node})
    assert r.status_code == 404 and r.json()["error"]["code"] == "node_not_found"
    with pytest.raises(openai.NotFoundError):
        say(proxy.openai(stranger.headers["authorization"][7:]), cid, user("x"), parent=b["x-node-id"])
    # and the owner still sees everything
    assert owner.get(f"/admin/conversations/{other}").status_code == 200
    assert owner.get(f"/admin/nodes/{node}").status_code == 200
    assert own["x-node-id"] != node


def _keys_settings(database_url, upstream_url, **overrides):
    return make_settings(database_url, upstream_url,
                         auth={"mode": "keys", "keys": [
                             {"key": "sk-proxy-alice-0123456789", "tenant": "alice"},
                             {"key": "sha256:" + hashlib.sha256(b"sk-proxy-bob-0123456789").hexdigest(), "tenant": "bob"},
                             {"key": "sk-proxy-admin-0123456789", "tenant": "ops", "admin": True},
                         ]},
                         upstreams=[{"name": "fake", "base_url": upstream_url, "models": ["*"],
                                     "api_key": "sk-upstream-secret-0123456789"}], **overrides)


@pytest.fixture
def keys_proxy(fresh_database_url, upstream_url):
    with serve_proxy(_keys_settings(fresh_database_url, upstream_url)) as p:
        yield p


@pytest.mark.parametrize("objects", ["pass", "refuse"])
def test_an_upstream_account_every_tenant_shares_keeps_its_objects_to_itself(fresh_database_url, upstream_url,
                                                                             upstream, objects):
    """Every tenant's calls go upstream with one configured key: the account's own objects -- an
    answer a pass-through call left stored there, files, batches -- are every tenant's through the
    pass-through (the contract's default, "pass"). With upstream_objects = "refuse" only calls to
    a model pass, and those an upstream may keep go with store: false."""
    settings = _keys_settings(fresh_database_url, upstream_url, server={"upstream_objects": objects})
    bob = "sk-proxy-bob-0123456789"
    with serve_proxy(settings) as p:
        http = p.http(bob)
        calls = [("POST", "/v1/chat/completions", {"model": "m", "messages": [user("not stored here")]}),
                 ("POST", "/v1/responses", {"model": "m", "input": "nor here"}),
                 ("POST", "/v1/embeddings", {"model": "m", "input": "x"}),
                 ("GET", "/v1/models", None)]
        objects_ = [("GET", "/v1/chat/completions", None), ("GET", "/v1/responses/resp_upstream_fake", None),
                    ("GET", "/v1/files", None), ("DELETE", "/v1/files/file-abc", None), ("POST", "/v1/batches", {})]
        for method, path, body in calls:
            for compressed in (False, True) if body else (False,):  # (read decoded: its store set all the same)
                sent = len(upstream.requests)
                if compressed:
                    http.request(method, path, content=gzip.compress(json.dumps(body).encode()),
                                 headers={"content-type": "application/json", "content-encoding": "gzip"})
                else:
                    http.request(method, path, json=body)
                assert len(upstream.requests) == sent + 1, path
                if path != "/v1/embeddings" and body:
                    assert upstream.requests[-1].body.get("store") is (False if objects == "refuse" else None), path
        for method, path, body in objects_:
            sent = len(upstream.requests)
            r = http.request(method, path, json=body)
            if objects == "refuse":
                assert (r.status_code, len(upstream.requests)) == (404, sent), path
                assert r.json()["error"]["code"] == "not_found"
            else:
                assert len(upstream.requests) == sent + 1, path


@pytest.mark.parametrize(("named", "stream"), [(True, False), (True, True), (False, False), (False, True)])
def test_the_operators_account_ids_never_reach_a_tenant(keys_proxy, upstream, cid, named, stream):
    """An upstream called with the operator's key answers with the operator's account ids
    (``openai-organization``, ``openai-project``; Anthropic's ``anthropic-organization-id`` on
    every answer): not relayed to a tenant, stored call or passed through -- as the same headers
    from a client are not forwarded to that account. An error answer neither."""
    account = [("openai-organization", "org-operator-acme"), ("openai-project", "proj_operator123"),
               ("anthropic-organization-id", "org-uuid-operator")]
    upstream.enqueue(Reply(kind="stream", headers=account) if stream else Reply(headers=account))
    upstream.enqueue(Reply(kind="error", status=429, headers=account))
    for status in (200, 429):
        r = keys_proxy.http("sk-proxy-alice-0123456789").post(
            "/v1/chat/completions", json={"model": MODEL, "messages": [user("q")], "stream": stream},
            headers={"X-Conversation-Id": cid} if named else {})
        assert r.status_code == status and ("x-node-id" in r.headers) == named
        assert not {"openai-organization", "openai-project", "anthropic-organization-id"} & set(r.headers), r.headers


def test_a_clients_own_account_ids_come_back_in_passthrough(proxy, upstream, key, cid):
    """In passthrough the account is the client's own: its ids come back as the upstream sent them."""
    upstream.enqueue(Reply(headers=[("openai-organization", "org-client"), ("openai-project", "proj_client")]))
    r = proxy.http(key).post("/v1/chat/completions", json={"model": MODEL, "messages": [user("q")]},
                             headers={"X-Conversation-Id": cid})
    assert r.headers["openai-organization"] == "org-client" and r.headers["openai-project"] == "proj_client"


def test_keys_mode(keys_proxy, upstream, cid):
    alice, bob, admin = "sk-proxy-alice-0123456789", "sk-proxy-bob-0123456789", "sk-proxy-admin-0123456789"
    with pytest.raises(openai.AuthenticationError):
        say(keys_proxy.openai("sk-proxy-mallory"), cid, user("x"))
    assert httpx.get(f"{keys_proxy.url}/admin/conversations").status_code == 401
    _, h = say(keys_proxy.openai(alice), cid, user("alice's secret"))
    assert upstream.last.headers["authorization"] == "Bearer sk-upstream-secret-0123456789"  # never the proxy key
    say(keys_proxy.openai(bob), cid, user("bob's"))  # a key stored hashed works
    assert "alice's secret" not in upstream.last.text()
    assert keys_proxy.http(bob).get(f"/admin/nodes/{h['x-node-id']}").status_code == 404
    # the admin key sees every tenant, and names one for conversation ids
    listed = keys_proxy.http(admin).get("/admin/conversations").json()["data"]
    assert {(c["tenant"], c["id"]) for c in listed} >= {("alice", cid), ("bob", cid)}
    assert keys_proxy.http(admin).get(f"/admin/conversations/{cid}", params={"tenant": "alice"}).json()["head_node_id"] == h["x-node-id"]
    assert keys_proxy.http(admin).get(f"/admin/nodes/{h['x-node-id']}").status_code == 200
    assert keys_proxy.http(alice).get("/admin/conversations").json()["data"][0].get("tenant") is None
    assert keys_proxy.http(alice).get(f"/admin/conversations/{cid}", params={"tenant": "bob"}).json()["head_node_id"] == h["x-node-id"]
    # usage: an admin key sees every tenant's by tenant, or one tenant's; a tenant only its own
    by_tenant = {line["tenant"]: line["calls"] for line in keys_proxy.http(admin).get("/admin/usage").json()["data"]}
    assert by_tenant == {"alice": 1, "bob": 1}
    assert [line["tenant"] for line in keys_proxy.http(admin).get("/admin/usage", params={"tenant": "bob"}).json()["data"]] == ["bob"]
    assert [("tenant" in line, line["calls"]) for line in keys_proxy.http(alice).get("/admin/usage").json()["data"]] == [(False, 1)]
    # a tenant no key can name (a NUL in it) is a 400, not the database's refusal
    for path in ("/admin/conversations", "/admin/usage", f"/admin/conversations/{cid}", f"/admin/nodes/{h['x-node-id']}"):
        r = keys_proxy.http(admin).get(path, params={"tenant": "alice\x00"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "tenant", (path, r.text)


def test_keys_never_leak(keys_proxy, upstream, cid, fresh_database_url, caplog):
    caplog.set_level(logging.DEBUG)
    secrets = ["sk-proxy-alice-0123456789", "sk-upstream-secret-0123456789"]
    client = keys_proxy.openai(secrets[0])
    bodies, headers = [], []
    r = client.chat.completions.with_raw_response.create(model=MODEL, messages=[user("hi")], extra_headers={"X-Conversation-Id": cid})
    bodies.append(r.http_response.text)
    headers.append(str(r.headers))
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=[user("s")], stream=True,
                                                           extra_headers={"X-Conversation-Id": cid})
    bodies.append(raw.http_response.read().decode())
    # an upstream that echoes the key it was given, in a conversation, a stream and a pass-through
    echo = {"message": "Incorrect API key provided: sk-upstream-secret-0123456789.", "type": "invalid_request_error",
            "param": None, "code": "invalid_api_key"}
    for stream, conversation in ((False, cid), (True, cid), (False, None)):
        upstream.enqueue(Reply(kind="error", status=401, error=echo))
        with httpx.Client(base_url=keys_proxy.url) as http:
            h = {"Authorization": f"Bearer {secrets[0]}"}
            if conversation:
                h["X-Conversation-Id"] = conversation
            resp = http.post("/v1/chat/completions", headers=h, json={"model": MODEL, "messages": [user("x")], "stream": stream})
        assert resp.status_code == 401
        bodies.append(resp.text)
        headers.append(str(resp.headers))
    upstream.enqueue(Reply(content="", error_event={"message": "bad key sk-upstream-secret-0123456789", "type": "auth"}))
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=[user("s2")], stream=True,
                                                           extra_headers={"X-Conversation-Id": cid})
    bodies.append(raw.http_response.read().decode())
    keys_proxy.http(secrets[0]).post(f"/admin/conversations/{cid}/compact")
    db = Db(fresh_database_url)
    stored = json.dumps([dict(r) for r in db.fetch("SELECT * FROM nodes")], default=str)
    stored += json.dumps([dict(r) for r in db.fetch("SELECT * FROM conversations")], default=str)
    formatter = JsonFormatter()
    logs = "\n".join(formatter.format(r) for r in caplog.records)
    assert "[redacted]" in "".join(bodies)  # the echo was there, and masked
    for secret in secrets:
        for where, text in (("response bodies", "".join(bodies)), ("response headers", "".join(headers)),
                            ("storage", stored), ("logs", logs)):
            assert secret not in text, f"{secret} leaked into {where}"


def test_auth_mode_none_is_one_local_tenant(fresh_database_url, upstream_url, upstream, cid):
    settings = make_settings(fresh_database_url, upstream_url, auth={"mode": "none"})
    with serve_proxy(settings) as p:
        r = httpx.post(f"{p.url}/v1/chat/completions", headers={"X-Conversation-Id": cid},  # no key at all
                       json={"model": MODEL, "messages": [user("first")]})
        assert r.status_code == 200 and "authorization" not in upstream.last.headers
        # any key (or none) reaches the same conversations; a key, if sent, is still forwarded
        say(p.openai("sk-anything-0123456789"), cid, user("second"))
        assert upstream.last.messages[0] == user("first")
        assert upstream.last.headers["authorization"] == "Bearer sk-anything-0123456789"
        assert httpx.get(f"{p.url}/admin/conversations/{cid}").json()["node_count"] == 2


@pytest.mark.parametrize("transport", ["builtin", "httpx", "aiohttp"])
def test_an_upstream_cookie_never_reaches_another_tenant(database_url, upstream_url, upstream, cid, transport):
    """The proxy keeps no cookie jar: a Set-Cookie an upstream sends in one tenant's answer is not
    sent back with anyone's later request (the client's own Cookie header passes through). The
    upstream is addressed by a host name: a cookie jar that keeps cookies only for names (aiohttp's
    ignores IP addresses) would go unnoticed against 127.0.0.1."""
    from .fakes import Reply

    named_url = upstream_url.replace("127.0.0.1", "localhost")
    settings = make_settings(database_url, named_url, upstream_defaults={"transport": transport})
    with serve_proxy(settings) as p:
        upstream.enqueue(Reply(headers=[("set-cookie", "session=tenant-a-secret; Path=/")]))
        p.openai("sk-tenant-a").chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}],
                                                        extra_headers={"X-Conversation-Id": cid})
        p.openai("sk-tenant-b").chat.completions.create(model="m", messages=[{"role": "user", "content": "b"}],
                                                        extra_headers={"X-Conversation-Id": cid})
        assert "cookie" not in upstream.last.headers
        httpx.get(f"{p.url}/v1/models", headers={"Authorization": "Bearer sk-tenant-b"})
        assert "cookie" not in upstream.last.headers
