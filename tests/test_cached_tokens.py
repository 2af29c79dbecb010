"""Cached tokens across APIs (docs/behaviour.md#cached-tokens): whatever the client speaks and
whatever its upstream speaks, what the upstream reported of its prompt cache -- reads, and
Anthropic's writes, which chat and Responses have no word for -- is kept in the node's usage and
counted alike in the conversation's usage, /admin/usage and /metrics, streamed or not; the
client's usage object carries it too."""

from __future__ import annotations

import re
import uuid

import anthropic
import httpx
import pytest

from .anthropic_fake import AReply, FakeAnthropic
from .conftest import Proxy
from .fakes import Reply

# an Anthropic upstream's usage: 10 new, 50 read from its cache, 100 written to it -> 160 prompt tokens
ANTHROPIC = {"input_tokens": 10, "cache_read_input_tokens": 50, "cache_creation_input_tokens": 100, "output_tokens": 5}
CHAT = {"prompt_tokens": 100, "completion_tokens": 5, "total_tokens": 105, "prompt_tokens_details": {"cached_tokens": 80}}
RESPONSES = {"input_tokens": 100, "output_tokens": 5, "total_tokens": 105, "input_tokens_details": {"cached_tokens": 80}}
# a chat upstream in front of Anthropic (as LiteLLM answers): the writes beside chat's fields
CHAT_WITH_WRITES = {"prompt_tokens": 160, "completion_tokens": 5, "total_tokens": 165,
                    "prompt_tokens_details": {"cached_tokens": 50}, "cache_creation_input_tokens": 100}

MODELS = {"anthropic": "claude-x", "responses": "native-x", "chat": "gpt-x"}


def _metric(p: Proxy) -> float:
    m = re.search(r"^branchpoint_cached_tokens_total ([0-9.e+]+)$", httpx.get(f"{p.url}/metrics").text, re.M)
    return float(m.group(1)) if m else 0.0


def _call(p: Proxy, key: str, cid: str, client: str, model: str, stream: bool) -> dict:
    """One call through the client's own SDK; the usage it was given."""
    if client == "messages":
        c = anthropic.Anthropic(base_url=f"{p.url}/c/{cid}", api_key=key, max_retries=0)
        if stream:
            with c.messages.stream(model=model, max_tokens=50, messages=[{"role": "user", "content": "hi"}]) as s:
                return s.get_final_message().usage.model_dump(exclude_none=True)
        return c.messages.create(model=model, max_tokens=50, messages=[{"role": "user", "content": "hi"}]).usage.model_dump(
            exclude_none=True)
    openai = p.openai(key)
    headers = {"X-Conversation-Id": cid}
    if client == "chat":
        if stream:
            chunks = list(openai.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}],
                                                         extra_headers=headers, stream=True,
                                                         stream_options={"include_usage": True}))
            return chunks[-1].usage.model_dump(exclude_none=True)
        return openai.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}],
                                              extra_headers=headers).usage.model_dump(exclude_none=True)
    if stream:
        events = list(openai.responses.create(model=model, input="hi", extra_headers=headers, stream=True))
        return events[-1].response.usage.model_dump(exclude_none=True)
    return openai.responses.create(model=model, input="hi", extra_headers=headers).usage.model_dump(exclude_none=True)


def _enqueue(upstream_api: str, usage: dict, stream: bool, upstream, claude: FakeAnthropic) -> None:
    if upstream_api == "anthropic":
        claude.enqueue(AReply(usage=dict(usage)))
    else:
        upstream.enqueue(Reply(kind="stream" if stream and upstream_api == "chat" else "json", usage=dict(usage)))


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("client, upstream_api, reported, cached, prompt", [
    ("chat", "anthropic", ANTHROPIC, 150, 160),
    ("responses", "anthropic", ANTHROPIC, 150, 160),
    ("messages", "anthropic", ANTHROPIC, 150, 160),
    ("messages", "chat", CHAT, 80, 100),
    ("messages", "chat", CHAT_WITH_WRITES, 150, 160),
    ("messages", "responses", RESPONSES, 80, 100),
    ("chat", "chat", CHAT, 80, 100),
    ("chat", "chat", CHAT_WITH_WRITES, 150, 160),
    ("chat", "responses", RESPONSES, 80, 100),
    ("responses", "chat", CHAT, 80, 100),
    ("responses", "responses", RESPONSES, 80, 100),
])
def test_cached_tokens_are_kept_and_counted_whatever_the_apis(mproxy, upstream, claude, key, client, upstream_api,
                                                              reported, cached, prompt, stream):
    cid = f"cached-{uuid.uuid4().hex[:8]}"
    before = _metric(mproxy)
    _enqueue(upstream_api, reported, stream, upstream, claude)
    given = _call(mproxy, key, cid, client, MODELS[upstream_api], stream)

    http = mproxy.http(key)
    usage = http.get(f"/admin/conversations/{cid}").json()["usage"]
    report = http.get("/admin/usage").json()  # (the key is this test's own: its tenant's calls only)
    assert (usage["cached_tokens"], usage["prompt_tokens"]) == (cached, prompt)
    assert (report["cached_tokens"], report["prompt_tokens"]) == (cached, prompt)
    assert _metric(mproxy) - before == cached

    writes = reported.get("cache_creation_input_tokens")
    if writes:  # the client is told of the writes too, in its own API's terms
        assert given.get("cache_creation_input_tokens") == writes, given
        if client == "messages":
            assert given["input_tokens"] + given["cache_read_input_tokens"] + writes == prompt, given


