"""Protocol-level upstream faults: each ends as a failed node under the right head rule and a
clean OpenAI-shaped error for the client (mid-stream: one final SSE error event)."""

import httpx
import pytest

from .conftest import Db, assert_invariants, make_settings, serve_proxy
from .fakes import EvilUpstream
from .helpers import MODEL


@pytest.fixture(scope="module")
def evil():
    server = EvilUpstream()
    yield server
    server.close()


TRANSPORTS = ["builtin", "httpx", "aiohttp"]  # every one [upstream_defaults] transport can select


def _settings(url, upstream, transport, read_timeout=10.0):
    return make_settings(url, upstream, upstream_defaults={"read_timeout": read_timeout, "connect_timeout": 2.0,
                                                           "transport": transport})


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("mode", ["close", "reset", "partial_headers", "short_body", "garbage"])
@pytest.mark.parametrize("stream", [False, True])
def test_protocol_faults_fail_cleanly(fresh_database_url, evil, key, cid, mode, stream, transport):
    evil.mode = mode
    db = Db(fresh_database_url)
    with serve_proxy(_settings(fresh_database_url, evil.url, transport)) as p, httpx.Client(base_url=p.url, timeout=10) as http:
        r = http.post("/v1/chat/completions", headers={"Authorization": f"Bearer {key}", "X-Conversation-Id": cid},
                      json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": stream})
        assert r.status_code == 502, r.text
        error = r.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["code"] in ("upstream_unreachable", "upstream_bad_response")
        node = db.node(r.headers["x-node-id"])
        assert node["status"] == "failed" and node["outcome"] == "transient"
        assert db.head(cid) == r.headers["x-node-id"]  # transient: the failed node is the head
    assert_invariants(fresh_database_url)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_connection_reset_mid_stream(fresh_database_url, evil, key, cid, transport):
    evil.mode = "stream_reset"
    db = Db(fresh_database_url)
    with serve_proxy(_settings(fresh_database_url, evil.url, transport)) as p, httpx.Client(base_url=p.url, timeout=10) as http:
        with http.stream("POST", "/v1/chat/completions",
                         headers={"Authorization": f"Bearer {key}", "X-Conversation-Id": cid},
                         json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}) as r:
            assert r.status_code == 200
            body = r.read()
        events = [e for e in body.split(b"\n\n") if e]
        assert b"partial" in events[0]
        assert events[-1].startswith(b'data: {"error"') and b"[DONE]" not in body
        node = db.node(r.headers["x-node-id"])
        assert node["status"] == "failed" and node["error"]["code"] == "stream_interrupted"
        assert node["received"] is None  # the partial answer never becomes context
        assert db.head(cid) == r.headers["x-node-id"]
    assert_invariants(fresh_database_url)


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("mode", ["hang", "stream_stall"])
def test_an_upstream_that_stops_answering_times_out(fresh_database_url, evil, key, cid, transport, mode):
    evil.mode = mode
    db = Db(fresh_database_url)
    stream = mode == "stream_stall"
    with serve_proxy(_settings(fresh_database_url, evil.url, transport, read_timeout=0.5)) as p, \
            httpx.Client(base_url=p.url, timeout=10) as http:
        with http.stream("POST", "/v1/chat/completions",
                         headers={"Authorization": f"Bearer {key}", "X-Conversation-Id": cid},
                         json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": stream}) as r:
            body = r.read()
        node = db.node(r.headers["x-node-id"])
        if stream:  # the stream had begun: one final error event, the node failed as interrupted
            assert r.status_code == 200 and body.rstrip().split(b"\n\n")[-1].startswith(b'data: {"error"')
            assert node["error"]["code"] == "upstream_timeout"  # (a timeout is said as one, mid-stream too)
            assert b'"code":"upstream_timeout"' in body.rstrip().split(b"\n\n")[-1]
        else:
            assert r.status_code == 504 and r.json()["error"]["code"] == "upstream_timeout"
            assert node["error"]["code"] == "upstream_timeout"
        assert node["status"] == "failed" and node["outcome"] == "transient"
    assert_invariants(fresh_database_url)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_compressed_answer_is_stored_and_relayed_decoded(fresh_database_url, upstream_url, upstream, key, cid,
                                                          transport):
    """An upstream that gzips its answer: the stored call keeps the decoded message and answers the
    client plain JSON (no Content-Encoding left over); the pass-through relays it readably; a body
    that says gzip and is not fails the call as a bad response (502), not as a proxy error."""
    import gzip
    import json

    from .fakes import Reply, completion
    from .helpers import user

    squeezed = gzip.compress(json.dumps(completion(Reply(content="squeezed"), MODEL, 3)).encode())
    auth = {"Authorization": f"Bearer {key}"}
    with serve_proxy(_settings(fresh_database_url, upstream_url, transport)) as p, \
            httpx.Client(base_url=p.url, timeout=10) as http:
        upstream.enqueue(Reply(kind="raw", body=squeezed, headers=[("content-encoding", "gzip")]))
        r = http.post("/v1/chat/completions", headers={**auth, "X-Conversation-Id": cid},
                      json={"model": MODEL, "messages": [user("hi")]})
        assert r.status_code == 200, r.text
        assert "content-encoding" not in r.headers and r.json()["choices"][0]["message"]["content"] == "squeezed"
        node = Db(fresh_database_url).node(r.headers["x-node-id"])
        assert node["status"] == "success" and node["received"][0]["content"] == "squeezed"

        upstream.enqueue(Reply(kind="raw", body=squeezed, headers=[("content-encoding", "gzip")]))
        r = http.post("/v1/chat/completions", headers=auth, json={"model": MODEL, "messages": [user("hi")]})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "squeezed"

        # a coding the proxy does not undo (br): the pass-through relays the bytes and says what they are
        upstream.enqueue(Reply(kind="raw", body=b"\x8b\x03\x80opaque", headers=[("content-encoding", "br")]))
        r = http.post("/v1/chat/completions", headers={**auth, "Accept-Encoding": "identity"},
                      json={"model": MODEL, "messages": [user("hi")]})
        assert r.status_code == 200 and r.headers["content-encoding"] == "br"
        assert r.read() == b"\x8b\x03\x80opaque"
        upstream.enqueue(Reply(kind="raw", body=b"\x8b\x03\x80opaque", headers=[("content-encoding", "br")]))
        r = http.post("/v1/chat/completions", headers={**auth, "X-Conversation-Id": cid},  # (stored: unreadable)
                      json={"model": MODEL, "messages": [user("br")]})
        assert r.status_code == 502 and "content-encoding" not in r.headers

        upstream.enqueue(Reply(kind="raw", body=b"not gzip at all", headers=[("content-encoding", "gzip")]))
        r = http.post("/v1/chat/completions", headers={**auth, "X-Conversation-Id": cid},
                      json={"model": MODEL, "messages": [user("again")]})
        assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_bad_response", r.text
        assert Db(fresh_database_url).node(r.headers["x-node-id"])["status"] == "failed"
