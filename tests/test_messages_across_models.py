"""One conversation, several models (docs/behaviour.md#the-messages-api): what other models leave
on the tree reaches an Anthropic upstream as Anthropic accepts it, and what they answer reaches an
Anthropic (or Responses) client as something it can answer. Each of these, before, made Anthropic
or the proxy refuse every later call of the conversation -- an invalid request leaves the head
where it was, and the next call sends the same thing again. Assertions on what the fake upstream
received; the fake Anthropic does not validate, so its rules are checked here."""

from __future__ import annotations

import json
import re
from typing import Any

import anthropic
import httpx
import pytest

from proxy.dialects import crossing
from proxy.errors import InvalidRequest

from .anthropic_fake import AReply, FakeAnthropic
from .conftest import Proxy
from .fakes import FakeUpstream, Reply
from .test_messages import client

TOOLS = [{"name": "Bash", "input_schema": {"type": "object"}}]
_TOOL_ID = re.compile(r"^[a-zA-Z0-9_-]+$")


def _anthropic_accepts(messages: list[dict[str, Any]]) -> None:
    """Anthropic's rules on a request's messages: content in every one but a last assistant
    message (a prefill), tool ids of its pattern, each tool_result answering a tool_use before it."""
    uses: list[str] = []
    for i, m in enumerate(messages):
        if i < len(messages) - 1:
            assert m.get("content") not in ([], "", None), (i, messages)
        for b in m["content"] if isinstance(m["content"], list) else ():
            if b.get("type") == "tool_use":
                assert isinstance(b["id"], str) and _TOOL_ID.match(b["id"]), b
                uses.append(b["id"])
            elif b.get("type") == "tool_result":
                assert b["tool_use_id"] in uses, (b, uses)


def _post(proxy: Proxy, path: str, body: dict[str, Any], key: str) -> httpx.Response:
    return httpx.post(f"{proxy.url}{path}", json=body, headers={"x-api-key": key}, timeout=30)


def _events(text: str) -> list[tuple[str, Any]]:
    out = []
    for block in text.split("\n\n"):
        lines = block.strip().split("\n")
        name = next((line[6:].strip() for line in lines if line.startswith("event:")), None)
        data = "".join(line[5:].strip() for line in lines if line.startswith("data:"))
        if name:
            out.append((name, json.loads(data) if data else None))
    return out


# -- an answer with nothing Anthropic may read -------------------------------------------------------


def test_claudes_own_empty_answer_is_left_out_of_the_next_request(mproxy: Proxy, claude: FakeAnthropic, key: str,
                                                                  cid: str) -> None:
    """Claude may answer ``content: []`` (end_turn); the next call of the conversation sent it back
    as an empty assistant message, which Anthropic refuses."""
    c = client(mproxy, key, f"/c/{cid}")
    claude.enqueue(AReply(content=[], stop_reason="end_turn"))
    c.messages.create(model="claude-x", max_tokens=5, messages=[{"role": "user", "content": "a"}])
    c.messages.create(model="claude-x", max_tokens=5, messages=[{"role": "user", "content": "b"}])
    sent = claude.last.body["messages"]
    _anthropic_accepts(sent)
    # the two questions, joined as Anthropic reads consecutive turns of one role
    assert sent == [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]


def test_another_models_empty_or_reasoning_only_answer_then_claude(mproxy: Proxy, upstream: FakeUpstream,
                                                                   claude: FakeAnthropic, key: str, cid: str) -> None:
    """A chat model's empty answer, and one that was only reasoning (its thinking has no signature
    for Anthropic, so nothing of it is sent), from an Anthropic client and from a chat client."""
    c = client(mproxy, key, f"/c/{cid}")
    upstream.enqueue(Reply(content=None, reasoning="thinking only, ran out", finish_reason="length"), Reply(content=""))
    c.messages.create(model="gpt-x", max_tokens=5, messages=[{"role": "user", "content": "a"}])
    c.messages.create(model="gpt-x", max_tokens=5, messages=[{"role": "user", "content": "b"}])
    oc = mproxy.openai(key, conversation=cid)
    upstream.enqueue(Reply(content=""))
    oc.chat.completions.create(model="gpt-x", messages=[{"role": "user", "content": "c"}])
    c.messages.create(model="claude-x", max_tokens=5, messages=[{"role": "user", "content": "d"}])
    sent = claude.last.body["messages"]
    _anthropic_accepts(sent)
    assert [b["text"] for m in sent for b in m["content"]] == ["a", "b", "c", "d"]


