"""Hostile clients and hostile upstreams (docs/behaviour.md#limits-and-hostile-peers): each defect
of an outside review, reproduced through the real HTTP API. Every test here failed on the code
before the fix."""

import functools
import http.client
import json
import socket
import threading
import time
import uuid
from collections.abc import Callable
from urllib.parse import urlsplit

import httpx
import openai
import pytest

from .conftest import (
    Db,
    assert_invariants,
    make_settings,
    new_key,
    proxy_with,
    serve_proxy,
    spawn_proxy,
    three_upstreams,
    wait_for,
)
from .fakes import Reply, ServerThread, asgi_body, serve_connections
from .helpers import MODEL, say, user


def raw_request(url: str, method: str, path: str, headers: dict | None = None, body: bytes | None = None):
    """A request whose path goes out exactly as written (no client-side normalisation)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)
        for k, v in (headers or {}).items():
            conn.putheader(k, v)
        if body is not None:
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


# -- 1. the pass-through never leaves the upstream's base path ----------------------------------

TRAVERSALS = [
    "/v1/../internal/admin", "/v1/..%2F..%2Finternal%2Fadmin", "/v1/%2e%2e/%2e%2e/internal", "/v1/%2E%2E/x",
    "/v1/%252e%252e/%252e%252e/x", "/v1/models/..", "/v1/models/./x", "/v1/..%5C..%5Cadmin", "/c/conv-1/v1/..%2F..%2Fadmin",
    "/c/conv-1/v1/chat/completions/..%2F..%2F..%2Fadmin", "/auto/v1/..%2F..%2Fadmin", "/v1/a%0d%0ab", "/v1/a%00b",
    "/v1/a%09b",
    # a dot segment with a path parameter (Tomcat and Jetty read `..;x` as `..`), encoded or not
    "/v1/..;/admin", "/v1/..;x=1/admin", "/v1/%2e%2e%3b/admin", "/v1/.;/x", "/c/conv-1/v1/..;/..;/admin",
]


@pytest.mark.parametrize("path", TRAVERSALS)
def test_pass_through_paths_that_leave_the_base_are_refused_and_nothing_is_sent(proxy, upstream, key, path):
    status, body = raw_request(proxy.url, "GET", path, {"Authorization": f"Bearer {key}"})
    assert status == 400, body
    error = json.loads(body)["error"]
    assert error["code"] == "invalid_request" and set(error) == {"message", "type", "param", "code"}
    assert upstream.requests == []


def test_ordinary_pass_through_paths_still_pass(proxy, upstream, key):
    assert raw_request(proxy.url, "GET", "/v1/models", {"Authorization": f"Bearer {key}"})[0] == 200
    status, _ = raw_request(proxy.url, "GET", "/v1/files/file-a%2Fb?limit=2", {"Authorization": f"Bearer {key}"})
    assert status == 404  # the fake has no such route, but it was asked -- raw, as the client wrote it
    assert upstream.requests[-1].path == "/v1/files/file-a/b"


@pytest.mark.parametrize("path", ["/c/{cid}//v1/models", "//c/{cid}/v1/models", "//v1/models", "/auto//v1/models",
                                  "//auto/v1/models", "/c/{cid}/v1//models", "/c//{cid}/v1/models"])
def test_a_doubled_slash_in_the_prefix_forwards_the_clients_path(proxy, upstream, key, path):
    """The router reads a doubled slash as one; the pass-through counts the proxy's own segments
    (``/v1``, ``/auto/v1``, ``/c/{id}/v1``) the same way, so the upstream gets the client's path.
    Counted in the raw path, an empty segment was one of them: ``/c/{id}//v1/models`` and
    ``//v1/models`` reached the upstream as ``/v1/v1/models``."""
    status, body = raw_request(proxy.url, "GET", path.format(cid=f"dbl-{uuid.uuid4().hex[:8]}"),
                               {"Authorization": f"Bearer {key}"})
    assert status == 200, body
    assert [r.path for r in upstream.requests] == ["/v1/models"]


def test_head_is_answered_like_get_and_passed_through_as_head(proxy, upstream, key):
    """RFC 9110: a server takes HEAD wherever it takes GET (uptime monitors and load balancers
    probe with it); every GET route answered it 405. Now HEAD gets the GET's status and headers
    without its body, and the pass-through sends the upstream a HEAD."""
    headers = {"Authorization": f"Bearer {key}"}
    for path in ("/healthz", "/readyz", "/v1/models", "/admin/conversations", "/ui/"):
        get = httpx.get(proxy.url + path, headers=headers, timeout=10)
        head = httpx.head(proxy.url + path, headers=headers, timeout=10)
        assert get.status_code == 200 and get.content
        assert (head.status_code, head.content) == (200, b""), (path, head.status_code, head.headers)
        assert head.headers["content-type"] == get.headers["content-type"]
    assert [(r.method, r.path) for r in upstream.requests] == [("GET", "/v1/models"), ("HEAD", "/v1/models")]


# -- 2. a fork racing a delete of its source ----------------------------------------------------

def race(*actions: Callable[[], None]) -> None:
    """Run each of ``actions`` in a thread of its own, all released at once, and wait for them."""
    barrier = threading.Barrier(len(actions))

    def run(action: Callable[[], None]) -> None:
        barrier.wait(10)
        action()

    threads = [threading.Thread(target=run, args=(action,)) for action in actions]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        assert not t.is_alive(), "a racer never finished"


def test_forks_racing_deletes_never_dangle_and_never_500(fresh_database_url, upstream_url, upstream):
    key = new_key()
    statuses = []
    with serve_proxy(make_settings(fresh_database_url, upstream_url)) as p:
        http_ = p.http(key)
        for round_ in range(12):
            source = f"src-{round_}"
            say(p.openai(key), source, user("one"))
            say(p.openai(key), source, user("two"))

            def fork(i: int, source: str = source) -> None:
                r = http_.post(f"/admin/conversations/{source}/fork", json={"conversation_id": f"{source}-f{i}"})
                statuses.append(r.status_code)

            def delete(source: str = source) -> None:
                statuses.append(http_.delete(f"/admin/conversations/{source}").status_code)

            race(*(functools.partial(fork, i) for i in range(4)), delete)
            # every fork that exists has its context: a turn on it works
            for i in range(4):
                if http_.get(f"/admin/conversations/{source}-f{i}").status_code == 200:
                    _, h = say(p.openai(key), f"{source}-f{i}", user("after the race"))
                    assert "one" in upstream.last.text() and "two" in upstream.last.text()
    assert all(s < 500 for s in statuses), statuses
    assert set(statuses) <= {200, 404}
    assert_invariants(fresh_database_url)


