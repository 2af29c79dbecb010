"""Context editing in every API's own shape (docs/behaviour.md#context-editing): a Responses
client's ``function_call_output`` items reach a Responses upstream with the placeholder as their
``output``, an Anthropic client's ``tool_result`` blocks reach an Anthropic upstream with it as
their ``content`` (``is_error`` kept) -- asserted on what the fake upstreams received. (The viewer's
side: tests/test_ui.py::test_cleared_tool_results_and_their_originals.)"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import anthropic
import httpx
import pytest

from proxy.compaction.clearing import PLACEHOLDER_PREFIX
from tests.anthropic_fake import AReply, FakeAnthropic
from tests.conftest import Proxy, make_settings, proxy_with, three_upstreams
from tests.fakes import Reply, ServerThread
from tests.test_context_editing import clearing_nodes, output

LIMITS = {"native-tiny*": {"context_window": 4000, "max_output_tokens": 1000},
          "claude-tiny*": {"context_window": 4000, "max_output_tokens": 1000}}


@pytest.fixture
def apis(fresh_database_url: str, upstream_url: str, claude_server: tuple[FakeAnthropic, ServerThread]) -> Iterator[Proxy]:
    yield from proxy_with(fresh_database_url, upstream_url, models=LIMITS,
                          upstreams=three_upstreams(upstream_url, claude_server))


def test_responses_function_call_outputs_are_cleared_natively(apis, upstream, key, cid):
    client = apis.openai(key)
    headers = {"X-Conversation-Id": cid}
    for i in range(7):
        call = {"id": f"call_{i}", "type": "function", "function": {"name": "shell", "arguments": json.dumps({"cmd": f"cat f{i}"})}}
        # the last tool call reports a context above the clearing threshold (1,500 of 3,000)
        big = {"input_tokens": 1600, "output_tokens": 10, "total_tokens": 1610} if i == 6 else None
        upstream.enqueue(Reply(content=None, tool_calls=[call], usage=big))
        client.responses.create(model="native-tiny", input=f"task {i}", extra_headers=headers)
        upstream.enqueue(Reply(content=f"done {i}"))
        client.responses.create(model="native-tiny", extra_headers=headers, input=[
            {"type": "function_call_output", "call_id": f"call_{i}", "output": output(i, 600)}])
    assert len(clearing_nodes(apis.db, cid)) == 1
    sent = upstream.responses_requests[-1].body["input"]
    outputs = [item for item in sent if item.get("type") == "function_call_output"]
    assert [o["call_id"] for o in outputs] == [f"call_{i}" for i in range(7)]
    assert all(o["output"].startswith(PLACEHOLDER_PREFIX) and "`shell`" in o["output"] for o in outputs[:4])
    assert [o["output"] for o in outputs[4:]] == [output(i, 600) for i in (4, 5, 6)]
    # the calls stay, each right before its output
    calls = [item["call_id"] for item in sent if item.get("type") == "function_call"]
    assert calls == [f"call_{i}" for i in range(7)]


def responses_round(client, upstream, cid: str, i: int, *, before_output=(), **kw):
    """One tool round of a Responses agent on native-tiny: a task, the model's call, its output
    (``kw``: more fields of that call). The last round (6) reports a context above the clearing
    threshold (1,500 of 3,000). ``before_output``: replies the upstream gives first on the output's
    call. Returns the raw response to the output's call."""
    headers = {"X-Conversation-Id": cid}
    call = {"id": f"call_{i}", "type": "function", "function": {"name": "shell", "arguments": "{}"}}
    big = {"input_tokens": 1600, "output_tokens": 10, "total_tokens": 1610} if i == 6 else None
    upstream.enqueue(Reply(content=None, tool_calls=[call], usage=big))
    client.responses.create(model="native-tiny", input=f"task {i}", extra_headers=headers)
    upstream.enqueue(*before_output, Reply(content=f"done {i}"))
    return client.responses.with_raw_response.create(
        model="native-tiny", extra_headers=headers,
        input=[{"type": "function_call_output", "call_id": f"call_{i}", "output": output(i, 600)}], **kw)


