"""Hostile upstream answers that cost more to read than they weigh on the wire: compression bombs
(a few KB inflating to 100 MB) and response heads without end (one 200 MB header, two million
headers). Through the real HTTP API, for every transport, streamed and not, stored calls and the
pass-through: refused with 502 (a stream begun: its final error event), the node failed as
transient -- and the proxy's memory (this process's peak RSS: the proxy runs in it) grows by far
less than the inflated size, and the transport stops reading a head once past its cap."""

from __future__ import annotations

import gzip
import json
import socket
import time
import uuid
import zlib
from typing import Any

import httpx
import pytest
import zstandard

from .conftest import Db, make_settings, serve_proxy
from .fakes import read_request, serve_connections
from .helpers import MODEL, user

TRANSPORTS = ["builtin", "httpx", "aiohttp"]
LIMIT = 1 << 20  # [server] max_response_bytes of these proxies
INFLATED = 100 << 20  # what each bomb inflates to
MIB = 1 << 20


def _squeeze(coding: str, total: int, piece: bytes = b" " * MIB) -> bytes:
    """``total`` bytes of ``piece`` compressed, without ever holding them."""
    if coding == "zstd":
        c: Any = zstandard.ZstdCompressor(level=3).compressobj()
    else:
        c = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16 if coding == "gzip" else zlib.MAX_WBITS)
    out = [c.compress(piece) for _ in range(total // len(piece))]
    out.append(c.flush())
    return b"".join(out)


def _encode(coding: str, data: bytes) -> bytes:
    if coding == "zstd":
        return zstandard.ZstdCompressor().compress(data)
    return gzip.compress(data) if coding == "gzip" else zlib.compress(data)


def _completion_json(content: str) -> bytes:
    return json.dumps({"id": "chatcmpl-b", "object": "chat.completion", "created": 1, "model": MODEL,
                       "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                                    "finish_reason": "stop"}],
                       "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}}).encode()


def _completion_sse(pieces: list[str]) -> bytes:
    base = {"id": "chatcmpl-b", "object": "chat.completion.chunk", "created": 1, "model": MODEL}
    events = [dict(base, choices=[{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])]
    events += [dict(base, choices=[{"index": 0, "delta": {"content": p}, "finish_reason": None}]) for p in pieces]
    events.append(dict(base, choices=[{"index": 0, "delta": {}, "finish_reason": "stop"}]))
    events.append(dict(base, choices=[], usage={"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}))
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"


class BombUpstream:
    """A raw 'upstream' on 127.0.0.1 answering every request with ``head`` and then ``body`` (or a
    head without end: ``endless_head`` -- bytes sent, repeated up to ``endless_total``, before the
    head is finished). ``sent`` counts what the last answer got onto the wire before the proxy
    closed the connection."""

    def __init__(self) -> None:
        self.head = b""
        self.body = b""
        self.endless_head = b""
        self.endless_total = 0
        self.sent = 0
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"
        self.thread = serve_connections(self.sock, self._handle)

    def answer(self, head: bytes, body: bytes = b"", *, endless_head: bytes = b"", endless_total: int = 0) -> None:
        self.head, self.body, self.endless_head, self.endless_total, self.sent = head, body, endless_head, endless_total, 0

    def _handle(self, conn: socket.socket) -> None:
        conn.settimeout(20)
        try:
            if read_request(conn) is None:
                return
            conn.sendall(self.head)
            self.sent = len(self.head)
            while self.sent < self.endless_total:
                conn.sendall(self.endless_head)
                self.sent += len(self.endless_head)
            if self.endless_head:
                conn.sendall(b"\r\ncontent-length: 2\r\n\r\n{}")
                return
            conn.sendall(self.body)
            self.sent += len(self.body)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self.sock.close()


def _head(coding: str | None, sse: bool, length: int, extra: bytes = b"") -> bytes:
    lines = [b"HTTP/1.1 200 OK", b"content-type: " + (b"text/event-stream" if sse else b"application/json"),
             b"content-length: %d" % length, b"connection: close"]
    if coding:
        lines.append(b"content-encoding: " + coding.encode())
    return b"\r\n".join(lines) + b"\r\n" + extra + b"\r\n"


@pytest.fixture(scope="module")
def bomb_upstream():
    server = BombUpstream()
    yield server
    server.close()


@pytest.fixture(scope="module", params=TRANSPORTS)
def bombed(request, database_url, bomb_upstream):
    settings = make_settings(database_url, bomb_upstream.url, server={"max_response_bytes": LIMIT},
                             upstream_defaults={"transport": request.param, "read_timeout": 10.0,
                                                "connect_timeout": 10.0})  # (the bombs keep the fake busy)
    with serve_proxy(settings) as p:
        yield p


@pytest.fixture(scope="module")
def bombs():
    return {coding: _squeeze(coding, INFLATED) for coding in ("gzip", "zstd", "deflate")}


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(field)


def _peak_growth(call: Any) -> tuple[Any, int]:
    """``call()`` and how far this process's peak RSS rose above its RSS before it (bytes)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS
    before = _status_kb("VmRSS")
    result = call()
    return result, (_status_kb("VmHWM") - before) * 1024


RSS_SEEN: list[str] = []


def _call(proxy: Any, *, stored: bool, stream: bool) -> tuple[httpx.Response, bytes]:
    key = f"sk-test-{uuid.uuid4().hex}"
    headers = {"Authorization": f"Bearer {key}"}
    if stored:
        headers["X-Conversation-Id"] = f"conv-{uuid.uuid4().hex[:12]}"
    with httpx.Client(base_url=proxy.url, timeout=30) as http, \
            http.stream("POST", "/v1/chat/completions", headers=headers,
                        json={"model": MODEL, "messages": [user("hi")], "stream": stream}) as r:
        return r, r.read()


def _failed_transient(proxy: Any, r: httpx.Response, code: str) -> None:
    node = Db(proxy.settings.database.url).node(r.headers["x-node-id"])
    assert node["status"] == "failed" and node["outcome"] == "transient", dict(node)
    assert node["error"]["code"] == code and node["received"] is None


def _last_event(body: bytes) -> dict[str, Any]:
    """The final event (a pass-through relays what came, so it may follow an unfinished line)."""
    last = body.rstrip()
    return json.loads(last[last.rindex(b"data: ") + 6:])


@pytest.mark.parametrize("coding", ["gzip", "zstd", "deflate"])
@pytest.mark.parametrize("stream", [False, True], ids=["answer", "stream"])
@pytest.mark.parametrize("stored", [True, False], ids=["stored", "passthrough"])
def test_a_compression_bomb_is_refused_at_the_decoded_limit(bombed, bomb_upstream, bombs, coding, stream, stored):
    bomb = bombs[coding]
    bomb_upstream.answer(_head(coding, stream, len(bomb)), bomb)
    (r, body), growth = _peak_growth(lambda: _call(bombed, stored=stored, stream=stream))
    transport = bombed.settings.upstream_defaults.transport
    RSS_SEEN.append(f"bomb {coding} {transport} {'stored' if stored else 'pass'} {'stream' if stream else 'answer'}: "
                    f"{len(bomb) // 1024} KB -> 100 MB, peak RSS +{growth / MIB:.1f} MiB")
    assert growth < 24 * MIB, RSS_SEEN[-1]  # the bomb inflates to 100 MiB; a call holds at most 1 MiB of it
    if stored and not stream:
        assert r.status_code == 502, body[:300]
        assert json.loads(body)["error"]["code"] == "upstream_response_too_large"
        _failed_transient(bombed, r, "upstream_response_too_large")
    elif stored:  # the stream's head went out first: it ends with its final error event
        assert r.status_code == 200 and _last_event(body)["error"]["code"] == "upstream_response_too_large"
        assert b"[DONE]" not in body
        _failed_transient(bombed, r, "upstream_response_too_large")
    elif stream:  # passed through as it came, cut at the limit: with a final error event
        assert r.status_code == 200 and len(body) <= LIMIT + 4096
        assert _last_event(body)["error"]["code"] == "upstream_response_too_large"
    else:  # any other body is read ahead before its status: never a short 200 (proxy/bytes_relay.py BytesRelay)
        assert r.status_code == 502, body[:300]
        assert json.loads(body)["error"]["code"] == "upstream_response_too_large"


@pytest.mark.parametrize("coding", ["gzip", "zstd", "deflate"])
@pytest.mark.parametrize("stream", [False, True], ids=["answer", "stream"])
def test_a_compressed_answer_below_the_limit_is_decoded_whole(bombed, bomb_upstream, coding, stream):
    """Inflating in bounded steps loses nothing: 600 KB from a few KB (several steps from one
    chunk), stored and relayed exactly."""
    if stream:
        # (not ending in "s": the client's key, sk-..., is masked across the pass-through stream's
        # deltas, and a delta ending in its first characters is held back -- the deltas re-cut)
        pieces = [f"{i:04d}" + "z" * 996 for i in range(600)]
        plain, expected = _completion_sse(pieces), "".join(pieces)
    else:
        expected = "z" * 600_000
        plain = _completion_json(expected)
    squeezed = _encode(coding, plain)
    bomb_upstream.answer(_head(coding, stream, len(squeezed)), squeezed)
    r, body = _call(bombed, stored=True, stream=stream)
    assert r.status_code == 200 and "content-encoding" not in r.headers
    node = Db(bombed.settings.database.url).node(r.headers["x-node-id"])
    assert node["status"] == "success" and node["received"][0]["content"] == expected
    if not stream:
        assert json.loads(body)["choices"][0]["message"]["content"] == expected
    bomb_upstream.answer(_head(coding, stream, len(squeezed)), squeezed)
    r, body = _call(bombed, stored=False, stream=stream)
    assert r.status_code == 200 and body == plain


HUGE_HEADER = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-huge: ", b"a" * 65536, 200 * MIB)
MANY_HEADERS = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n",
                b"".join(b"x-h%d: v\r\n" % (i % 1000) for i in range(10_000)), 2_000_000 * 9)


@pytest.mark.parametrize("shape", ["one 200 MB header", "two million headers"])
@pytest.mark.parametrize("stream", [False, True], ids=["answer", "stream"])
@pytest.mark.parametrize("stored", [True, False], ids=["stored", "passthrough"])
def test_an_endless_response_head_is_refused_unread(bombed, bomb_upstream, shape, stream, stored):
    head, repeated, total = HUGE_HEADER if shape.startswith("one") else MANY_HEADERS
    bomb_upstream.answer(head, endless_head=repeated, endless_total=total)
    t0 = time.monotonic()
    (r, body), growth = _peak_growth(lambda: _call(bombed, stored=stored, stream=stream))
    elapsed = time.monotonic() - t0
    transport = bombed.settings.upstream_defaults.transport
    RSS_SEEN.append(f"head {shape} {transport} {'stored' if stored else 'pass'} {'stream' if stream else 'answer'}: "
                    f"sent {bomb_upstream.sent / MIB:.1f} MiB, {elapsed:.2f} s, peak RSS +{growth / MIB:.1f} MiB")
    assert r.status_code == 502, body[:300]
    assert json.loads(body)["error"]["code"] == "upstream_headers_too_large"
    if stored:
        _failed_transient(bombed, r, "upstream_headers_too_large")
    time.sleep(0.2)  # (the fake's last send fails once the proxy has closed)
    assert bomb_upstream.sent < 32 * MIB, RSS_SEEN[-1]  # the transport stopped reading: the rest never left
    assert growth < 24 * MIB, RSS_SEEN[-1]
    assert elapsed < 10


@pytest.mark.parametrize("shape", ["101 headers", "70 KB of headers"])
def test_a_head_past_either_cap_is_refused(bombed, bomb_upstream, shape):
    """Just past the caps (defaults: 100 headers, 64 KiB), where every transport has read the
    whole head: refused the same way."""
    if shape == "101 headers":
        extra = b"".join(b"x-h%d: v\r\n" % i for i in range(98))  # + content-type, length, connection
    else:
        extra = b"".join(b"x-h%d: %s\r\n" % (i, b"v" * 2000) for i in range(35))
    bomb_upstream.answer(_head(None, False, 2, extra), b"{}")
    r, body = _call(bombed, stored=True, stream=False)
    assert r.status_code == 502 and json.loads(body)["error"]["code"] == "upstream_headers_too_large", body[:300]
    _failed_transient(bombed, r, "upstream_headers_too_large")


def test_a_head_within_the_caps_is_relayed(bombed, bomb_upstream):
    extra = b"".join(b"x-h%d: %s\r\n" % (i, b"v" * 500) for i in range(90))  # 93 headers, ~47 KB
    answer = _completion_json("fine")
    bomb_upstream.answer(_head(None, False, len(answer), extra), answer)
    for stored in (True, False):
        r, body = _call(bombed, stored=stored, stream=False)
        assert r.status_code == 200 and r.headers["x-h89"] == "v" * 500
        assert json.loads(body)["choices"][0]["message"]["content"] == "fine"


def test_the_decoders_step_by_step():
    """The decoders alone: raw deflate (as httpx reads it too), two codings undone last first,
    every piece at most one step, a bomb inside a second coding refused at the limit too."""
    from proxy.decoding import _STEP
    from proxy.decoding import decoder as _decoder
    from proxy.errors import UpstreamTooLarge

    def run(coding: str, body: bytes, limit: int = LIMIT, size: int = 997) -> bytes:
        d = _decoder(httpx.Headers({"content-encoding": coding}), limit)
        assert d is not None
        out: list[bytes] = []
        for i in range(0, len(body), size):
            out += d.decode(body[i:i + size])
        out += d.flush()
        assert all(len(p) <= _STEP for p in out)
        return b"".join(out)

    plain = b"".join(b"%06d " % i for i in range(100_000))  # 700 KB
    raw = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    assert run("deflate", raw.compress(plain) + raw.flush()) == plain
    assert run("gzip, zstd", _encode("zstd", _encode("gzip", plain))) == plain
    assert run("gzip", _encode("gzip", plain), size=1 << 20) == plain
    assert _decoder(httpx.Headers({"content-encoding": "br"}), LIMIT) is None  # unknown: left as it came
    with pytest.raises(UpstreamTooLarge):  # (each stage holds itself to the limit)
        run("gzip, zstd", _encode("zstd", _squeeze("gzip", 20 * MIB)))
    with pytest.raises(UpstreamTooLarge):
        run("gzip, gzip", _encode("gzip", _squeeze("gzip", 20 * MIB)))
    # a gzip body of several members (RFC 1952) is undone to its end, in pieces of any size, and
    # held to the limit across them
    parts = [b"%06d " % i * 1000 for i in range(5)] + [b"x", plain]
    members = b"".join(gzip.compress(p) for p in parts)
    for size in (1, 2, 17, 997, len(members)):
        assert run("gzip", members, size=size) == b"".join(parts)
    with pytest.raises(UpstreamTooLarge):
        run("gzip", gzip.compress(b" " * (MIB // 4)) * 8)  # (each member below it, the eight above)
    # many members: each counts against the limit however little it holds (300 empty ones are
    # past 1 MiB), and zlib is given a slice at a time -- at a member's end it copies what is left
    # of its input, so feeding it the rest of the body each time made a body of N members cost N
    # copies of it (4 MiB of empty members: 18 s on the event loop)
    with pytest.raises(UpstreamTooLarge):
        run("gzip", gzip.compress(b"") * 300, size=1 << 20)
    fed: list[int] = []
    decompressobj = zlib.decompressobj

    class Counted:
        def __init__(self, *args: Any) -> None:
            self.d = decompressobj(*args)

        def decompress(self, data: Any, size: int) -> bytes:
            fed.append(len(data))
            return self.d.decompress(data, size)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.d, name)

    last = b"".join(uuid.uuid4().bytes for _ in range(12_500))  # (200 KB that do not compress)
    members = gzip.compress(b"") * 250 + gzip.compress(last)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("proxy.decoding.zlib.decompressobj", Counted)
        assert run("gzip", members, limit=8 * MIB, size=len(members)) == last
    assert sum(fed) < 10 * len(members), (sum(fed), len(members))  # (it was ~250 times)
    # what follows the end of the data is ignored, and never piles up inside zlib
    d = _decoder(httpx.Headers({"content-encoding": "gzip"}), LIMIT)
    assert b"".join(d.decode(_encode("gzip", b"{}"))) == b"{}"
    for _ in range(100):
        assert list(d.decode(b"junk" * 10_000)) == []
    assert d.d.unused_data == b""
    with pytest.raises(httpx.DecodingError):
        run("zstd", b"not zstd at all")


def test_zz_report_rss(capsys):
    """(Prints what the tests above saw: run with -s.)"""
    with capsys.disabled():
        print("\n" + "\n".join(RSS_SEEN))