def test_a_delete_racing_side_calls_never_500(fresh_database_url, upstream_url, upstream):
    key = new_key()
    statuses = []
    with serve_proxy(make_settings(fresh_database_url, upstream_url)) as p:
        client, http_ = p.openai(key), p.http(key)
        for round_ in range(8):
            cid = f"side-{round_}"
            say(client, cid, user("base"))

            def side(cid: str = cid) -> None:
                r = http_.post("/v1/chat/completions", headers={"X-Conversation-Id": cid, "X-Node-Kind": "transform"},
                               json={"model": MODEL, "messages": [user("side")]})
                statuses.append(r.status_code)

            def delete(cid: str = cid) -> None:
                statuses.append(http_.delete(f"/admin/conversations/{cid}").status_code)

            race(side, side, side, delete)
    assert all(s < 500 for s in statuses), statuses
    assert_invariants(fresh_database_url)


# -- 3. an answer the database cannot hold as it is ---------------------------------------------

@pytest.mark.parametrize("stream", [False, True])
def test_an_answer_with_nul_characters_is_stored_losslessly(proxy, upstream, key, cid, db, stream):
    client = proxy.openai(key, conversation=cid)
    upstream.enqueue(Reply(content="before\u0000after", extra_message={"annotations": [{"k\u0000": "v"}]}))
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=[user("nul please")], stream=stream)
    if stream:
        text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
    else:
        text = raw.parse().choices[0].message.content
    assert text == "before\u0000after"
    node = proxy.http(key).get(f"/admin/nodes/{raw.headers['x-node-id']}").json()
    assert node["status"] == "success" and node["received"][0]["content"] == "before\u0000after"
    # the conversation is free and the answer is in the next call's context, as the client saw it
    say(client, None, user("next"))
    assert upstream.last.messages[1]["content"] == "before\u0000after"
    assert db.head(cid) != raw.headers["x-node-id"]


def test_nul_characters_sent_by_a_client_are_stored_and_a_nul_model_is_refused(proxy, upstream, key, cid):
    client = proxy.openai(key, conversation=cid)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[user("a\u0000b")], extra_body={"metadata": {"k\u0000ey": "v\u0000"}})
    node = proxy.http(key).get(f"/admin/nodes/{raw.headers['x-node-id']}").json()
    assert node["sent"] == [user("a\u0000b")] and node["params"]["metadata"] == {"k\u0000ey": "v\u0000"}
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="gpt\u0000", messages=[user("x")])


# A lone UTF-16 surrogate escape ("\ud83d": half an emoji) is valid JSON by the grammar -- what
# JavaScript's JSON.stringify writes for a string cut mid-emoji, what a server slicing its text in
# UTF-16 units streams -- and Python's json and JavaScript's JSON.parse take it. An upstream that
# speaks it (or a client) is answered, never failed.

class ScriptedUpstream:
    """An upstream of any API answering each call with the next bytes queued, recording the
    requests it got (their raw bodies)."""

    def __init__(self) -> None:
        self.queue: list[tuple[str, bytes]] = []  # (content type, body)
        self.bodies: list[bytes] = []

    async def __call__(self, scope, receive, send):
        raw = await asgi_body(scope, receive, send)
        if raw is None:
            return
        self.bodies.append(raw)
        content_type, body = self.queue.pop(0)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", content_type.encode())]})
        await send({"type": "http.response.body", "body": body})


@pytest.fixture
def scripted(database_url):
    """A proxy in front of a ``ScriptedUpstream``: ``claude-*`` models to it as Anthropic's API, the
    rest as a chat-completions one. (Each test's own: a module's proxy holds its connections for the
    whole module, and a Citus coordinator's allowance is not large.)"""
    fake = ScriptedUpstream()
    with ServerThread(fake) as server:
        url = server.url + "/v1"
        ups = [{"name": "anthropic", "base_url": url, "models": ["claude-*"], "api": "anthropic"},
               {"name": "chatty", "base_url": url, "models": ["*"]}]
        with serve_proxy(make_settings(database_url, url, upstreams=ups)) as p:
            yield p, fake


def _split_emoji_stream(api: str) -> bytes:
    """An answer "smile 😀 " and a last lone half, the emoji's two halves in two deltas."""
    texts = ["smile ", "\\ud83d", "\\ude00 \\ud83d"]
    if api == "chat":
        chunk = ('data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m",'
                 '"choices":[{"index":0,"delta":{"content":"%s"},"finish_reason":%s}]}\n\n')
        return "".join([*(chunk % (t, "null") for t in texts), chunk % ("", '"stop"'), "data: [DONE]\n\n"]).encode()
    start = ('event: message_start\ndata: {"type":"message_start","message":{"id":"msg_up","type":"message",'
             '"role":"assistant","model":"claude-x","content":[],"stop_reason":null,"stop_sequence":null,'
             '"usage":{"input_tokens":10,"output_tokens":1}}}\n\n'
             'event: content_block_start\ndata: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}\n\n')
    delta = 'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"%s"}}\n\n'
    end = ('event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n'
           'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},'
           '"usage":{"output_tokens":3}}\n\n'
           'event: message_stop\ndata: {"type":"message_stop"}\n\n')
    return (start + "".join(delta % t for t in texts) + end).encode()


def _streamed_text(client: str, body: bytes) -> str:
    """The text a client read from a stream (every event's data parsed by ``json.loads``, as the
    SDKs do), its halves joined as JavaScript shows them."""
    datas = [json.loads(line[5:]) for line in body.decode().split("\n") if line.startswith("data: {")]
    assert not any(d.get("type") == "error" or "error" in d for d in datas), body
    if client == "chat":
        texts = [d["choices"][0]["delta"].get("content") or "" for d in datas if d.get("choices")]
    elif client == "messages":
        texts = [d["delta"]["text"] for d in datas if d.get("type") == "content_block_delta"]
    else:
        texts = [d["delta"] for d in datas if d.get("type") == "response.output_text.delta"]
    return "".join(texts).encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


