"""Test doubles that run for real on 127.0.0.1: a scriptable fake OpenAI upstream that records what
it received, and a helper that serves any ASGI app under uvicorn in a background thread."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import uvicorn


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_connections(sock: socket.socket, handle: Callable[[socket.socket], None]) -> threading.Thread:
    """Accept connections on the listening ``sock`` until it is closed, each one handled by
    ``handle`` in a daemon thread of its own (the raw fakes: EvilUpstream, a stalling relay)."""
    def accept() -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    return thread


def read_request(conn: Any) -> tuple[bytes, bytes] | None:
    """One HTTP/1.1 request read off a raw socket: (head, body), or None when the peer closed
    first (the raw fake upstreams answer whatever came)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length")), 0)
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return head, body

class ServerThread:
    """uvicorn serving ``app`` in a thread with its own event loop."""

    def __init__(self, app: Any, port: int | None = None) -> None:
        # The listening socket is bound here and handed to uvicorn: a port found free and bound
        # later could be taken in between by anything else on the machine (a flaky start-up).
        self._sockets: list[socket.socket] | None = None
        if port is None:
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            self._sockets = [sock]
            port = sock.getsockname()[1]
        self.port = port
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_config=None, access_log=False,
                                lifespan="on", loop="asyncio", http="h11", timeout_graceful_shutdown=5)
        self.server = uvicorn.Server(config)
        self.loop: asyncio.AbstractEventLoop | None = None  # the server's, once it runs
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        async def serve() -> None:
            self.loop = asyncio.get_running_loop()
            await self.server.serve(sockets=self._sockets)

        asyncio.run(serve())

    def start(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("server thread died during start-up")
            if time.monotonic() > deadline:
                raise RuntimeError("server did not start in 30 s")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


# --- the fake upstream ------------------------------------------------------------------------


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: Any  # decoded JSON, or raw bytes when not JSON
    raw: bytes = b""  # the body as it came, byte for byte

    @property
    def messages(self) -> list[dict[str, Any]]:
        return self.body.get("messages", []) if isinstance(self.body, dict) else []

    @property
    def input(self) -> list[dict[str, Any]]:
        """A Responses request's input items."""
        return self.body.get("input", []) if isinstance(self.body, dict) else []

    def text(self) -> str:
        """Every message's content joined: handy for 'does X appear anywhere?' assertions."""
        return json.dumps(self.messages)


@dataclass
class Reply:
    """One scripted answer. ``kind``: json | error | stream | raw | hang | cut."""

    kind: str = "json"
    content: str | None = "ok"
    tool_calls: list[dict[str, Any]] | None = None
    reasoning: str | None = None
    usage: dict[str, Any] | None = None
    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    error: dict[str, Any] | None = None
    finish_reason: str | None = None
    delay: float = 0.0  # before answering
    no_usage: bool = False  # answer without usage, as several OpenAI-compatible servers do
    chunk_delay: float = 0.0  # between stream events
    pieces: list[str] | None = None  # stream: content split like this
    done: bool = True  # stream: send [DONE]
    cut_after: int | None = None  # stream: drop the connection after this many events
    error_event: dict[str, Any] | None = None  # stream: send this error event after the pieces
    extra_message: dict[str, Any] = field(default_factory=dict)
    gate: threading.Event | None = None  # stream: wait for this before the events from gate_after on (raw: before rest)
    gate_after: int = 2
    rest: bytes = b""  # raw: sent after ``body``, once the gate opened
    hold: threading.Event | None = None  # wait for this before answering at all
    headers: list[tuple[str, str]] = field(default_factory=list)  # extra response headers


async def asgi_body(scope: Any, receive: Any, send: Any) -> bytes | None:
    """For the fake upstreams (ASGI apps): the request's whole body -- or None, after answering a
    lifespan scope."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            await send({"type": message["type"] + ".complete"})
            if message["type"] == "lifespan.shutdown":
                return None
    raw = b""
    while True:
        message = await receive()
        raw += message.get("body", b"")
        if not message.get("more_body"):
            return raw


def completion(reply: Reply, model: str, prompt_tokens: int) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.content, "refusal": None, "annotations": []}
    if reply.tool_calls:
        message["tool_calls"] = reply.tool_calls
    if reply.reasoning:
        message["reasoning_content"] = reply.reasoning
    message.update(reply.extra_message)
    usage = reply.usage or {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": max(1, len(reply.content or "") // 4),
        "total_tokens": prompt_tokens + max(1, len(reply.content or "") // 4),
    }
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": None,
                     "finish_reason": reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")}],
        **({} if reply.no_usage else {"usage": usage}),
    }


def _estimate_prompt(body: dict[str, Any]) -> int:
    return max(1, len(json.dumps(body.get("messages", []))) // 4)


class FakeUpstream:
    """An ASGI app speaking enough of the OpenAI API. Script answers with ``enqueue``; read what
    it received in ``requests``. With nothing queued it echoes the last message."""

    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self.queue: deque[Reply] = deque()
        self.summaries: deque[Reply] = deque()  # answers to Branchpoint's summariser requests
        self.lock = threading.Lock()
        # how the prompt tokens an answer reports are counted (None: about 4 characters of JSON each)
        self.count_prompt: Callable[[list[dict[str, Any]]], int] | None = None

    def reset(self) -> None:
        with self.lock:
            self.requests.clear()
            self.queue.clear()
            self.summaries.clear()
            self.count_prompt = None

    def _prompt(self, body: dict[str, Any]) -> int:
        return self.count_prompt(body.get("messages", [])) if self.count_prompt else _estimate_prompt(body)

    def enqueue_summary(self, *replies: Reply) -> None:
        with self.lock:
            self.summaries.extend(replies)

    @staticmethod
    def is_summariser(r: Recorded) -> bool:
        """Branchpoint's own summariser requests (compaction), told apart by their prompts."""
        msgs = r.messages
        if not msgs:
            return False
        first = str(msgs[0].get("content", ""))
        return (msgs[0].get("role") == "system" and first.startswith("You compress")) or \
            (len(msgs) == 1 and first.startswith("This summary is about"))

    @property
    def summariser_requests(self) -> list[Recorded]:
        return [r for r in self.chat_requests if self.is_summariser(r)]

    @property
    def turn_requests(self) -> list[Recorded]:
        return [r for r in self.chat_requests if not self.is_summariser(r)]

    def enqueue(self, *replies: Reply) -> None:
        with self.lock:
            self.queue.extend(replies)

    @property
    def chat_requests(self) -> list[Recorded]:
        return [r for r in self.requests if r.path.endswith("/chat/completions")]

    @property
    def responses_requests(self) -> list[Recorded]:
        return [r for r in self.requests if r.path.endswith("/responses") and r.method == "POST"]

    @property
    def last(self) -> Recorded:
        """The last chat request that was not one of Branchpoint's summariser requests."""
        return self.turn_requests[-1]

    def wait_for(self, count: int, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.chat_requests) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"upstream got {len(self.chat_requests)} chat requests, expected {count}")
            time.sleep(0.01)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        raw = await asgi_body(scope, receive, send)
        if raw is None:
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = raw
        path = scope["path"]
        recorded = Recorded(scope["method"], path, headers, body, raw)
        summariser = self.is_summariser(recorded)
        with self.lock:
            self.requests.append(recorded)
            if summariser:
                reply = self.summaries.popleft() if self.summaries else Reply(
                    content="Facts so far: the user discussed sales figures; open task: none.")
            else:
                answering = path.endswith(("/chat/completions", "/responses"))
                reply = self.queue.popleft() if (self.queue and answering) else None

        if path.endswith("/models"):
            await self._json(send, 200, {"object": "list", "data": [{"id": "fake-model", "object": "model"}]})
            return
        if path.endswith("/embeddings"):
            await self._json(send, 200, {"object": "list", "data": [{"object": "embedding", "index": 0,
                                                                   "embedding": [0.1, 0.2]}], "model": "e"})
            return
        if path.endswith("/responses") and scope["method"] == "POST":
            await self._responses(send, reply, body if isinstance(body, dict) else {})
            return
        if not path.endswith("/chat/completions"):
            await self._json(send, 404, {"error": {"message": "no such route", "type": "invalid_request_error",
                                                   "param": None, "code": None}})
            return

        if reply is None:
            last = (body or {}).get("messages", [{}])[-1] if isinstance(body, dict) and body.get("messages") else {}
            text = last.get("content") if isinstance(last.get("content"), str) else ""
            reply = Reply(content=f"echo: {text}")
        if reply.hold is not None:
            await asyncio.to_thread(reply.hold.wait, 30)
        if reply.delay:
            await asyncio.sleep(reply.delay)
        model = body.get("model", "fake") if isinstance(body, dict) else "fake"
        if reply.kind == "hang":
            await asyncio.sleep(3600)
        extra = [(k.encode(), v.encode()) for k, v in reply.headers]
        if reply.kind == "raw" and reply.gate is not None:  # the body, then the rest once the gate opens
            await send({"type": "http.response.start", "status": reply.status,
                        "headers": [(b"content-type", reply.content_type.encode()), *extra]})
            await send({"type": "http.response.body", "body": reply.body, "more_body": True})
            await asyncio.to_thread(reply.gate.wait, 30)
            await send({"type": "http.response.body", "body": reply.rest})
        elif reply.kind == "raw":
            await self._raw(send, reply.status, reply.body, reply.content_type, extra)
        elif reply.kind == "error":
            await self._json(send, reply.status, {"error": reply.error or {
                "message": "fake failure", "type": "server_error", "param": None, "code": None}}, extra)
        elif reply.kind == "stream" or (reply.kind == "json" and isinstance(body, dict) and body.get("stream")):
            await self._stream(send, reply, body if isinstance(body, dict) else {}, model)
        else:
            await self._json(send, reply.status, completion(reply, model, self._prompt(body or {})), extra)

    async def _json(self, send: Any, status: int, data: Any, extra: list[tuple[bytes, bytes]] = ()) -> None:  # type: ignore[assignment]
        await self._raw(send, status, json.dumps(data).encode(), "application/json", extra)

    @staticmethod
    async def _raw(send: Any, status: int, body: bytes, content_type: str, extra: Any = ()) -> None:
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", content_type.encode()), (b"x-request-id", b"req_fake"), *extra]})
        await send({"type": "http.response.body", "body": body})

    async def _stream(self, send: Any, reply: Reply, body: dict[str, Any], model: str) -> None:
        extra = [(k.encode(), v.encode()) for k, v in reply.headers]
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream"), (b"x-request-id", b"req_fake"), *extra]})
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": int(time.time()), "model": model}

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            c = dict(base, choices=[{"index": 0, "delta": delta, "finish_reason": finish}])
            if include_usage:
                c["usage"] = None
            return c

        events: list[Any] = [chunk({"role": "assistant", "content": ""})]
        if reply.reasoning:
            half = len(reply.reasoning) // 2
            events += [chunk({"reasoning_content": reply.reasoning[:half]}), chunk({"reasoning_content": reply.reasoning[half:]})]
        pieces = reply.pieces if reply.pieces is not None else ([reply.content[i:i + 3] for i in range(0, len(reply.content), 3)] if reply.content else [])
        events += [chunk({"content": p}) for p in pieces]
        for i, tc in enumerate(reply.tool_calls or []):
            args = tc["function"]["arguments"]
            first = {"index": i, "id": tc.get("id"), "type": "function", "function": {"name": tc["function"]["name"], "arguments": ""},
                     **{k: v for k, v in tc.items() if k not in ("id", "type", "function")}}  # (Gemini's extra_content)
            if "id" not in tc:  # (some servers send no id at all)
                del first["id"]
            events.append(chunk({"tool_calls": [first]}))
            for j in range(0, len(args), 5):
                events.append(chunk({"tool_calls": [{"index": i, "function": {"arguments": args[j:j + 5]}}]}))
        if reply.error_event:
            events.append({"error": reply.error_event})
        else:
            events.append(chunk({}, reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")))
            if include_usage and not reply.no_usage:
                prompt = self._prompt(body)
                events.append(dict(base, choices=[], usage=reply.usage or {
                    "prompt_tokens": prompt, "completion_tokens": 7, "total_tokens": prompt + 7}))
        for n, event in enumerate(events):
            if reply.gate is not None and n == reply.gate_after:
                await asyncio.to_thread(reply.gate.wait, 30)
            if reply.cut_after is not None and n >= reply.cut_after:
                raise ConnectionResetError("fake upstream cut the stream")
            await send({"type": "http.response.body", "body": b"data: " + json.dumps(event).encode() + b"\n\n",
                        "more_body": True})
            if reply.chunk_delay:
                await asyncio.sleep(reply.chunk_delay)
        if reply.done and not reply.error_event:
            await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b""})