# -- tool ids ------------------------------------------------------------------------------------------


def test_a_tool_call_without_an_id_is_given_one_the_client_can_answer(mproxy: Proxy, upstream: FakeUpstream,
                                                                      claude: FakeAnthropic, key: str, cid: str) -> None:
    """Some OpenAI-compatible servers send a tool call without an id (or ""): the Anthropic client
    got ``"id": null``, answered it with ``tool_use_id: null``, and the proxy refused that. Now it
    gets an id -- the same in the stream, a whole answer and the stored one -- and the round goes
    on, on the chat model and then on Claude."""
    upstream.enqueue(
        Reply(content=None, tool_calls=[{"type": "function", "function": {"name": "Bash", "arguments": '{"c": 1}'}}]),
        Reply(kind="stream", content=None, tool_calls=[
            {"id": "", "type": "function", "function": {"name": "Bash", "arguments": '{"c": 2}'}}]),
    )
    first = _post(mproxy, f"/c/{cid}/v1/messages", {"model": "gpt-x", "max_tokens": 5, "tools": TOOLS,
                                                     "messages": [{"role": "user", "content": "x"}]}, key)
    use = first.json()["content"][-1]
    assert use["type"] == "tool_use" and isinstance(use["id"], str) and use["id"]
    second = _post(mproxy, f"/c/{cid}/v1/messages", {"model": "gpt-x", "max_tokens": 5, "tools": TOOLS, "stream": True,
                                                      "messages": [{"role": "user", "content": [
                                                          {"type": "tool_result", "tool_use_id": use["id"],
                                                           "content": "a.txt"}]}]}, key)
    assert second.status_code == 200, second.text
    assert upstream.last.body["messages"][-2]["tool_calls"][0]["id"] == use["id"]  # (and its result answers it)
    assert upstream.last.body["messages"][-1]["tool_call_id"] == use["id"]
    streamed = [d["content_block"] for n, d in _events(second.text) if n == "content_block_start"
                and d["content_block"]["type"] == "tool_use"]
    assert len(streamed) == 1 and streamed[0]["id"] and streamed[0]["id"] != use["id"]
    stored = httpx.get(f"{mproxy.url}/admin/nodes/{second.headers['x-node-id']}", headers={"x-api-key": key}).json()
    assert stored["received"][0]["content"][-1]["id"] == streamed[0]["id"]

    c = client(mproxy, key, f"/c/{cid}")
    c.messages.create(model="claude-x", max_tokens=5, tools=TOOLS, messages=[{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": streamed[0]["id"], "content": "b.txt"}]}])
    _anthropic_accepts(claude.last.body["messages"])


def test_a_responses_client_gets_a_call_id_for_a_call_without_one(mproxy: Proxy, upstream: FakeUpstream, key: str,
                                                                  cid: str) -> None:
    oc = mproxy.openai(key, conversation=cid)
    upstream.enqueue(Reply(content=None, tool_calls=[{"type": "function", "function": {"name": "Bash", "arguments": "{}"}}]),
                     Reply(kind="stream", content=None, tool_calls=[
                         {"type": "function", "function": {"name": "Bash", "arguments": "{}"}}]))
    whole = oc.responses.create(model="gpt-x", input="x", tools=[{"type": "function", "name": "Bash", "parameters": {}}])
    assert whole.output[-1].type == "function_call" and whole.output[-1].call_id
    events = list(oc.responses.create(model="gpt-x", input=[{"type": "function_call_output",
                                                              "call_id": whole.output[-1].call_id, "output": "ok"}],
                                      tools=[{"type": "function", "name": "Bash", "parameters": {}}], stream=True))
    added = [e.item for e in events if e.type == "response.output_item.added" and e.item.type == "function_call"]
    done = events[-1].response.output[-1]
    assert added[0].call_id and added[0].call_id == done.call_id != whole.output[-1].call_id
    item_done = [e.item for e in events if e.type == "response.output_item.done" and e.item.type == "function_call"]
    assert [i.call_id for i in item_done] == [added[0].call_id]
    assert upstream.last.body["messages"][-1]["tool_call_id"] == whole.output[-1].call_id


def test_another_models_tool_ids_reach_anthropic_in_its_pattern_and_paired(mproxy: Proxy, upstream: FakeUpstream,
                                                                           claude: FakeAnthropic, key: str,
                                                                           cid: str) -> None:
    """Ids such as ``functions.Bash:0`` (Anthropic refuses them) are made of its characters, alike
    on the call and on its result; two ids that differ only in what is replaced stay apart."""
    c = client(mproxy, key, f"/c/{cid}")
    upstream.enqueue(Reply(content=None, tool_calls=[
        {"id": "functions.Bash:0", "type": "function", "function": {"name": "Bash", "arguments": '{"c": "ls"}'}},
        {"id": "functions.Bash.0", "type": "function", "function": {"name": "Bash", "arguments": '{"c": "pwd"}'}}]))
    m = c.messages.create(model="gpt-x", max_tokens=5, tools=TOOLS, messages=[{"role": "user", "content": "list"}])
    assert [b.id for b in m.content] == ["functions.Bash:0", "functions.Bash.0"]  # (the client gets them as made)
    c.messages.create(model="claude-x", max_tokens=5, tools=TOOLS, messages=[{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": b.id, "content": f"out {i}"} for i, b in enumerate(m.content)]}])
    sent = claude.last.body["messages"]
    _anthropic_accepts(sent)
    uses = [b["id"] for b in sent[1]["content"]]
    assert len(set(uses)) == 2 and [b["tool_use_id"] for b in sent[2]["content"]] == uses


# -- a forced tool the upstream goes without -------------------------------------------------------------


def test_forcing_a_hosted_tool_over_chat_lets_the_model_choose(mproxy: Proxy, upstream: FakeUpstream, key: str,
                                                               cid: str) -> None:
    """The hosted tool is dropped from a chat upstream's tools; forcing it forced a function the
    request did not have (OpenAI refuses that)."""
    tools = [*TOOLS, {"type": "web_search_20250305", "name": "web_search", "max_uses": 2}]
    r = _post(mproxy, f"/c/{cid}/v1/messages", {"model": "gpt-x", "max_tokens": 10, "tools": tools,
                                                 "tool_choice": {"type": "tool", "name": "web_search"},
                                                 "messages": [{"role": "user", "content": "search"}]}, key)
    assert r.status_code == 200, r.text
    assert r.headers["x-branchpoint-dropped-tools"] == "web_search_20250305"
    assert upstream.last.body["tool_choice"] == "auto"
    assert [t["function"]["name"] for t in upstream.last.body["tools"]] == ["Bash"]
    _post(mproxy, f"/c/{cid}/v1/messages", {"model": "gpt-x", "max_tokens": 10, "tools": tools,
                                             "tool_choice": {"type": "tool", "name": "Bash"},
                                             "messages": [{"role": "user", "content": "run"}]}, key)
    assert upstream.last.body["tool_choice"] == {"type": "function", "function": {"name": "Bash"}}


_SEARCHED = [
    {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "acme q3 revenue"}},
    {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": [
        {"type": "web_search_result", "url": "https://news.example/acme", "title": "ACME Q3",
         "encrypted_content": "SECRET-ENC==", "page_age": None}]},
    {"type": "server_tool_use", "id": "srvtoolu_2", "name": "web_fetch", "input": {"url": "https://news.example/acme"}},
    {"type": "web_fetch_tool_result", "tool_use_id": "srvtoolu_2", "content": {
        "type": "web_fetch_result", "url": "https://news.example/acme", "retrieved_at": "2026-01-01T00:00:00Z",
        "content": {"type": "document", "title": "ACME",
                    "source": {"type": "text", "media_type": "text/plain", "data": "Q3 revenue was 7.3 billion."}}}},
    {"type": "text", "text": "ACME made 7.3B."},
    {"type": "server_tool_use", "id": "srvtoolu_3", "name": "bash_code_execution", "input": {"command": "wc -l a.csv"}},
    {"type": "bash_code_execution_tool_result", "tool_use_id": "srvtoolu_3", "content": {
        "type": "bash_code_execution_result", "stdout": "42 a.csv", "stderr": "", "return_code": 0, "content": []}},
    {"type": "text", "text": "The CSV has 42 lines."},
]
_SEARCHED_LINES = ('[web_search "acme q3 revenue"]\n[web_search result: 1 found -- https://news.example/acme (ACME Q3)]\n'
                   '[web_fetch "https://news.example/acme"]\n'
                   "[web_fetch result: https://news.example/acme (ACME) -- Q3 revenue was 7.3 billion.]\n"
                   'ACME made 7.3B.\n[bash_code_execution "wc -l a.csv"]\n[bash_code_execution result: 42 a.csv]\n'
                   "The CSV has 42 lines.")


@pytest.mark.parametrize("model", ["gpt-x", "native-1"])
def test_claudes_server_tools_reach_another_model_as_lines(mproxy: Proxy, claude: FakeAnthropic, upstream: FakeUpstream,
                                                           key: str, cid: str, model: str) -> None:
    """What Claude's server tools did (a web search, a page fetched, code run) reaches another
    model as a line each, in its place, bounded and without the encrypted content only Anthropic
    reads -- the other model got the text alone, glued ("...7.3B.The CSV..."), with no trace of
    the page the answer was built from."""
    c = client(mproxy, key, f"/c/{cid}")
    claude.enqueue(AReply(content=_SEARCHED))
    c.messages.create(model="claude-x", max_tokens=10, messages=[{"role": "user", "content": "ACME Q3?"}])
    _post(mproxy, f"/c/{cid}/v1/messages", {"model": model, "max_tokens": 10,
                                             "messages": [{"role": "user", "content": "which URL?"}]}, key)
    if model == "gpt-x":
        assert upstream.last.body["messages"][1] == {"role": "assistant", "content": _SEARCHED_LINES}
    else:
        said = upstream.responses_requests[-1].body["input"][1]
        assert [p["text"] for p in said["content"]] == [_SEARCHED_LINES]
    assert "SECRET-ENC" not in json.dumps(upstream.requests[-1].body)
    c.messages.create(model="claude-x", max_tokens=10, messages=[{"role": "user", "content": "more"}])
    assert claude.last.body["messages"][1] == {"role": "assistant", "content": _SEARCHED}  # (Claude: its blocks)


_MCP = [{"type": "url", "url": "https://mcp.example/sse", "name": "crm", "authorization_token": "tok"}]


@pytest.mark.parametrize("model", ["gpt-x", "native-1"])
def test_mcp_servers_towards_another_upstream_are_dropped_and_said(mproxy: Proxy, upstream: FakeUpstream, key: str,
                                                                  cid: str, model: str) -> None:
    """The MCP connector's servers (``mcp_servers``) are tools only Anthropic runs: towards a chat
    or Responses upstream each is dropped and named (``mcp:<name>``), as Anthropic's own tools are,
    and refused with ``unsupported_tools = "refuse"`` -- they were left out unsaid, even there."""
    r = _post(mproxy, f"/c/{cid}/v1/messages", {"model": model, "max_tokens": 10, "mcp_servers": _MCP,
                                                 "tools": [{"type": "web_search_20250305", "name": "web_search"}],
                                                 "messages": [{"role": "user", "content": "look up ACME"}]}, key)
    assert r.status_code == 200, r.text
    assert r.headers["x-branchpoint-dropped-tools"] == "web_search_20250305,mcp:crm"
    sent = (upstream.last if model == "gpt-x" else upstream.responses_requests[-1]).body
    assert "mcp_servers" not in sent and "tools" not in sent
    way = crossing("messages", "chat")
    with pytest.raises(InvalidRequest) as refused:
        way.prepare({"mcp_servers": _MCP}, unsupported_tools="refuse")
    assert "mcp:crm" in str(refused.value)


def test_dropped_tools_a_client_named_are_said_in_one_header_whatever_their_names(mproxy: Proxy, upstream: FakeUpstream,
                                                                                key: str, cid: str) -> None:
    """An MCP server's name is the client's to choose: one outside Latin-1 made the answer's
    headers fail after the call was made and its node stored -- a 500 the client retried, the turn
    made twice -- and a comma read as two names. Each name is percent-encoded in the header."""
    servers = [{**_MCP[0], "name": "crm中"}, {**_MCP[0], "name": "a,b"}]
    r = _post(mproxy, f"/c/{cid}/v1/messages", {"model": "gpt-x", "max_tokens": 10, "mcp_servers": servers,
                                                 "messages": [{"role": "user", "content": "look up ACME"}]}, key)
    assert r.status_code == 200, r.text
    assert r.headers["x-branchpoint-dropped-tools"] == "mcp:crm%E4%B8%AD,mcp:a%2Cb"


def test_the_anthropic_sdk_reads_the_answers(mproxy: Proxy, upstream: FakeUpstream, key: str, cid: str) -> None:
    """(the SDK, not only raw HTTP: an answer with a made id parses as a ToolUseBlock)"""
    upstream.enqueue(Reply(content=None, tool_calls=[{"type": "function", "function": {"name": "Bash", "arguments": "{}"}}]))
    m = client(mproxy, key, f"/c/{cid}").messages.create(model="gpt-x", max_tokens=5, tools=TOOLS,
                                                         messages=[{"role": "user", "content": "x"}])
    assert isinstance(m.content[-1], anthropic.types.ToolUseBlock) and m.content[-1].id


# -- another model's reasoning, a thinking block we signed (bp-signed:) ---------------------------------


def _reasoned(proxy: Proxy, upstream: FakeUpstream, key: str, path: str = "/v1/messages") -> list[dict[str, Any]]:
    """A reasoning chat model's answer to a Messages client: its content blocks."""
    upstream.enqueue(Reply(content="42", reasoning="Six times seven."))
    r = _post(proxy, path, {"model": "gpt-x", "max_tokens": 100, "messages": [{"role": "user", "content": "The answer?"}]},
              key)
    assert r.status_code == 200, r.text
    content = r.json()["content"]
    assert content[0]["type"] == "thinking" and content[0]["signature"].startswith("bp-signed:")
    return content


@pytest.mark.parametrize("where", ["auto", "named-full", "named-delta", "count_tokens"])
def test_thinking_we_signed_never_reaches_claude(mproxy: Proxy, claude: FakeAnthropic, upstream: FakeUpstream,
                                                   key: str, cid: str, where: str) -> None:
    """A client resends our signed thinking (a chat model's reasoning) to Claude in a history that
    matches nothing stored -- read as the node's provider's own blocks, it went on as it came, and
    Anthropic refuses a signature not its own (every later call of the conversation again) -- or
    counts its tokens."""
    content = _reasoned(mproxy, upstream, key)  # (passed through: nothing stored, nothing to match)
    claude.enqueue(AReply(content=[{"type": "text", "text": "Yes."}]))
    history = [{"role": "user", "content": "The answer?"}, {"role": "assistant", "content": content},
               {"role": "user", "content": "Sure?"}]
    path, headers = {"auto": ("/auto/v1/messages", {}), "named-full": (f"/c/{cid}/v1/messages", {"X-Context-Mode": "full"}),
                     "named-delta": (f"/c/{cid}/v1/messages", {}),
                     "count_tokens": ("/v1/messages/count_tokens", {})}[where]
    r = httpx.post(f"{mproxy.url}{path}", json={"model": "claude-x", "max_tokens": 100, "messages": history},
                   headers={"x-api-key": key, **headers}, timeout=30)
    assert r.status_code == 200, r.text
    got = claude.requests[-1]  # (``last`` is the last call: a count is not one)
    sent = got.body
    assert got.path.split("?")[0].endswith("/count_tokens" if where == "count_tokens" else "/messages")
    assert [m["role"] for m in sent["messages"]] == ["user", "assistant", "user"]
    assert sent["messages"][1]["content"] == [{"type": "text", "text": "42"}]
    assert "bp-signed:" not in json.dumps(sent)


@pytest.fixture(scope="module")
def deep(database_url: str, upstream_url: str) -> Any:
    """A proxy whose chat upstream takes its reasoning back (``accepts_reasoning``, DeepSeek's way)."""
    from .conftest import make_settings, serve_proxy

    upstreams = [{"name": "deep", "base_url": upstream_url, "models": ["*"], "accepts_reasoning": True}]
    with serve_proxy(make_settings(database_url, upstream_url, upstreams=upstreams)) as p:
        yield p


def test_a_responses_client_resending_our_signed_thinking_sends_nothing_of_it(deep: Proxy, upstream: FakeUpstream,
                                                                              key: str, cid: str) -> None:
    """The items of a Messages node a reasoning chat model answered, as a Responses client reads
    them (GET /v1/conversations/{id}/items) and resends them: no reasoning item holding our signed
    block as ``thinking_blocks`` -- a field the chat upstream never sent, which it got back."""
    _reasoned(deep, upstream, key, f"/c/{cid}/v1/messages")
    listed = httpx.get(f"{deep.url}/v1/conversations/{cid}/items?order=asc", headers={"x-api-key": key},
                       timeout=30).json()["data"]
    assert "bp-signed:" not in json.dumps(listed)
    upstream.enqueue(Reply(content="ok"))
    items = [{"role": "user", "content": "The answer?"},
             *[{k: v for k, v in i.items() if k != "status"} for i in listed if i.get("role") != "user"],
             {"role": "user", "content": "Sure?"}]
    r = httpx.post(f"{deep.url}/auto/v1/responses", json={"model": "gpt-x", "input": items},
                   headers={"Authorization": f"Bearer {key}-other"}, timeout=30)
    assert r.status_code == 200, r.text
    sent = json.dumps(upstream.last.body["messages"])
    assert "bp-signed:" not in sent and "thinking_blocks" not in sent


@pytest.mark.parametrize("answer", [Reply(reasoning="Six times seven.", content="42"),
                                    Reply(reasoning="Use the tool.", content=None, tool_calls=[
                                        {"id": "call_1", "type": "function", "function": {"name": "Bash", "arguments": "{}"}}]),
                                    Reply(reasoning="Only thinking.", content=None)],
                         ids=["then-text", "then-tool", "only"])
def test_the_sdks_stream_reads_our_signature_as_stored(mproxy: Proxy, upstream: FakeUpstream, key: str, cid: str,
                                                       answer: Reply) -> None:
    """Streamed, the thinking block's signature comes as Anthropic sends one (a ``signature_delta``
    before its ``content_block_stop``): the official SDK's accumulated message carries the one stored."""
    upstream.enqueue(answer)
    with client(mproxy, key, f"/c/{cid}").messages.stream(model="gpt-x", max_tokens=100, tools=TOOLS,
                                                           messages=[{"role": "user", "content": "q"}]) as stream:
        kinds = [(e.type, getattr(getattr(e, "delta", None), "type", None)) for e in stream
                 if e.type not in ("text", "thinking", "signature", "input_json", "citation")]  # (the SDK's own)
        final = stream.get_final_message()
        node_id = stream.response.headers["x-node-id"]
    at = kinds.index(("content_block_delta", "signature_delta"))
    assert kinds[at + 1] == ("content_block_stop", None)
    got = [b.signature for b in final.content if b.type == "thinking"]
    stored = httpx.get(f"{mproxy.url}/admin/nodes/{node_id}", headers={"x-api-key": key}, timeout=30).json()["received"]
    assert len(got) == 1 and got[0].startswith("bp-signed:")
    assert got == [b["signature"] for b in stored[0]["content"] if b["type"] == "thinking"]