@pytest.mark.parametrize("client, api", [("chat", "chat"), ("messages", "chat"), ("responses", "chat"),
                                         ("messages", "anthropic"), ("chat", "anthropic")])
def test_an_emoji_cut_across_two_stream_deltas_is_relayed_and_stored_whole(scripted, key, cid, client, api):
    """An upstream streaming an emoji's UTF-16 halves in two deltas ("\\ud83d", then "\\ude00")
    -- and a last half alone -- was an event "whose data is not JSON" (msgspec refuses lone
    surrogates) and failed the call. Now the stream reaches the client as valid JSON (relayed as
    it came, or translated with the halves written as the escapes they came as), and the stored
    answer -- the next call's context -- holds the emoji whole and U+FFFD for the lone half
    (the database cannot hold a half)."""
    proxy, fake = scripted
    model = "claude-x" if api == "anthropic" else MODEL
    path, body = {"chat": ("/v1/chat/completions", {"messages": [user("q")]}),
                  "messages": ("/v1/messages", {"messages": [user("q")], "max_tokens": 50}),
                  "responses": ("/v1/responses", {"input": "q"})}[client]
    fake.queue.append(("text/event-stream", _split_emoji_stream(api)))
    http = proxy.http(key)
    r = http.post(path, json={"model": model, **body, "stream": True},
                  headers={"X-Conversation-Id": cid, "x-api-key": key})
    assert r.status_code == 200
    assert _streamed_text(client, r.content) == "smile \U0001f600 \ufffd"
    node = proxy.db.node(r.headers["x-node-id"])  # (stored before the client saw the stream's end)
    assert node["status"] == "success", node["error"]
    assert "smile \U0001f600 \ufffd" in json.dumps(node["received"], ensure_ascii=False)
    fake.queue.append(("application/json", json.dumps(
        {"id": "c", "object": "chat.completion", "created": 1, "model": "m", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]}
        if api == "chat" else
        {"id": "msg_up", "type": "message", "role": "assistant", "model": "claude-x", "stop_reason": "end_turn",
         "stop_sequence": None, "content": [{"type": "text", "text": "ok"}],
         "usage": {"input_tokens": 5, "output_tokens": 2}}).encode()))
    r = http.post(path, json={"model": model, **body}, headers={"X-Conversation-Id": cid, "x-api-key": key})
    assert r.status_code == 200, r.text
    assert "smile \U0001f600 \ufffd" in fake.bodies[-1].decode()  # (valid UTF-8: strict decoding)


@pytest.mark.parametrize("client", ["messages", "chat"])
def test_an_anthropic_stream_whose_lines_end_with_a_cr_alone_ends_with_its_end_event(scripted, key, cid, client):
    """Lines may end with a CR alone (the SSE standard): such a stream's last blank line is the
    body's last byte, a CR the parser held back for a chunk that never came -- message_stop was
    never read, and a stream the client had whole ended in an error event, its node failed as
    stream_interrupted. Now the body's end ends that line: answered and stored whole."""
    proxy, fake = scripted
    path, body = {"chat": ("/v1/chat/completions", {"messages": [user("q")]}),
                  "messages": ("/v1/messages", {"messages": [user("q")], "max_tokens": 50})}[client]
    fake.queue.append(("text/event-stream", _split_emoji_stream("anthropic").replace(b"\n", b"\r")))
    r = proxy.http(key).post(path, json={"model": "claude-x", **body, "stream": True},
                             headers={"X-Conversation-Id": cid, "x-api-key": key})
    assert r.status_code == 200
    assert _streamed_text(client, r.content) == "smile \U0001f600 \ufffd"
    node = proxy.db.node(r.headers["x-node-id"])
    assert node["status"] == "success", node["error"]


def test_a_whole_answer_holding_a_lone_surrogate_is_answered(proxy, upstream, key, cid, db):
    """A whole answer cut mid-emoji ("cut emoji \\ud83d", finish_reason length) was a 502 "invalid
    JSON". Now a chat client gets it byte for byte, a translated one (Messages) valid UTF-8 with
    U+FFFD for the half, and the node stores U+FFFD."""
    body = (b'{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":'
            b'{"role":"assistant","content":"cut emoji \\ud83d"},"finish_reason":"length"}],'
            b'"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}')
    http = proxy.http(key)
    upstream.enqueue(Reply(kind="raw", body=body))
    r = http.post("/v1/chat/completions", json={"model": MODEL, "messages": [user("q")]}, headers={"X-Conversation-Id": cid})
    assert r.status_code == 200 and r.content == body
    assert db.node(r.headers["x-node-id"])["received"][0]["content"] == "cut emoji \ufffd"
    upstream.enqueue(Reply(kind="raw", body=body))
    r = http.post("/v1/messages", json={"model": MODEL, "max_tokens": 5, "messages": [user("q")]},
                  headers={"X-Conversation-Id": cid + "-m"})
    assert r.status_code == 200 and r.json()["content"][0]["text"] == "cut emoji \ufffd"
    r.content.decode()  # (strict: valid UTF-8)