def response_output(reply: Reply) -> list[dict[str, Any]]:
    """A Responses upstream's output items for a scripted reply (``extra_message['reasoning_item']``
    adds a reasoning item first)."""
    output: list[dict[str, Any]] = []
    if reply.extra_message.get("reasoning_item"):
        output.append(reply.extra_message["reasoning_item"])
    if reply.content is not None:
        output.append({"id": "msg_upstream_1", "type": "message", "role": "assistant", "status": "completed",
                       "content": [{"type": "output_text", "text": reply.content, "annotations": []}]})
    for i, tc in enumerate(reply.tool_calls or []):
        output.append({"id": f"fc_upstream_{i}", "type": "function_call", "status": "completed", "call_id": tc["id"],
                       "name": tc["function"]["name"], "arguments": tc["function"]["arguments"]})
    return output


async def _responses_answer(self: FakeUpstream, send: Any, reply: Reply | None, body: dict[str, Any]) -> None:
    """Answer a Responses request natively (JSON, or the event stream when asked)."""
    if reply is None:
        last = body.get("input", [{}])[-1] if isinstance(body.get("input"), list) and body["input"] else {}
        text = last.get("content") if isinstance(last.get("content"), str) else json.dumps(last.get("content"))
        reply = Reply(content=f"echo: {text}")
    if reply.kind == "error":
        await self._json(send, reply.status, {"error": reply.error or {"message": "fake failure", "type": "server_error",
                                                                       "param": None, "code": None}})
        return
    if reply.kind == "raw":
        await self._raw(send, reply.status, reply.body, reply.content_type)
        return
    output = response_output(reply)
    response = {"id": "resp_upstream_fake", "object": "response", "created_at": int(time.time()), "status": "completed",
                "model": body.get("model"), "output": output, "error": None, "incomplete_details": None,
                "usage": reply.usage or {"input_tokens": 11, "output_tokens": 7, "total_tokens": 18},
                "previous_response_id": body.get("previous_response_id"), "store": body.get("store", True),
                "parallel_tool_calls": True, "tool_choice": "auto", "tools": body.get("tools", [])}
    if not body.get("stream"):
        await self._json(send, 200, response)
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    seq = 0

    async def event(kind: str, **data: Any) -> None:
        nonlocal seq
        payload = json.dumps({"type": kind, "sequence_number": seq, **data})
        seq += 1
        await send({"type": "http.response.body", "body": f"event: {kind}\ndata: {payload}\n\n".encode(), "more_body": True})

    await event("response.created", response={**response, "status": "in_progress", "output": []})
    await event("response.in_progress", response={**response, "status": "in_progress", "output": []})  # (as OpenAI)
    for index, item in enumerate(output):
        await event("response.output_item.added", output_index=index, item=item)
        if item["type"] == "message":
            text = item["content"][0]["text"]
            await event("response.output_text.delta", item_id=item["id"], output_index=index, content_index=0, delta=text)
        await event("response.output_item.done", output_index=index, item=item)
    if reply.error_event:
        await event("response.failed", response={**response, "status": "failed", "error": reply.error_event})
    else:
        await event("response.completed", response=response)
    await send({"type": "http.response.body", "body": b""})