def test_anthropic_tool_results_are_cleared_natively(apis, claude, key, cid):
    c = anthropic.Anthropic(base_url=f"{apis.url}/c/{cid}", api_key=key, max_retries=0)
    tools = [{"name": "Read", "description": "Read a file", "input_schema": {"type": "object"}}]
    for i in range(7):
        usage = {"input_tokens": 1600, "output_tokens": 10} if i == 6 else {"input_tokens": 11, "output_tokens": 5}
        claude.enqueue(AReply(content=[{"type": "tool_use", "id": f"toolu_{i}", "name": "Read",
                                        "input": {"path": f"f{i}.py"}}], stop_reason="tool_use", usage=usage))
        c.messages.create(model="claude-tiny", max_tokens=100, tools=tools,
                          messages=[{"role": "user", "content": f"task {i}"}])
        claude.enqueue(AReply(content=[{"type": "text", "text": f"done {i}"}]))
        c.messages.create(model="claude-tiny", max_tokens=100, tools=tools, messages=[{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": output(i, 600), "is_error": i == 1}]}])
    assert len(clearing_nodes(apis.db, cid)) == 1
    sent = claude.last.body["messages"]
    results = [b for m in sent if m["role"] == "user" and isinstance(m["content"], list)
               for b in m["content"] if b.get("type") == "tool_result"]
    assert [r["tool_use_id"] for r in results] == [f"toolu_{i}" for i in range(7)]
    assert all(r["content"].startswith(PLACEHOLDER_PREFIX) and "`Read`" in r["content"] for r in results[:4])
    assert results[1]["is_error"] is True
    assert [r["content"] for r in results[4:]] == [output(i, 600) for i in (4, 5, 6)]
    # each result's message follows the assistant message holding its tool_use
    for k, m in enumerate(sent):
        for b in m["content"] if isinstance(m["content"], list) else ():
            if b.get("type") == "tool_result":
                uses = [u["id"] for u in sent[k - 1]["content"] if u.get("type") == "tool_use"]
                assert b["tool_use_id"] in uses


def test_thinking_survives_a_clearing_mid_tool_loop(apis, claude, key, cid):
    """A chat client on an Anthropic model with extended thinking: Anthropic wants each tool
    round's signed thinking blocks back while the loop goes on. A clearing node carries the answers
    whole (reasoning included), and they are shaped for the provider of each later call -- so the
    call after the clearing still sends them (without them: a 400 mid tool loop, and the
    conversation stuck)."""
    from .helpers import say, tool, user

    client = apis.openai(key)
    for i in range(7):
        usage = {"input_tokens": 1600, "output_tokens": 10} if i == 6 else {"input_tokens": 11, "output_tokens": 5}
        claude.enqueue(AReply(content=[
            {"type": "thinking", "thinking": f"I should read f{i}.py", "signature": f"sig-{i}"},
            {"type": "tool_use", "id": f"toolu_{i}", "name": "Read", "input": {"path": f"f{i}.py"}}],
            stop_reason="tool_use", usage=usage))
        say(client, cid, user(f"task {i}"), model="claude-tiny")
        claude.enqueue(AReply(content=[{"type": "thinking", "thinking": "done", "signature": f"sig-done-{i}"},
                                       {"type": "text", "text": f"done {i}"}]))
        say(client, cid, tool(f"toolu_{i}", output(i, 600)), model="claude-tiny")
    assert len(clearing_nodes(apis.db, cid)) == 1
    sent = claude.last.body["messages"]
    results = [b for m in sent if m["role"] == "user" and isinstance(m["content"], list)
               for b in m["content"] if b.get("type") == "tool_result"]
    assert sum(str(r["content"]).startswith(PLACEHOLDER_PREFIX) for r in results) == 4  # it was cleared
    # every tool round's assistant message still opens with its signed thinking block
    rounds = [m for m in sent if m["role"] == "assistant" and any(b.get("type") == "tool_use" for b in m["content"])]
    assert len(rounds) == 7
    for i, m in enumerate(rounds):
        assert m["content"][0] == {"type": "thinking", "thinking": f"I should read f{i}.py", "signature": f"sig-{i}"}
    # and the clearing node keeps no provider's shaping: another provider gets no thinking back
    stored = [item for item in clearing_nodes(apis.db, cid)[0]["sent"] if item.get("role") == "assistant"]
    assert stored and all(item.get("_bp_carried") == "anthropic" for item in stored)


def test_conversation_items_keep_their_ids_and_contents_across_a_clearing(apis, upstream, key, cid):
    """The Conversations API lists what the conversation holds: a clearing edits what is sent, so
    the items listed (their ids, the tool outputs) are the same before and after one."""
    client = apis.openai(key)
    listed: list[list[dict]] = []
    for i in range(7):
        responses_round(client, upstream, cid, i)
        page = apis.http(key).get(f"/v1/conversations/{cid}/items", params={"order": "asc", "limit": 100}).json()
        listed.append(page["data"])
    assert len(clearing_nodes(apis.db, cid)) == 1
    before, after = listed[-2], listed[-1]
    assert after[:len(before)] == before
    outputs = [item["output"] for item in after if item["type"] == "function_call_output"]
    assert outputs == [output(i, 600) for i in range(7)]  # no placeholder among what the conversation holds
    # an item from before the clearing can be fetched by its id, and deleted (a new branch without it)
    first = next(item for item in after if item["type"] == "function_call_output")
    assert apis.http(key).get(f"/v1/conversations/{cid}/items/{first['id']}").json() == first
    assert apis.http(key).delete(f"/v1/conversations/{cid}/items/{first['id']}").status_code == 200
    left = apis.http(key).get(f"/v1/conversations/{cid}/items", params={"order": "asc", "limit": 100}).json()["data"]
    assert [item["id"] for item in left] == [item["id"] for item in after if item["id"] != first["id"]]


def test_a_clearing_is_no_compaction_item_in_a_responses_answer(apis, upstream, key, cid):
    """A client that asked for OpenAI's compaction controls gets a ``compaction`` item first when a
    summary was made for its call; a clearing of old tool results is no summary -- its answer
    begins with the answer, and the call still hangs under the clearing node."""
    client = apis.openai(key)
    control = [{"type": "compaction", "compact_threshold": 100_000}]  # (far above: no summary)
    for i in range(7):
        raw = responses_round(client, upstream, cid, i, context_management=control)
    nodes = clearing_nodes(apis.db, cid)
    assert len(nodes) == 1 and upstream.summariser_requests == []
    response = raw.parse()
    assert [item.type for item in response.output] == ["message"] and response.output_text == "done 6"
    assert raw.headers["x-parent-node-id"] == str(nodes[0]["id"])


def test_truncation_auto_summarises_what_a_clearing_left_too_long(apis, upstream, key, cid):
    """A Responses call with ``truncation: "auto"``, cleared before it is sent, still overflows the
    upstream's context: the cleared path is summarised and the call tried once more -- the answer
    then begins with that summary's compaction item."""
    from tests.test_conversations_compaction import OVERFLOW

    client = apis.openai(key)
    # on the last round: the overflow, then the summariser's answer (it asks the same upstream), then the retry's
    overflow = (Reply(kind="error", status=400, error=OVERFLOW), Reply(content="Facts so far: six tasks."))
    for i in range(7):
        raw = responses_round(client, upstream, cid, i, before_output=overflow if i == 6 else (), truncation="auto")
    response = raw.parse()
    assert len(clearing_nodes(apis.db, cid)) == 1
    assert [item.type for item in response.output] == ["compaction", "message"] and response.output_text == "done 6"
    assert "Facts so far: six tasks." in json.dumps(upstream.responses_requests[-1].body["input"])
    summary = apis.db.fetch("SELECT id, compacted_from FROM nodes WHERE conversation_id = $1 AND kind = 'compaction' "
                            "AND params ->> 'method' = 'summary'", cid)
    assert len(summary) == 1 and summary[0]["compacted_from"] == clearing_nodes(apis.db, cid)[0]["id"]
    assert raw.headers["x-parent-node-id"] == str(summary[0]["id"])


BETA = "context-management-2025-06-27"  # (the SDK's beta messages: where context_management is)


def _messages_session(c, upstream, cid_edits, rounds: int) -> list:
    """``rounds`` tool rounds of an Anthropic client over the chat upstream (gpt-x: no clearing by
    the configured thresholds), each call carrying ``cid_edits`` as its ``context_management``;
    returns the answers."""
    tools = [{"name": "Read", "input_schema": {"type": "object"}}, {"name": "Plan", "input_schema": {"type": "object"}}]
    answers = []
    for i in range(rounds):
        name = "Plan" if i == 0 else "Read"
        upstream.enqueue(Reply(content=None, tool_calls=[
            {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": "{}"}}]))
        answers.append(c.beta.messages.create(betas=[BETA], model="gpt-x", max_tokens=100, tools=tools,
                                              context_management=cid_edits,
                                              messages=[{"role": "user", "content": f"task {i}"}]))
        upstream.enqueue(Reply(content=f"done {i}"))
        answers.append(c.beta.messages.create(betas=[BETA], model="gpt-x", max_tokens=100, tools=tools,
                                              context_management=cid_edits, messages=[
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"call_{i}", "content": output(i, 600)}]}]))
    return answers


def _cleared_in(body: dict) -> list[tuple[str, int, int]]:
    """What a chat request carries cleared, as an Anthropic answer's ``applied_edits`` say it: the
    tool results given as placeholders, and their originals' tokens (each placeholder says them)."""
    held = [m["content"] for m in body["messages"] if m["role"] == "tool" and m["content"].startswith(PLACEHOLDER_PREFIX)]
    tokens = sum(int(re.search(r"\(about ([0-9,]+) tokens\)", p).group(1).replace(",", "")) for p in held)
    return [("clear_tool_uses_20250919", len(held), tokens)] if held else []


@pytest.mark.parametrize("trigger", [{"type": "input_tokens", "value": 600}, {"type": "tool_uses", "value": 2}])
def test_an_anthropic_clients_own_edit_is_carried_out_over_a_chat_upstream(apis, upstream, key, cid, trigger):
    """Anthropic's ``clear_tool_uses`` edit in the request, the model's upstream not Anthropic's:
    the proxy clears old tool results itself, by the request's trigger, ``keep`` and
    ``exclude_tools`` (the configured thresholds are far away), and the field is not sent."""
    c = anthropic.Anthropic(base_url=f"{apis.url}/c/{cid}", api_key=key, max_retries=0)
    edits = {"edits": [{"type": "clear_thinking_20251015"},
                       {"type": "clear_tool_uses_20250919", "trigger": trigger,
                        "keep": {"type": "tool_uses", "value": 1}, "exclude_tools": ["Plan"]}]}
    answers = _messages_session(c, upstream, edits, 5)
    nodes = clearing_nodes(apis.db, cid)
    assert nodes and all(n["params"]["requested"] is True for n in nodes)
    # each answer says what its request had cleared, as Anthropic's does (it edits each request
    # anew): the results the upstream got as placeholders, and their originals' tokens -- also on
    # the calls that went on under an earlier clearing; nothing before the first
    requests = upstream.turn_requests[-len(answers):]
    said = [[(e.type, e.cleared_tool_uses, e.cleared_input_tokens) for e in a.context_management.applied_edits]
            for a in answers]
    assert said == [_cleared_in(r.body) for r in requests]
    assert said[0] == [] and sum(1 for s in said if s) > len(nodes)
    assert said[-1][0][1] == sum(n["params"]["cleared_results"] for n in nodes)  # (the clearings add up)
    upstream.enqueue(Reply(kind="stream", content="streamed"))
    with httpx.stream("POST", f"{apis.url}/c/{cid}/v1/messages", headers={"x-api-key": key,
                      "anthropic-version": "2023-06-01", "anthropic-beta": BETA}, timeout=30, json={
            "model": "gpt-x", "max_tokens": 100, "stream": True, "context_management": edits,
            "messages": [{"role": "user", "content": "and now?"}]}) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    (delta,) = [e for e in events if e["type"] == "message_delta"]
    assert [(e["type"], e["cleared_tool_uses"], e["cleared_input_tokens"])
            for e in delta["context_management"]["applied_edits"]] == _cleared_in(upstream.last.body) != []
    assert nodes[0]["params"]["keep_tool_results"] == 1
    sent = upstream.last.body
    assert "context_management" not in sent
    tools = {m["tool_call_id"]: m["content"] for m in sent["messages"] if m["role"] == "tool"}
    assert list(tools) == [f"call_{i}" for i in range(5)]
    assert tools["call_0"] == output(0, 600)  # Plan's: excluded
    assert all(tools[f"call_{i}"].startswith(PLACEHOLDER_PREFIX) for i in (1, 2, 3))
    assert tools["call_4"] == output(4, 600)  # the one kept


def test_an_edit_below_its_trigger_clears_nothing_and_a_malformed_one_is_refused(apis, upstream, key, cid):
    c = anthropic.Anthropic(base_url=f"{apis.url}/c/{cid}", api_key=key, max_retries=0)
    answers = _messages_session(c, upstream, {"edits": [{"type": "clear_tool_uses_20250919"}]}, 3)  # default: 100,000
    assert clearing_nodes(apis.db, cid) == []
    assert all(a.context_management.applied_edits == [] for a in answers)
    assert all(not m["content"].startswith(PLACEHOLDER_PREFIX)
               for m in upstream.last.body["messages"] if m["role"] == "tool")
    for wrong in ("lots", 0):  # (a trigger of nothing would be no trigger)
        with pytest.raises(anthropic.BadRequestError) as bad:
            c.beta.messages.create(betas=[BETA], model="gpt-x", max_tokens=10, messages=[{"role": "user", "content": "x"}],
                                   context_management={"edits": [{"type": "clear_tool_uses_20250919",
                                                                  "trigger": {"type": "input_tokens", "value": wrong}}]})
        assert bad.value.body["error"]["type"] == "invalid_request_error"


def test_a_clearing_the_hard_threshold_then_summarised_is_still_said(fresh_database_url, upstream_url):
    """A request's edit that cleared old results, after which the request was still above the hard
    threshold and the path was summarised too: the answer says what the clearing did (the summary
    the call hangs under is not the clearing, which stays below it)."""
    import asyncio
    import uuid as uuid_

    from proxy.background import Background
    from proxy.call import Call, Started
    from proxy.compaction import Compactor, Edits
    from proxy.compaction.clearing import METHOD
    from proxy.compaction.policy import Thresholds
    from proxy.compaction.results import CompactionResult
    from proxy.dialects.messages import DIALECT as MESSAGES
    from proxy.metrics import Metrics
    from proxy.tokens import TokenCounter
    from storage import PathNode

    settings = make_settings(fresh_database_url, upstream_url, models=LIMITS)
    compactor = Compactor(tree=None, summariser=type("S", (), {"provider": lambda self, model: "fake"})(),  # type: ignore[arg-type]
                          thresholds=Thresholds(settings), tokens=TokenCounter(use_tiktoken=False), metrics=Metrics(),
                          tasks=Background(), lease_seconds=30)

    def node(kind="turn"):
        return PathNode(id=uuid_.uuid4(), parent_id=None, kind=kind, status="success",
                        sent=[{"role": "user", "content": output(1, 40_000)}], received=[{"role": "assistant", "content": "ok"}],
                        provider="fake")

    async def cleared(**_):
        return CompactionResult(True, node=node("compaction"), method=METHOD, cleared_results=2, freed_tokens=700)

    async def summarised(**_):
        return CompactionResult(True, node=node("compaction"))

    async def nothing_to_take(**_):
        return None

    compactor.clearer.clear = cleared  # type: ignore[method-assign]
    compactor.summaries.compact = summarised  # type: ignore[method-assign]
    compactor.jobs.take_over = nothing_to_take  # type: ignore[method-assign]
    call = Call(tenant="t", conversation_id="c", kind="turn", mode="delta", parent_mode="head", parent_id=None,
                body={"model": "claude-tiny", "max_tokens": 10, "messages": []}, items=[], stream=False, client_key=None,
                headers=[], dialect=MESSAGES, credentials=(), edits=Edits(trigger_tokens=100, keep=1))
    started = Started(call, "c", uuid_.uuid4(), uuid_.uuid4(), None, "delta", 0, [{"role": "user", "content": "q"}], ())
    path = asyncio.run(compactor.before_started(started, [node()]))
    assert path[0].kind == "compaction" and call.compaction is path[0]  # hung under the summary
    from proxy.dialects.messages.translate import APPLIED_EDITS as READ_BY_THE_DIALECT

    assert call.exchange_params()[READ_BY_THE_DIALECT] == [  # (the key the Messages dialect reads)
        {"type": "clear_tool_uses_20250919", "cleared_tool_uses": 2, "cleared_input_tokens": 700}]


@pytest.fixture
def reasoning_chat(fresh_database_url: str, upstream_url: str,
                   claude_server: tuple[FakeAnthropic, ServerThread]) -> Iterator[Proxy]:
    upstreams = three_upstreams(upstream_url, claude_server)
    upstreams[2]["accepts_reasoning"] = True  # (the chat upstream takes readable reasoning back)
    yield from proxy_with(fresh_database_url, upstream_url, models=LIMITS, upstreams=upstreams)


@pytest.mark.parametrize(("keep", "kept"), [({"type": "thinking_turns", "value": 1}, 1), (None, 1),
                                            ({"type": "thinking_turns", "value": 2}, 2), ("all", 3)])
def test_clear_thinking_is_carried_out_where_reasoning_goes_back(reasoning_chat, upstream, key, cid, keep, kept):
    """Anthropic's ``clear_thinking`` edit towards a chat upstream that takes reasoning back
    (``accepts_reasoning``): only the ``keep`` most recent assistant turns' reasoning goes back
    (Anthropic's default: 1; ``"all"``: every one) -- it went back whole, whatever the edit said."""
    c = anthropic.Anthropic(base_url=f"{reasoning_chat.url}/c/{cid}", api_key=key, max_retries=0)
    edit = {"type": "clear_thinking_20251015", **({} if keep is None else {"keep": keep})}
    for i in range(4):
        upstream.enqueue(Reply(content=f"answer {i}", reasoning=f"reasoning of turn {i}"))
        raw = c.beta.messages.with_raw_response.create(
            betas=[BETA], model="gpt-x", max_tokens=100, context_management={"edits": [edit]},
            thinking={"type": "enabled", "budget_tokens": 1024}, messages=[{"role": "user", "content": f"q {i}"}])
    sent = [m.get("reasoning_content") for m in upstream.last.body["messages"] if m["role"] == "assistant"]
    assert sent == [None] * (3 - kept) + [f"reasoning of turn {i}" for i in range(3 - kept, 3)]
    assert "context_management" not in upstream.last.body
    replay = reasoning_chat.http(key).get(f"/admin/nodes/{raw.headers['x-node-id']}/request")
    assert replay.headers["x-request-verified"] == "true" and replay.json() == upstream.last.body
    # without the edit, every turn's reasoning goes back, as before
    upstream.enqueue(Reply(content="answer 4"))
    c.messages.create(model="gpt-x", max_tokens=100, messages=[{"role": "user", "content": "q 4"}])
    assert [m.get("reasoning_content") for m in upstream.last.body["messages"] if m["role"] == "assistant"] == [
        f"reasoning of turn {i}" for i in range(4)]