def test_a_request_holding_a_lone_surrogate_is_taken(proxy, upstream, upstream_url, claude_server, key, cid, db):
    """A request whose text a JavaScript app cut mid-emoji (JSON.stringify writes "\\ud83d") was
    refused 400 "not valid JSON: Input data was truncated"; one that names no conversation went to
    the default upstream whatever its model. Now it is taken: the upstream gets valid UTF-8 with
    U+FFFD for the half, and the node stores the same; a call that names no conversation is routed
    by its model. JSON broken otherwise is refused as before."""
    http = proxy.http(key)
    content = b'{"model":"%s","messages":[{"role":"user","content":"truncated \\ud83d"}]}'
    r = http.post("/v1/chat/completions", content=content % MODEL.encode(),
                  headers={"X-Conversation-Id": cid, "content-type": "application/json"})
    assert r.status_code == 200, r.text
    assert "truncated \ufffd" in upstream.last.raw.decode()  # (valid UTF-8: strict decoding)
    assert upstream.last.messages == [user("truncated \ufffd")]
    assert db.node(r.headers["x-node-id"])["sent"] == [user("truncated \ufffd")]
    # not stored: routed by its model (native-* goes to the Responses upstream, translated)
    with serve_proxy(make_settings(db.url, upstream_url, upstreams=three_upstreams(upstream_url, claude_server))) as mp:
        r = mp.http(key).post("/v1/chat/completions", content=content % b"native-1",
                              headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text
    assert upstream.responses_requests[-1].input[0]["content"] == "truncated \ufffd"
    r = http.post("/v1/chat/completions", content=b'{"model":"%s","messages":[' % MODEL.encode(),
                  headers={"X-Conversation-Id": cid, "content-type": "application/json"})
    assert r.status_code == 400
    assert r.json()["error"]["message"] == "the request body is not valid JSON: Input data was truncated"


def test_a_lone_surrogate_in_streamed_tool_arguments_is_written_not_a_failure():
    """Tool arguments cut mid-emoji (max_tokens) by a stream whose events kept the half: the
    Messages translation of a chat answer wraps arguments that are no JSON object as an input
    object, and writing it failed on the half -- the stream ended in an error. Each place that
    writes such text writes the half as the escape it came as."""
    from proxy.dialects.messages.blocks.from_chat import input_json
    from proxy.dialects.messages.blocks.to_chat import _arguments
    from proxy.dialects.responses.tools import custom_arguments
    from proxy.surrogates import loads_piece

    cut = loads_piece(b'{"arguments": "{\\"q\\": \\"smile \\ud83d"}')["arguments"]
    assert cut == '{"q": "smile \ud83d'
    assert json.loads(input_json(cut)) == {"arguments": cut}
    assert json.loads(_arguments({"q": "smile \ud83d"})) == {"q": "smile \ud83d"}
    assert json.loads(custom_arguments("smile \ud83d")) == {"input": "smile \ud83d"}
    from proxy.dialects.responses.items import _search_arguments
    assert json.loads(_search_arguments("smile \ud83d")) == {"query": "smile \ud83d"}


def test_only_a_surrogate_escape_is_read_again():
    """The second reading is for surrogate escapes only: the text "\\ud83d" (an escaped
    backslash: code, a path) is none, and JSON refused for anything else stays refused -- a number
    out of range among them, which Python's reader would have taken as infinity."""
    import msgspec

    from proxy.surrogates import loads

    assert loads(b'{"m": "C:\\\\ud83d"}') == {"m": "C:\\ud83d"}
    for broken in (b'{"t": 1e999, "m": "C:\\\\ud83d"}', b'{"t": 1e999, "m": "\\ud83d"}',
                   b'{"t": NaN, "m": "\\ud83d"}', b'{"m": "\\ud83d"'):
        with pytest.raises(msgspec.DecodeError):
            loads(broken)


# -- 4. a database that answers too late ---------------------------------------------------------

class StallingRelay:
    """A Unix-socket relay in front of PostgreSQL that can stall: requests still reach the
    database, its answers are held back (and new connections wait) until ``flow()``."""

    def __init__(self, target_dir: str, directory: str, port: int = 5432) -> None:
        self.target = f"{target_dir}/.s.PGSQL.{port}"
        self.path = f"{directory}/.s.PGSQL.{port}"
        self.open = threading.Event()
        self.open.set()
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.bind(self.path)
        self.sock.listen(64)
        serve_connections(self.sock, self._serve)

    def stall(self) -> None:
        self.open.clear()

    def flow(self) -> None:
        self.open.set()

    def close(self) -> None:
        self.open.set()
        self.sock.close()

    def _serve(self, client: socket.socket) -> None:
        self.open.wait()
        server = socket.socket(socket.AF_UNIX)
        server.connect(self.target)
        threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
        self._pump(server, client, True)

    def _pump(self, src: socket.socket, dst: socket.socket, answers: bool) -> None:
        try:
            while data := src.recv(65536):
                if answers:
                    self.open.wait()
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):  # shutdown, not just close: the other pump is blocked in recv()
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()


def test_a_call_whose_start_the_database_confirmed_too_late_releases_its_conversation(
        fresh_database_url, upstream_url, upstream, key, cid, tmp_path):
    import shutil
    import tempfile

    parts = urlsplit(fresh_database_url)
    pgdir = parts.query.split("host=")[1]
    short = tempfile.mkdtemp(prefix="bp-relay-", dir="/tmp")  # a socket path must stay short
    relay = StallingRelay(pgdir, short)
    relayed = fresh_database_url.replace(f"host={pgdir}", f"host={short}")
    settings = make_settings(relayed, upstream_url, database={"command_timeout": 1.0, "pool_min": 2})
    db = Db(fresh_database_url)
    try:
        with serve_proxy(settings) as p:
            client = p.openai(key, conversation=cid)
            say(client, None, user("before"))
            relay.stall()
            try:  # the start reaches the database, its confirmation does not: the client is answered 503
                with pytest.raises(openai.APIStatusError) as e:
                    say(client, None, user("during the stall"))
            finally:
                relay.flow()  # ... and then the database answers
            assert e.value.status_code == 503
            # the start did commit: a pending node holding the lease -- released once the database answers
            wait_for(lambda: db.fetchval("SELECT count(*) FROM nodes WHERE conversation_id = $1 AND "
                                         "sent->0->>'content' = 'during the stall'", cid) == 1, 10, "the late start")
            node = wait_for(lambda: (r := db.fetchrow("SELECT * FROM nodes WHERE conversation_id = $1 AND "
                                                      "sent->0->>'content' = 'during the stall'", cid))
                            and r["status"] == "failed" and r, 15, "the release")
            assert node["error"]["code"] == "interrupted"
            _, h = say(client, None, user("during the stall"))  # the retry: no 409, beside the released node
            assert h["x-parent-node-id"] == str(node["parent_id"])
    finally:
        relay.close()
        shutil.rmtree(short, ignore_errors=True)
    assert_invariants(fresh_database_url)


# -- 5. hostile input is a clean 4xx, never a 500 ------------------------------------------------

def test_non_ascii_header_values_are_forwarded_as_they_came(proxy, upstream, key, cid):
    headers = {"Authorization": f"Bearer {key}", "X-Title": "caf\xe9", "Content-Type": "application/json"}
    body = json.dumps({"model": MODEL, "messages": [user("hi")]}).encode()
    for path, extra in (("/v1/chat/completions", {"X-Conversation-Id": cid}), ("/v1/chat/completions", {})):
        status, answer = raw_request(proxy.url, "POST", path, {**headers, **extra}, body)
        assert status == 200, answer
        assert upstream.last.headers["x-title"] == "caf\xe9"
    assert raw_request(proxy.url, "GET", "/v1/models", headers)[0] == 200
    # a non-ASCII bearer key is just a key (passthrough): it is forwarded byte for byte
    status, _ = raw_request(proxy.url, "GET", "/v1/models", {"Authorization": "Bearer sk-caf\xe9-0123456789"})
    assert status == 200 and upstream.requests[-1].headers["authorization"] == "Bearer sk-caf\xe9-0123456789"


