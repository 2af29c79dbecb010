"""SSE parsing and stream reassembly, without a network."""

import json
import uuid

import pytest

from proxy.dialects.chat import StreamAccumulator
from proxy.dialects.responses.relayed import Native
from proxy.failures import classify
from proxy.sse import SSEParser


def test_parser_splits_events_across_chunk_boundaries_and_crlf():
    p = SSEParser()
    assert p.feed(b"data: {\"a\"") == []
    assert p.feed(b": 1}\n") == []
    assert p.feed(b"\ndata: [DO") == [b'data: {"a": 1}']
    assert p.feed(b"NE]\r\n\r\n: keep-alive\n\n") == [b"data: [DONE]", b": keep-alive"]
    assert SSEParser.data(b"data: [DONE]") == b"[DONE]"
    assert SSEParser.data(b"data:x") == b"x"
    assert SSEParser.data(b"event: error\ndata: {}\ndata: more") == b"{}\nmore"
    assert SSEParser.data(b": comment") is None


def chunk(delta, finish=None, usage=None, choices=True):
    c = {"id": "x", "model": "m", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}] if choices else []}
    if usage:
        c["usage"] = usage
    return c


def test_accumulator_merges_content_reasoning_and_tool_calls_by_index():
    acc = StreamAccumulator()
    for c in [
        chunk({"role": "assistant", "content": ""}),
        chunk({"reasoning_content": "let me "}),
        chunk({"reasoning_content": "think"}),
        chunk({"content": "Hel"}),
        chunk({"content": "lo"}),
        chunk({"tool_calls": [{"index": 1, "id": "b", "type": "function", "function": {"name": "second", "arguments": ""}}]}),
        chunk({"tool_calls": [{"index": 0, "id": "a", "type": "function", "function": {"name": "first", "arguments": "{\"q\""}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}),
        chunk({"tool_calls": [{"index": 1, "function": {"arguments": "{}"}}]}),
        chunk({}, finish="tool_calls"),
        chunk({}, usage={"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}, choices=False),
    ]:
        acc.feed(c)
    msg = acc.message()
    assert msg["content"] == "Hello"
    assert msg["reasoning_content"] == "let me think"
    assert msg["tool_calls"] == [
        {"id": "a", "type": "function", "function": {"name": "first", "arguments": "{\"q\": 1}"}},
        {"id": "b", "type": "function", "function": {"name": "second", "arguments": "{}"}},
    ]
    assert acc.finish_reason == "tool_calls"
    assert acc.usage == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}


def test_accumulator_takes_a_field_that_changes_shape_between_chunks():
    """An odd upstream's field that is a string in one chunk and a list in the next (or a
    function_call that is null, then a dict) is taken as the last shape said -- it raised in the
    middle of the stream (a list extended onto a string), failing an answer the client was reading."""
    acc = StreamAccumulator()
    for c in [chunk({"content": "Hi", "reasoning_details": "opaque"}),
              chunk({"reasoning_details": [{"type": "text", "text": "a"}]}),
              chunk({"reasoning_details": [{"type": "text", "text": "b"}]}),
              chunk({"function_call": None}),
              chunk({"function_call": {"name": "f", "arguments": "{}"}}),
              chunk({}, finish="stop")]:
        acc.feed(c)
    msg = acc.message()
    assert msg["reasoning_details"] == [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert msg["function_call"] == {"name": "f", "arguments": "{}"}


def test_accumulator_records_error_events():
    acc = StreamAccumulator()
    acc.feed({"error": {"message": "boom", "type": "server_error"}})
    assert acc.error == {"message": "boom", "type": "server_error"}


def body(error):
    return json.dumps({"error": error}).encode()


def test_classify_follows_the_failure_table():
    overflow = classify(400, body({"message": "This model's maximum context length is 8192 tokens", "type": "invalid_request_error",
                                   "code": "context_length_exceeded", "param": "messages"}))
    assert overflow.outcome == "overflow" and overflow.error.code == "context_overflow" and overflow.error.status == 400
    assert classify(400, body({"message": "prompt is too long: 210000 tokens > 200000 maximum"})).outcome == "overflow"
    assert classify(413, body({"message": "Request exceeds the maximum context window"})).outcome == "overflow"
    for status in (400, 401, 403, 404, 413, 422):
        assert classify(status, body({"message": "bad", "type": "invalid_request_error"})).outcome == "invalid"
    for status in (408, 429, 500, 502, 503, 504):
        assert classify(status, body({"message": "later", "type": "server_error"})).outcome == "transient"
    # a rate-limit message that mentions tokens is not an overflow
    assert classify(429, body({"message": "Request too large: tokens per min (TPM) limit"})).outcome == "transient"
    garbage = classify(500, b"<html>Bad gateway</html>")
    assert garbage.outcome == "transient"
    err = json.loads(garbage.body)["error"]
    assert set(err) == {"message", "type", "param", "code"} and "Bad gateway" in err["message"]


@pytest.mark.parametrize(("status", "raw"), [
    (400, {"error": {"code": 400, "message": "the request exceeds the available context size, try increasing it",
                     "type": "exceed_context_size_error"}}),  # llama.cpp's server
    (400, {"error": "This model's maximum prompt length is 131072 but the request contains 150000 tokens."}),  # xAI
    (422, {"error": "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096. Given: 4000 `inputs` "
                    "tokens and 500 `max_new_tokens`", "error_type": "validation"}),  # text-generation-inference
    (400, [{"error": {"code": 400, "status": "INVALID_ARGUMENT",
                      "message": "The input token count (1200000) exceeds the maximum number of tokens allowed "
                                 "(1048576)."}}]),  # Gemini's OpenAI-compatible endpoint
    (400, {"detail": "context length exceeded: 9000 > 8192"}),  # a FastAPI server
])
def test_other_providers_context_overflows_are_recognised(status, raw):
    failure = classify(status, json.dumps(raw).encode())
    assert failure.outcome == "overflow" and failure.error.code == "context_overflow", failure
    assert failure.error.status == status


@pytest.mark.parametrize("message", ["Input validation error: `temperature` must be strictly positive",
                                     "n exceeds the maximum of 8"])
def test_a_422_that_is_not_about_length_stays_invalid(message):
    assert classify(422, json.dumps({"error": message}).encode()).outcome == "invalid"


def test_parser_handles_crlf_split_across_chunks():
    p = SSEParser()
    assert p.feed(b"data: 1\r\n\r") == []
    assert p.feed(b"\ndata: 2\r\n\r\n") == [b"data: 1", b"data: 2"]


@pytest.mark.parametrize("in_progress", [True, False])
def test_a_compaction_item_is_announced_once_the_response_is_in_progress(in_progress):
    """Over a Responses upstream, the compaction item an answer begins with comes after
    response.in_progress -- or, from an upstream that never sends one, before its first other
    event -- numbered in the stream's one sequence."""
    item = {"type": "compaction", "id": "cmp_x", "summary": []}
    native = Native(node_id=uuid.uuid4(), client={}, compaction=[item])
    upstream = [("response.created", {"response": {"id": "up", "output": []}})]
    if in_progress:
        upstream.append(("response.in_progress", {"response": {"id": "up", "output": []}}))
    upstream.append(("response.output_item.added", {"output_index": 0, "item": {"type": "message", "id": "m"}}))
    out = b"".join(native.event(f"event: {k}\ndata: {json.dumps({'type': k, **d})}".encode()) for k, d in upstream)
    events = [json.loads(line[6:]) for line in out.decode().splitlines() if line.startswith("data: ")]
    kinds = [e["type"] for e in events]
    expected = ["response.created", *(["response.in_progress"] if in_progress else []),
                "response.output_item.added", "response.output_item.done", "response.output_item.added"]
    assert kinds == expected
    assert [e["output_index"] for e in events if "output_index" in e] == [0, 0, 1]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))


@pytest.mark.parametrize("end", ["response.completed", "response.failed"])
def test_a_compaction_item_is_announced_before_a_response_that_ends_at_once(end):
    """An upstream that goes from response.created straight to its end (or its failure): the
    compaction item is still announced, before it."""
    item = {"type": "compaction", "id": "cmp_x", "summary": []}
    native = Native(node_id=uuid.uuid4(), client={}, compaction=[item])
    events = [("response.created", {"response": {"id": "up", "output": []}}),
              (end, {"response": {"id": "up", "output": [], "status": end.split(".")[1],
                                  "error": {"code": "server_error", "message": "x"} if end == "response.failed" else None}})]
    out = b"".join(native.event(f"event: {k}\ndata: {json.dumps({'type': k, **d})}".encode()) for k, d in events)
    out += native.closing() if end == "response.completed" else b""
    kinds = [json.loads(line[6:])["type"] for line in out.decode().splitlines() if line.startswith("data: ")]
    assert kinds[:3] == ["response.created", "response.output_item.added", "response.output_item.done"]
    assert kinds[3:] == (["response.completed"] if end == "response.completed" else [])


def test_the_accumulator_leaves_out_what_is_not_text_where_text_goes():
    """Odd upstreams: content as a list of parts (Mistral's reasoning models stream their thinking
    so), numbers where text goes, a numeric finish reason, tool-call fields of other types. The
    message is what can be read of it -- nothing raises (which left the node pending before)."""
    acc = StreamAccumulator()
    for c in [
        chunk({"role": "assistant", "content": [{"type": "thinking", "thinking": [{"type": "text", "text": "hmm"}]}]}),
        chunk({"content": [{"type": "text", "text": "Hel"}, {"type": "image", "url": "x"}]}),
        chunk({"content": "lo", "refusal": 3, "reasoning_content": ["x"], "role": 5}),
        chunk({"content": 7}),
        chunk({"tool_calls": [{"index": "0", "id": 9, "function": {"name": ["f"], "arguments": 1}}, "junk"]}),
        chunk({"tool_calls": {"index": 0}}),
        chunk({}, finish=5),
        chunk({}, usage=[1, 2], choices=False),
    ]:
        acc.feed(c)
    msg = acc.message()
    assert (msg["content"], msg["reasoning_content"], msg["role"]) == ("Hello", "hmm", "assistant")
    assert "refusal" not in msg and acc.finish_reason is None and acc.usage is None
    assert msg["tool_calls"] == [{"id": None, "type": "function", "function": {"name": "", "arguments": ""}}]


class _Ending:
    """A translator whose stream went well but whose end -- or answer -- cannot be made."""

    def __init__(self, broken: str) -> None:
        self.broken, self.error, self.finished, self.usage, self.finish_reason = broken, None, False, None, None

    def opening(self) -> bytes:
        return b""

    def event(self, raw: bytes) -> bytes:
        self.finished = raw == b"data: [DONE]"
        return b"" if self.finished else raw + b"\n\n"

    def ended(self) -> bytes:
        return b""

    def complete(self) -> bool:
        return self.finished

    def closing(self) -> bytes:
        if self.broken == "closing":
            raise TypeError("an odd answer")
        return b"data: [DONE]\n\n"

    def failing(self, failure) -> bytes:
        return f"event: error\ndata: {failure.error.code}\n\n".encode()

    def received(self) -> list:
        return []


@pytest.mark.parametrize("broken", ["closing", "answer"])
def test_a_stream_whose_end_cannot_be_made_fails_its_node_and_says_so(broken):
    """The relay's last line of defence: whatever cannot be read at the end of a stream fails the
    node (stored, the lease released) and the client's stream ends with an error event -- before,
    the exception escaped: the client's connection broke, and the node stayed pending with its
    conversation locked until the process restarted."""
    import asyncio

    from proxy.background import Background
    from proxy.failures import Failure
    from proxy.relay import StreamRelay
    from storage import Outcome

    stored: list = []

    async def on_end(end):
        if broken == "answer" and end.failure is None:  # (as the lifecycle does when the answer cannot be read)
            failure = Failure.of(Outcome.TRANSIENT, "server_error", "relay_error", "TypeError", 500)
            stored.append(failure)
            return failure
        stored.append(end.failure)
        return None

    async def chunks():
        yield b"data: {\"a\": 1}\n\ndata: [DONE]\n\n"

    async def close():
        pass

    async def run() -> bytes:
        sent: list[dict] = []

        async def receive():
            await asyncio.sleep(3600)

        async def send(message):
            sent.append(message)

        relay = StreamRelay(chunks=chunks(), headers=[], on_end=on_end, close_upstream=close,
                            classify_error=lambda e: None, translator=_Ending(broken), background=Background())
        await relay(None, receive, send)
        return b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")

    body = asyncio.run(run())
    assert len(stored) == 1 and stored[0] is not None and stored[0].error.code == "relay_error"
    assert body.endswith(b"event: error\ndata: relay_error\n\n") and b"[DONE]" not in body


def test_a_cr_alone_ends_a_line_as_the_sse_standard_says():
    p = SSEParser()
    assert p.feed(b"data: {\"a\": 1}\r\rdata: [DO") == [b'data: {"a": 1}']
    assert p.feed(b"NE]\r") == []  # (a CR at the end of a chunk: a CRLF may be under way)
    assert p.feed(b"\r: keep-alive\r\n\r\n") == [b"data: [DONE]", b": keep-alive"]


def test_the_cr_a_stream_ends_with_ends_its_last_event():
    """A stream whose lines end with a CR alone ends with one: held back for a LF that might
    follow, it ends the last line once the stream has ended (``close``) -- else the stream's last
    event (an Anthropic or Responses stream's end event) was never read."""
    p = SSEParser()
    assert p.feed(b"data: 1\r\rdata: 2\r") == [b"data: 1"]
    assert p.feed(b"\r") == []
    assert p.close() == [b"data: 2"]
    assert p.close() == []
    q = SSEParser()
    assert q.feed(b"data: 1\r\n\r\ndata: cut\n") == [b"data: 1"]
    assert q.close() == []  # (an event without its blank line: not an event, as the standard says)


def test_a_plain_text_answer_that_says_the_context_is_too_long_is_an_overflow():
    failure = classify(400, b"prompt is too long: 300000 tokens > 200000 maximum")
    assert failure.outcome == "overflow" and failure.error.code == "context_overflow"
    assert classify(400, b"<html>Bad Request</html>").outcome == "invalid"


class _CountedPieces:
    """A text's pieces, as ``StreamAccumulator`` keeps them, counting every piece read -- by a
    join of them all or by a slice of the newest: the work a translator does per chunk."""

    def __init__(self) -> None:
        self.items: list[str] = []
        self.read = 0

    def append(self, piece: str) -> None:
        self.items.append(piece)

    def extend(self, pieces) -> None:
        self.items.extend(pieces)

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self):
        for piece in self.items:
            self.read += 1
            yield piece

    def __getitem__(self, at):
        got = self.items[at]
        self.read += len(got) if isinstance(at, slice) else 1
        return got


@pytest.mark.parametrize("translator", ["responses", "messages"])
@pytest.mark.parametrize("field", ["content", "reasoning_content", "reasoning"])
def test_a_translated_stream_reads_each_piece_a_bounded_number_of_times(translator, field):
    """A Responses or Anthropic client over a chat upstream: each chunk's deltas come from the
    pieces it added, not from the whole answer joined again per chunk -- which made a translated
    stream's CPU grow with the square of its deltas (20,000: 1.8 s of the proxy's CPU against
    0.09 s for chat to chat; found by a hostile pass). Counted, not timed: every piece read."""
    from proxy.dialects.messages.stream import FromChat as MessagesFromChat
    from proxy.dialects.responses.stream import FromChat as ResponsesFromChat

    node = uuid.uuid4()
    if translator == "responses":
        t = ResponsesFromChat(node_id=node, params={"model": "m"}, instructions=None)
    else:
        t = MessagesFromChat(node_id=node, params={"model": "m"})
    pieces = {name: _CountedPieces() for name in ("content", "reasoning_content", "reasoning", "refusal")}
    for name, counted in pieces.items():
        setattr(t.acc, name, counted)
    t.opening()
    n = 2000
    streamed = b"".join(t.event(b"data: " + json.dumps(chunk({field: f"p{i} "})).encode()) for i in range(n))
    streamed += t.event(b"data: " + json.dumps(chunk({}, finish="stop")).encode()) + t.event(b"data: [DONE]")
    assert sum(c.read for c in pieces.values()) <= 3 * n  # (whole joins per chunk: ~n * n / 2)
    assert streamed.count(b"p1999 ") == 1 and streamed.count(b"p0 ") == 1
    reassembled = "".join(piece for piece in pieces[field].items)
    assert reassembled == "".join(f"p{i} " for i in range(n))


@pytest.mark.parametrize("translator", ["responses", "messages"])
@pytest.mark.parametrize("deltas", [
    [{"reasoning_content": "ab", "reasoning": "ab"}, {"reasoning_content": "cd", "reasoning": "cd"}],  # copied into both
    [{"reasoning_content": "abc"}, {"reasoning": "xyz"}],  # reasoning_content, then reasoning
    [{"reasoning": "ab"}, {"reasoning": "cd"}],
    [{"reasoning_content": "ab"}, {"reasoning_content": "cd"}],
    [{"reasoning": "ab"}, {"reasoning_content": "a"}, {"reasoning_content": "bcd"}],  # reasoning_content lagging
])
def test_a_translated_streams_thinking_is_the_whole_answers(translator, deltas):
    """The reasoning a Responses or Anthropic client is streamed from a chat upstream is the one
    the whole answer -- and the stored node -- holds: reasoning_content, else reasoning. The
    Anthropic stream sent both, one after the other (``ababcdcd`` from an upstream that copies one
    field into the other, where the answer says ``abcd``; found by a review)."""
    from proxy.dialects.messages.stream import FromChat as MessagesFromChat
    from proxy.dialects.responses.stream import FromChat as ResponsesFromChat

    node = uuid.uuid4()
    t = (ResponsesFromChat(node_id=node, params={"model": "m"}, instructions=None) if translator == "responses"
         else MessagesFromChat(node_id=node, params={"model": "m"}))
    out = t.opening() + b"".join(t.event(b"data: " + json.dumps(chunk(d)).encode()) for d in deltas)
    out += t.event(b"data: " + json.dumps(chunk({"content": "done"}, finish="stop")).encode()) + t.event(b"data: [DONE]")
    events = [json.loads(line[6:]) for line in out.split(b"\n") if line.startswith(b"data: {")]
    if translator == "responses":
        streamed = "".join(e["delta"] for e in events if e["type"] == "response.reasoning_summary_text.delta")
        whole = "".join(p["text"] for item in t.received() if item["type"] == "reasoning" for p in item["summary"])
    else:
        streamed = "".join(e["delta"]["thinking"] for e in events
                           if e["type"] == "content_block_delta" and e["delta"]["type"] == "thinking_delta")
        whole = "".join(b["thinking"] for b in t.received()[0]["content"] if b["type"] == "thinking")
    assert streamed == whole and whole


def _upstream_chunk(acc: StreamAccumulator, chunk: dict) -> None:
    """A chunk as the stream translators take it: its finishes read, then the chunk fed."""
    acc.note_finishes(chunk)
    acc.feed(chunk)


def test_a_chat_answer_is_complete_once_every_choice_finished():
    """A client leaving before the stream's end had its whole answer only when every choice it was
    streamed (n > 1: several) had finished -- the first one's finish alone is not enough."""
    acc = StreamAccumulator()
    _upstream_chunk(acc, {"id": "x", "choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": None},
                                     {"index": 1, "delta": {"content": "b"}, "finish_reason": None}]})
    _upstream_chunk(acc, {"id": "x", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    assert acc.finish_reason == "stop" and not acc.complete
    _upstream_chunk(acc, {"id": "x", "choices": [{"index": 1, "delta": {}, "finish_reason": "length"}]})
    assert acc.complete


def test_a_chat_answer_finished_on_a_chunk_still_bringing_text_is_not_known_whole():
    """Some servers put finish_reason on every chunk (or on the chunks still bringing text): a
    client leaving after one of those may be leaving mid-answer, so the answer counts as whole
    only once a chunk finishes it bringing nothing more -- else a stop pressed mid-answer stored
    the cut answer as a success, and sent it as the next call's context."""
    acc = StreamAccumulator()
    _upstream_chunk(acc, {"id": "x", "choices": [{"index": 0, "delta": {"role": "assistant", "content": "The first half "},
                                      "finish_reason": "stop"}]})
    assert acc.finish_reason == "stop" and not acc.complete
    _upstream_chunk(acc, {"id": "x", "choices": [{"index": 0, "delta": {"content": "and the rest."}, "finish_reason": "stop"}]})
    assert not acc.complete
    _upstream_chunk(acc, {"id": "x", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    assert acc.complete
    _upstream_chunk(acc, {"id": "x", "choices": [{"index": 0, "delta": {"content": " More?"}, "finish_reason": None}]})
    assert not acc.complete  # (text after the finish: not whole after all)


def test_a_chat_answer_is_whole_though_the_masker_released_held_text_with_its_finish():
    """Text that could begin one of the call's credentials ("s" of "sk-...") is held back and
    given out with the chunk that finishes its choice: that chunk then brings text, but the
    upstream's did not -- the answer is whole, and a client leaving there gets it stored (it was
    client_disconnected for any answer ending in a prefix of a key)."""
    from proxy.dialects.chat.masking import masked_chunks
    from proxy.dialects.chat.stream import ChatStream

    def event(delta: dict, finish: str | None = None) -> bytes:
        return b"data: " + json.dumps({"id": "x", "object": "chat.completion.chunk", "model": "m",
                                        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}).encode()

    stream = ChatStream(strip_usage=True, masker=masked_chunks(["sk-secret-key-0123456789"]))
    out = stream.event(event({"role": "assistant", "content": "Both are capital"}))
    out += stream.event(event({"content": "s"}))
    assert not stream.complete() and b'"s"' not in out  # (held back: it may begin the key)
    out = stream.event(event({}, "stop"))
    assert b'"content":"s"' in out.replace(b" ", b"")  # released with the finish
    assert stream.complete() and "".join(stream.acc.content) == "Both are capitals"


def test_a_translated_anthropic_answer_is_complete_at_its_stop_reason():
    """A Responses client over an Anthropic upstream (through chat) that leaves after the upstream's
    message_delta, before message_stop: the answer is whole, and what is stored holds it with its
    finish and the usage message_delta brought -- the upstream's held-back end is passed on."""
    from proxy.dialects import crossing, dialect

    way = crossing(dialect("responses"), dialect("anthropic"))
    t = way.exchange(node_id=uuid.uuid4(), params={"model": "claude-x"}, provider="anthropic").translator(wants_usage=False)
    t.opening()

    def event(kind, **data):
        return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}".encode()

    for raw in (event("message_start", message={"id": "m", "type": "message", "role": "assistant", "model": "claude-x",
                                                "content": [], "usage": {"input_tokens": 11, "output_tokens": 1}}),
                event("content_block_start", index=0, content_block={"type": "text", "text": ""}),
                event("content_block_delta", index=0, delta={"type": "text_delta", "text": "Paris."}),
                event("content_block_stop", index=0)):
        t.event(raw)
    assert not t.complete()
    t.event(event("message_delta", delta={"stop_reason": "end_turn"}, usage={"output_tokens": 5}))
    assert t.complete()  # (message_stop still to come)
    assert t.received()[0]["content"][0]["text"] == "Paris."
    assert t.finish_reason == "stop" and t.usage["output_tokens"] == 5


def test_a_send_the_client_never_takes_ends_as_stalled_and_a_shutdown_stays_a_cancellation():
    """A relay's sends are timed by one timer a response (``timed_send``): a message the client's
    full socket never takes ends with ``ClientStalled`` once ``client_send_timeout`` has passed --
    while the server's own cancellation of a waiting send (the shutdown's grace over) stays a
    cancellation, and sends the client takes go on as they came, the timer gone once closed."""
    import asyncio

    from proxy.sending import ClientStalled, timed_send

    async def main() -> None:
        taken: list[object] = []
        stuck = asyncio.Event()  # (never set: a socket that stays full)

        async def send(message: object) -> None:
            if message == "stuck":
                await stuck.wait()
            taken.append(message)

        timed = timed_send(send, 0.05)
        await timed("a")
        await asyncio.sleep(0.08)  # (the timer fires between sends: nothing in progress, nothing ended)
        await timed("b")
        with pytest.raises(ClientStalled):
            await timed("stuck")
        with pytest.raises(ClientStalled):  # (stalled once, stalled for good)
            await timed("c")
        assert taken == ["a", "b"]
        assert asyncio.current_task().cancelling() == 0  # (its own cancellation taken back)

        shutdown = timed_send(send, 60)
        waiting = asyncio.ensure_future(shutdown("stuck"))
        await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        shutdown.close()
        assert shutdown._handle is None

        assert timed_send(send, 0) is send  # (0: no limit, the server's send itself)

    asyncio.run(main())