FakeUpstream._responses = _responses_answer  # type: ignore[attr-defined]


class EvilUpstream:
    """A raw TCP 'upstream' that misbehaves at the protocol level, one way per ``mode``:
    close (no answer), reset (RST), partial_headers, short_body, garbage, stream_reset (RST after
    two SSE events), hang (reads the request, never answers), stream_stall (two SSE events,
    then silence)."""

    def __init__(self) -> None:
        import socket as _socket

        self.mode = "close"
        self.sock = _socket.socket()
        self.sock.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.thread = serve_connections(self.sock, self._handle)

    def _handle(self, conn: Any) -> None:
        import socket as _socket
        import struct

        def reset() -> None:
            conn.setsockopt(_socket.SOL_SOCKET, _socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()

        try:
            if read_request(conn) is None:
                return
            mode = self.mode
            if mode == "close":
                conn.close()
            elif mode == "reset":
                reset()
            elif mode == "partial_headers":
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/js")
                conn.close()
            elif mode == "short_body":
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n{\"id\": \"x\"")
                conn.close()
            elif mode == "garbage":
                conn.sendall(b"\x00\x01NOT HTTP AT ALL\r\n\r\n")
                conn.close()
            elif mode == "hang":
                time.sleep(5)
                conn.close()
            elif mode in ("stream_reset", "stream_stall"):
                event = json.dumps({"id": "c", "object": "chat.completion.chunk", "model": "m",
                                    "choices": [{"index": 0, "delta": {"content": "partial"}, "finish_reason": None}]})
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
                for _ in range(2):
                    payload = f"data: {event}\n\n".encode()
                    conn.sendall(b"%x\r\n%s\r\n" % (len(payload), payload))
                time.sleep(5 if mode == "stream_stall" else 0.05)
                reset()
        except OSError:
            pass

    def close(self) -> None:
        self.sock.close()