def _compressed(coding: str, data: bytes) -> bytes:
    import gzip
    import zlib

    import zstandard

    if coding == "gzip-members":  # (RFC 1952: members one after another, as `cat a.gz b.gz` or pigz make)
        return b"".join(gzip.compress(data[i:i + 7]) for i in range(0, len(data), 7))
    return {"gzip": gzip.compress, "deflate": zlib.compress, "zstd": zstandard.compress}[coding](data)


@pytest.mark.parametrize("coding", ["gzip", "gzip-members", "deflate", "zstd"])
def test_a_compressed_request_body_is_read_by_the_stored_routes_and_passed_through_decoded(proxy, upstream, key,
                                                                                           cid, coding):
    """A client or gateway that compresses its request (``Content-Encoding: gzip``): a stored call
    was refused 400 "the request body is not valid JSON". Now chat, Responses, Messages and
    Conversations read it decoded (the upstream gets the proxy's own JSON, uncompressed); a call
    they pass through goes decoded too -- the model it names routes it (read from the compressed
    bytes, it was nobody's: the default upstream got it). A gzip body of several members is read
    to its end (it was read to the first member's: "not valid JSON")."""
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json",
               "Content-Encoding": coding.removesuffix("-members")}

    def post(path: str, body: dict, **extra: str) -> httpx.Response:
        return httpx.post(proxy.url + path, content=_compressed(coding, json.dumps(body).encode()),
                          headers={**headers, **extra}, timeout=10)

    r = post("/v1/chat/completions", {"model": MODEL, "messages": [user("compressed")]}, **{"X-Conversation-Id": cid})
    assert r.status_code == 200, r.text
    assert upstream.last.messages == [user("compressed")] and "content-encoding" not in upstream.last.headers
    r = post("/v1/responses", {"model": MODEL, "input": "compressed too"}, **{"X-Conversation-Id": cid})
    assert r.status_code == 200, r.text
    assert [m["content"] for m in upstream.last.messages][::2] == ["compressed", "compressed too"]
    r = post("/v1/messages", {"model": MODEL, "max_tokens": 50, "messages": [user("and again")]},
             **{"X-Conversation-Id": cid})
    assert r.status_code == 200, r.text
    assert "and again" in json.dumps(upstream.last.body["messages"][-1])
    r = post("/v1/conversations", {"metadata": {"topic": "compressed"}})
    assert r.status_code == 200 and r.json()["metadata"] == {"topic": "compressed"}, r.text
    plain = json.dumps({"model": MODEL, "messages": [user("passed through")]}).encode()
    r = httpx.post(proxy.url + "/v1/chat/completions", content=_compressed(coding, plain), headers=headers, timeout=10)
    assert r.status_code == 200, r.text
    assert upstream.last.raw == plain and "content-encoding" not in upstream.last.headers


def test_a_compressed_call_to_another_route_goes_to_its_models_upstream(mproxy, upstream, claude, key):
    """Any pass-through route (embeddings here): a compressed body is read for the model it names
    and goes to that model's upstream, decoded -- the model was read from the compressed bytes
    (none), and the default upstream got the call, with its credentials."""
    body = json.dumps({"model": "claude-x", "input": "embed me"}).encode()
    sent = len(upstream.requests)
    httpx.post(mproxy.url + "/v1/embeddings", content=_compressed("gzip", body), timeout=10,
               headers={"authorization": f"Bearer {key}", "content-type": "application/json", "content-encoding": "gzip"})
    assert len(upstream.requests) == sent
    assert claude.requests[-1].path.startswith("/v1/embeddings") and claude.requests[-1].raw == body


def test_a_compressed_call_passed_through_goes_to_its_models_upstream(mproxy, upstream, claude, key):
    """Naming no conversation, a compressed Messages call for a Claude model goes to the Anthropic
    upstream, and a chat call for it is translated there -- the model read from the decoded body
    (from the compressed bytes none was read, and the chat upstream got them)."""
    from .anthropic_fake import AReply

    headers = {"x-api-key": key, "content-type": "application/json", "content-encoding": "gzip"}
    body = {"model": "claude-x", "max_tokens": 20, "messages": [user("compressed for Claude")]}
    claude.enqueue(AReply(content=[{"type": "text", "text": "hi"}]))
    sent = len(upstream.requests)
    r = httpx.post(mproxy.url + "/v1/messages", content=_compressed("gzip", json.dumps(body).encode()),
                   headers=headers, timeout=10)
    assert r.status_code == 200, r.text
    assert claude.last.body["messages"] == [user("compressed for Claude")] and len(upstream.requests) == sent
    claude.enqueue(AReply(content=[{"type": "text", "text": "hi"}]))
    r = httpx.post(mproxy.url + "/v1/chat/completions", headers={**headers, "authorization": f"Bearer {key}"},
                   content=_compressed("gzip", json.dumps({**body, "messages": [user("chat for Claude")]}).encode()),
                   timeout=10)
    assert r.status_code == 200, r.text
    assert claude.last.body["messages"][-1]["content"] in ("chat for Claude", [{"type": "text", "text": "chat for Claude"}])