def _tokens_in(p: Proxy) -> float:
    m = re.search(r'^branchpoint_tokens_total\{direction="in"\} ([0-9.e+]+)$', httpx.get(f"{p.url}/metrics").text, re.M)
    return float(m.group(1)) if m else 0.0


def test_a_summariser_calls_tokens_are_counted_with_their_cache(mproxy, upstream, key):
    """The summariser is an upstream call like the client's: the prompt tokens it reports, and the
    cached ones among them (which were dropped: only top-level counts were added up), count in
    the conversation's usage and on /metrics."""
    cid, http = f"sum-{uuid.uuid4().hex[:8]}", mproxy.http(key)
    for i in range(5):
        mproxy.openai(key, conversation=cid).chat.completions.create(
            model="gpt-x", messages=[{"role": "user", "content": f"question {i}"}])
    before, tokens, cached = http.get(f"/admin/conversations/{cid}").json()["usage"], _tokens_in(mproxy), _metric(mproxy)
    upstream.enqueue_summary(Reply(content="Facts: a summary.", usage={
        "prompt_tokens": 1000, "completion_tokens": 50, "total_tokens": 1050,
        "prompt_tokens_details": {"cached_tokens": 800}}))
    assert http.post(f"/admin/conversations/{cid}/compact").json()["compacted"] is True
    after = http.get(f"/admin/conversations/{cid}").json()["usage"]
    assert (after["prompt_tokens"] - before["prompt_tokens"], after["cached_tokens"] - before["cached_tokens"]) == (1000, 800)
    assert (_tokens_in(mproxy) - tokens, _metric(mproxy) - cached) == (1000, 800)


@pytest.mark.parametrize("client", ["responses", "chat"])
def test_a_failed_responses_stream_keeps_the_usage_it_reported(mproxy, upstream, key, client):
    """A Responses upstream's stream that ends in response.failed may report usage (the tokens
    were spent): the failed node keeps it and the conversation counts it -- relayed to a Responses
    client or translated for a chat one -- as a failed Anthropic stream's already was."""
    cid = f"rf-{uuid.uuid4().hex[:8]}"
    upstream.enqueue(Reply(content="partial", error_event={"code": "server_error", "message": "boom"}, usage={
        "input_tokens": 120, "output_tokens": 7, "total_tokens": 127, "input_tokens_details": {"cached_tokens": 100}}))
    path, body = (("/v1/responses", {"input": "hi"}) if client == "responses"
                  else ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}))
    r = httpx.post(f"{mproxy.url}{path}", json={"model": "native-x", "stream": True, **body}, timeout=30,
                   headers={"Authorization": f"Bearer {key}", "X-Conversation-Id": cid})
    assert r.status_code == 200
    (node,) = mproxy.http(key).get(f"/admin/conversations/{cid}/tree").json()["data"]
    usage = mproxy.http(key).get(f"/admin/conversations/{cid}").json()["usage"]
    assert (node["status"], usage["prompt_tokens"], usage["cached_tokens"]) == ("failed", 120, 100)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("upstream_api, reported", [
    ("chat", {**CHAT, "completion_tokens_details": {"reasoning_tokens": 3}}),
    ("responses", {**RESPONSES, "output_tokens_details": {"reasoning_tokens": 3}}),
])
def test_a_messages_clients_node_keeps_the_upstreams_whole_usage(mproxy, upstream, claude, key, upstream_api,
                                                                 reported, stream):
    """A Messages client of a chat or Responses upstream is given Anthropic's usage, which has no
    word for reasoning tokens or a total; its node keeps the upstream's usage whole, in chat's
    terms (as a chat client's node of either upstream does). The node stored the client's copy
    before, and lost the reasoning tokens the upstream reported."""
    cid = f"whole-{uuid.uuid4().hex[:8]}"
    _enqueue(upstream_api, reported, stream, upstream, claude)
    given = _call(mproxy, key, cid, "messages", MODELS[upstream_api], stream)
    assert (given["input_tokens"], given["cache_read_input_tokens"], given["output_tokens"]) == (20, 80, 5)
    node = mproxy.http(key).get(f"/admin/conversations/{cid}/tree").json()["data"][0]
    assert node["usage"] == {"prompt_tokens": 100, "completion_tokens": 5, "total_tokens": 105,
                             "prompt_tokens_details": {"cached_tokens": 80},
                             "completion_tokens_details": {"reasoning_tokens": 3}}
    usage = mproxy.http(key).get(f"/admin/conversations/{cid}").json()["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"], usage["cached_tokens"]) == (100, 5, 80)