def test_a_compressed_request_body_is_bounded_once_inflated_and_an_unknown_coding_is_415(proxy, upstream, key, cid):
    """A body that inflates past ``max_body_bytes`` (a zip bomb: 33 MiB in a few dozen KB) is
    refused 413 as a body that large would be, and a coding the proxy cannot undo (br) 415 naming
    it -- each in the route's own error shape; nothing reaches the upstream."""
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json", "X-Conversation-Id": cid}
    bomb = _compressed("gzip", b" " * (33 << 20))
    assert len(bomb) < 100_000
    r = httpx.post(proxy.url + "/v1/chat/completions", content=bomb, timeout=30,
                   headers={**headers, "Content-Encoding": "gzip"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large", r.text
    body = json.dumps({"model": MODEL, "messages": [user("q")]}).encode()
    r = httpx.post(proxy.url + "/v1/responses", content=body, headers={**headers, "Content-Encoding": "br"}, timeout=10)
    assert r.status_code == 415, r.text
    assert r.json()["error"]["code"] == "unsupported_media_type" and "'br'" in r.json()["error"]["message"]
    r = httpx.post(proxy.url + "/v1/messages", content=body, headers={**headers, "Content-Encoding": "br"}, timeout=10)
    assert r.status_code == 415 and r.json()["type"] == "error" and "'br'" in r.json()["error"]["message"], r.text
    assert upstream.requests == []


def test_our_headers_may_not_disagree_and_dot_ids_are_refused(proxy, upstream, key):
    body = json.dumps({"model": MODEL, "messages": [user("hi")]}).encode()
    conn = http.client.HTTPConnection("127.0.0.1", int(urlsplit(proxy.url).port), timeout=10)
    conn.putrequest("POST", "/v1/chat/completions")
    for k, v in (("Authorization", f"Bearer {key}"), ("X-Conversation-Id", "a"), ("X-Conversation-Id", "b"),
                 ("Content-Type", "application/json"), ("Content-Length", str(len(body)))):
        conn.putheader(k, v)
    conn.endheaders(body)
    r = conn.getresponse()
    assert r.status == 400 and json.loads(r.read())["error"]["code"] == "invalid_conversation_id"
    conn.close()
    for cid in (".", ".."):
        r = httpx.post(f"{proxy.url}/v1/chat/completions", headers={"Authorization": f"Bearer {key}", "X-Conversation-Id": cid},
                       json={"model": MODEL, "messages": [user("hi")]})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_conversation_id"
    assert upstream.requests == []


# -- 6. bounded answers -----------------------------------------------------------------------------

@pytest.fixture
def small_answers(fresh_database_url, upstream_url):
    yield from proxy_with(fresh_database_url, upstream_url, server={"max_response_bytes": 100_000})


def test_an_answer_above_max_response_bytes_is_cut(small_answers, upstream, key, cid):
    client = small_answers.openai(key, conversation=cid)
    upstream.enqueue(Reply(content="x" * 200_000))
    with pytest.raises(openai.APIStatusError) as e:
        client.chat.completions.create(model=MODEL, messages=[user("a huge answer")])
    assert e.value.status_code == 502 and e.value.body["code"] == "upstream_response_too_large"
    node = small_answers.db.node(e.value.response.headers["x-node-id"])
    assert node["outcome"] == "transient" and node["received"] is None
    # an error body is bounded the same way
    upstream.enqueue(Reply(kind="raw", status=500, body=b"e" * 200_000, content_type="text/plain"))
    with pytest.raises(openai.APIStatusError) as e:
        client.chat.completions.create(model=MODEL, messages=[user("a huge error")])
    assert e.value.status_code == 502 and e.value.body["code"] == "upstream_response_too_large"


def test_a_streamed_calls_error_body_above_max_response_bytes_is_502(small_answers, upstream, key, cid):
    """Asked for a stream, answered with an error body above the limit: 502
    ``upstream_response_too_large``, as for a call that asked for no stream -- not the status."""
    client = small_answers.openai(key, conversation=cid)
    upstream.enqueue(Reply(kind="raw", status=500, body=b"e" * 200_000, content_type="text/plain"))
    with pytest.raises(openai.APIStatusError) as e:
        client.chat.completions.create(model=MODEL, messages=[user("a huge error")], stream=True)
    assert e.value.status_code == 502 and e.value.body["code"] == "upstream_response_too_large"
    node = small_answers.db.node(e.value.response.headers["x-node-id"])
    assert node["outcome"] == "transient" and node["error"]["code"] == "upstream_response_too_large"


def test_an_answer_too_large_is_not_retried_by_the_sdks(small_answers, upstream, key, cid):
    """An SDK retries a 502 twice by itself -- each retry a new upstream call, billed, as large as
    likely: ``x-should-retry: false`` says not to, on a stored call (an answer too large, a streamed
    call's error body too large) and on one passed through (no conversation named)."""
    stored, passed = small_answers.openai(key, conversation=cid, max_retries=2), small_answers.openai(key, max_retries=2)
    huge, huge_error = Reply(content="x" * 200_000), Reply(kind="raw", status=500, body=b"e" * 200_000, content_type="text/plain")
    for client, reply, stream in ((stored, huge, False), (passed, huge, False), (stored, huge_error, True)):
        upstream.reset()
        upstream.enqueue(reply, reply, reply)
        with pytest.raises(openai.APIStatusError) as e:
            client.chat.completions.create(model=MODEL, messages=[user("a huge answer")], stream=stream)
        assert e.value.status_code == 502 and e.value.body["code"] == "upstream_response_too_large"
        assert e.value.response.headers["x-should-retry"] == "false"
        assert len(upstream.chat_requests) == 1, (client.base_url, stream)
    upstream.reset()
    # a failure that asking again may mend stays retryable: the SDK's retry gets the answer
    client = small_answers.openai(key, conversation=cid, max_retries=1)
    upstream.enqueue(Reply(kind="error", status=503), Reply(content="there"))
    assert client.chat.completions.create(model=MODEL, messages=[user("again")]).choices[0].message.content == "there"


def test_a_stream_above_max_response_bytes_ends_with_an_error_event(small_answers, upstream, key, cid):
    client = small_answers.openai(key, conversation=cid)
    upstream.enqueue(Reply(pieces=["y" * 1000] * 400))  # ~400 KB of events: an endless stream, for our limit
    seen, error = 0, None
    with client.chat.completions.with_streaming_response.create(model=MODEL, messages=[user("go on")], stream=True) as r:
        node = r.headers["x-node-id"]
        for line in r.iter_lines():
            if line.startswith("data: ") and "error" in line:
                error = json.loads(line[6:])["error"]
            elif line.startswith("data: {"):
                seen += 1
    assert error is not None and error["code"] == "upstream_response_too_large"
    assert 0 < seen < 400
    row = small_answers.db.node(node)
    assert row["outcome"] == "transient" and row["received"] is None


def test_the_sse_parser_never_rescans_what_it_has_seen():
    """Fed an event that never ends, the parser resumes its search where it stopped (linear; the
    old one joined and rescanned the whole buffer on every chunk: 16 MB took 3.5 s)."""
    from proxy.sse import SSEParser

    parser = SSEParser()
    piece = b"data: " + b"z" * 100
    for i in range(2000):
        assert parser.feed(piece) == []
        assert parser._scanned == len(parser._buf) == (i + 1) * len(piece)
    assert parser.feed(b"\r") == []  # a CR at a chunk's end waits for its LF
    assert parser.feed(b"\n\r\ndata: next") == [piece * 2000]
    assert parser.pending == b"data: next"


# -- 8. slow clients ---------------------------------------------------------------------------

def test_a_body_that_does_not_arrive_in_time_is_answered_408(fresh_database_url, upstream_url, key):
    settings = make_settings(fresh_database_url, upstream_url, server={"client_body_timeout": 1.0})
    with serve_proxy(settings) as p:
        port = int(urlsplit(p.url).port)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + key.encode()
                      + b"\r\nX-Conversation-Id: slow\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"mo")
            t0 = time.monotonic()
            answer = b""
            while b"request_timeout" not in answer and (chunk := s.recv(65536)):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 408") and b"request_timeout" in answer
        assert time.monotonic() - t0 < 5


def test_slow_headers_and_idle_connections_are_closed(fresh_database_url, upstream_url, tmp_path):
    proc, url = spawn_proxy(fresh_database_url, upstream_url, tmp_path, "[server]\nclient_header_timeout = 1.0\n")
    try:
        port = int(urlsplit(url).port)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as idle, \
                socket.create_connection(("127.0.0.1", port), timeout=10) as slow:
            slow.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # never finished
            t0 = time.monotonic()
            assert idle.recv(100) == b"" and slow.recv(100) == b""  # closed by the server
            assert time.monotonic() - t0 < 5
        # a request that arrives in time is served, and its keep-alive connection too
        with httpx.Client(base_url=url) as c:
            assert c.get("/healthz").status_code == 200
            time.sleep(0.5)
            assert c.get("/healthz").status_code == 200
    finally:
        proc.terminate()
        proc.wait(20)


def _stalled(port: int, path: str, key: str, body: dict) -> tuple[socket.socket, bytes]:
    """A POST whose answer is then never read: a receive buffer of 4 KB, the response head read,
    nothing more. Returns the socket and the head."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(30)
    s.connect(("127.0.0.1", port))
    raw = json.dumps(body).encode()
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(raw)}\r\n\r\n".encode() + raw)
    head = b""
    while b"\r\n\r\n" not in head:
        head += s.recv(2048)
    assert head.startswith(b"HTTP/1.1 200"), head[:300]
    return s, head


def _read_to_the_end(s: socket.socket) -> bytes:
    """What is left of an answer, up to the server's closing of the connection."""
    rest = b""
    while chunk := s.recv(1 << 20):
        rest += chunk
    return rest


def _big_stream() -> Reply:
    return Reply(kind="stream", content="x" * 16_000_000, pieces=["x" * 4000] * 4000)  # 16 MB of events


def test_a_client_that_stops_reading_its_stream_leaves_after_client_send_timeout(fresh_database_url, upstream_url,
                                                                                  upstream, key, cid):
    """A client that reads the head of a large stream and then nothing more, its socket kept open:
    the server's send waits for room for good, and the relay with it -- the conversation stayed
    locked (every next turn 409, the lease renewed all along) and the upstream connection busy for
    as long as the socket stayed open. After ``client_send_timeout`` it is a client that went away:
    its node fails as client_disconnected, the conversation is free, and its connection ends
    unfinished (never the stream's end)."""
    settings = make_settings(fresh_database_url, upstream_url, server={"client_send_timeout": 1.0})
    with serve_proxy(settings) as proxy:
        db = Db(fresh_database_url)
        upstream.enqueue(_big_stream())
        s, head = _stalled(int(urlsplit(proxy.url).port), f"/c/{cid}/v1/chat/completions", key,
                           {"model": MODEL, "stream": True, "messages": [user("big")]})
        with s:
            node = next(line.split(b":", 1)[1].strip().decode() for line in head.split(b"\r\n")
                        if line.lower().startswith(b"x-node-id:"))
            http = proxy.http(key)
            wait_for(lambda: http.get(f"/admin/conversations/{cid}").json()["busy"] is False, timeout=60,
                     what="the conversation freed")
            row = db.node(node)
            assert row["status"] == "failed" and row["outcome"] == "transient", row
            assert row["error"]["code"] == "client_disconnected" and "client_send_timeout" in row["error"]["message"]
            r = httpx.post(f"{proxy.url}/c/{cid}/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                           json={"model": MODEL, "messages": [user("next")]}, timeout=30)
            assert r.status_code == 200, r.text[:300]
            # on the failed node, as after any disconnect: its question stays in context, no answer
            assert [m["content"] for m in upstream.last.messages] == ["big", "next"]
            rest = _read_to_the_end(s)  # (what was buffered, then the server's close)
            assert len(rest) < 8_000_000 and not rest.endswith(b"0\r\n\r\n")


def test_a_pass_through_client_that_stops_reading_frees_its_upstream_connection(fresh_database_url, upstream_url,
                                                                                 upstream, key):
    """The same for a pass-through answer: a client that stops reading held the upstream
    connection it streamed from -- with one connection to the upstream, every other call waited
    for it and failed 504. After ``client_send_timeout`` the answer is ended unfinished and the
    connection freed."""
    settings = make_settings(fresh_database_url, upstream_url, server={"client_send_timeout": 1.0},
                             upstream_defaults={"max_connections": 1, "pool_timeout": 2.0})
    with serve_proxy(settings) as proxy:
        upstream.enqueue(_big_stream())
        s, _ = _stalled(int(urlsplit(proxy.url).port), "/v1/chat/completions", key,
                        {"model": MODEL, "stream": True, "messages": [user("big")]})
        with s:
            def served() -> bool:
                r = httpx.post(f"{proxy.url}/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                               json={"model": MODEL, "messages": [user("after")]}, timeout=30)
                return r.status_code == 200 and "echo: after" in r.text

            wait_for(served, timeout=60, what="a call through the upstream's one connection")
            rest = _read_to_the_end(s)
            assert len(rest) < 8_000_000 and not rest.endswith(b"0\r\n\r\n")


# -- 9, 10. headers: ours are the only ones; credentials never travel back -------------------------

def test_upstream_headers_never_replace_or_duplicate_ours(proxy, upstream, key, cid):
    evil = [("X-Node-Id", "evil"), ("X-Conversation-Id", "evil"), ("X-Parent-Node-Id", "evil"),
            ("X-Branchpoint-Request-Id", "evil"), ("X-Context-Mode", "evil")]
    for stream in (False, True):
        upstream.enqueue(Reply(headers=evil))
        r = httpx.post(f"{proxy.url}/v1/chat/completions", timeout=10,
                       headers={"Authorization": f"Bearer {key}", "X-Conversation-Id": cid},
                       json={"model": MODEL, "messages": [user("hi")], "stream": stream})
        for name, _ in evil:
            values = r.headers.get_list(name)
            assert len(values) == 1 and values[0] != "evil", (name, values)
    upstream.enqueue(Reply(headers=evil))
    r = httpx.post(f"{proxy.url}/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                   json={"model": MODEL, "messages": [user("pass-through")]})
    assert r.headers.get("x-node-id") is None and len(r.headers.get_list("x-branchpoint-request-id")) == 1


@pytest.mark.parametrize("value", ["caf\u00e9", "\u6a21\u578b", "\U0001f600"])
def test_an_upstream_header_in_utf8_reaches_the_client_byte_for_byte(proxy, upstream, key, cid, value):
    """An upstream header holding UTF-8 (a model's name in CJK, an emoji) is relayed as the bytes
    it came in, stored or pass-through, stream or not: its value made the answer's headers fail to
    encode -- a 500 without X-Node-Id, after a non-streamed answer was already stored and the head
    moved onto it (the SDK's retries piled up the question under answers never received) -- and
    'caf\u00e9' went out re-encoded as Latin-1."""
    for conversation in (cid, None):
        for stream in (False, True):
            upstream.enqueue(Reply(content="fine", headers=[("x-upstream-note", value)],
                                   kind="stream" if stream else "json"))
            headers = {"Authorization": f"Bearer {key}", **({"X-Conversation-Id": conversation} if conversation else {})}
            r = httpx.post(f"{proxy.url}/v1/chat/completions", headers=headers, timeout=10,
                           json={"model": MODEL, "messages": [user(f"q {stream}")], "stream": stream})
            assert r.status_code == 200 and "fi" in r.text, (conversation, stream, r.status_code, r.text[:300])
            assert (b"x-upstream-note", value.encode()) in r.headers.raw, r.headers.raw
            assert (r.headers.get("x-node-id") is not None) == (conversation is not None)
    upstream.enqueue(Reply(content="last"))
    httpx.post(f"{proxy.url}/v1/chat/completions", headers={"Authorization": f"Bearer {key}", "X-Conversation-Id": cid},
               json={"model": MODEL, "messages": [user("next")]}, timeout=10)
    assert [m["content"] for m in upstream.last.messages] == ["q False", "fine", "q True", "fine", "next"]


def test_an_answer_whose_response_cannot_be_made_is_not_the_next_calls_context(proxy, upstream, key, cid, db, monkeypatch):
    """The client's response to a whole answer is made before the answer is stored: when making it
    fails, the client's 500 comes with the node stored invalid and the head where it was. Made
    after, the node was a success and the head on it -- the next call's upstream got an answer the
    client never saw (and an SDK retrying the 500 piled its question up under such answers)."""
    from proxy import answers

    made = answers.RawResponse

    def unmakeable(status, body, *args, **kw):
        if status == 200:
            raise ValueError("a response that cannot be made")
        return made(status, body, *args, **kw)

    monkeypatch.setattr(answers, "RawResponse", unmakeable)
    upstream.enqueue(Reply(content="unseen answer"))
    headers = {"Authorization": f"Bearer {key}", "X-Conversation-Id": cid}
    r = httpx.post(f"{proxy.url}/v1/chat/completions", headers=headers, timeout=10,
                   json={"model": MODEL, "messages": [user("first question")]})
    assert r.status_code == 500
    assert db.head(cid) is None
    monkeypatch.undo()
    upstream.enqueue(Reply(content="seen"))
    r = httpx.post(f"{proxy.url}/v1/chat/completions", headers=headers, timeout=10,
                   json={"model": MODEL, "messages": [user("second question")]})
    assert r.status_code == 200
    assert [m["content"] for m in upstream.last.messages] == ["second question"]


def test_every_credential_a_client_sends_is_kept_from_the_upstream_and_masked(proxy, upstream, key, cid, db):
    secret = f"anthropic-style-secret-{uuid.uuid4().hex}"
    azure = f"azure-style-{uuid.uuid4().hex}"
    upstream.enqueue(Reply(kind="error", status=401, error={"message": f"bad keys {secret} and {azure}",
                                                            "type": "auth", "param": None, "code": None}))
    r = httpx.post(f"{proxy.url}/v1/chat/completions", json={"model": MODEL, "messages": [user("hi")]},
                   headers={"Authorization": f"Bearer {key}", "X-Conversation-Id": cid, "x-api-key": secret, "api-key": azure})
    assert r.status_code == 401
    assert "x-api-key" not in upstream.last.headers and "api-key" not in upstream.last.headers
    assert secret not in r.text and azure not in r.text and "[redacted]" in r.text
    assert secret not in json.dumps(db.node(r.headers["x-node-id"])["error"])
    # passed through (no conversation): the upstream's echo is masked all the same
    upstream.enqueue(Reply(kind="error", status=401, error={"message": f"echo {secret}", "type": "auth"}))
    r = httpx.post(f"{proxy.url}/v1/chat/completions", json={"model": MODEL, "messages": [user("hi")]},
                   headers={"Authorization": f"Bearer {key}", "x-api-key": secret})
    assert r.status_code == 401 and "echo [redacted]" in r.text and secret not in r.text


# -- 11. /metrics can be protected ------------------------------------------------------------------

def test_metrics_can_require_a_token(fresh_database_url, upstream_url):
    settings = make_settings(fresh_database_url, upstream_url, server={"metrics_token": "scrape-me-0123"})
    with serve_proxy(settings) as p:
        assert httpx.get(f"{p.url}/metrics").status_code == 401
        assert httpx.get(f"{p.url}/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
        ok = httpx.get(f"{p.url}/metrics", headers={"Authorization": "Bearer scrape-me-0123"})
        assert ok.status_code == 200 and "branchpoint_requests_total" in ok.text
