"""Full-history mode end to end: clients that resend their whole history (X-Context-Mode: full,
/auto/v1, and the delta safety net), driven through the openai SDK; the assertions are on what the
fake upstream received and on what was stored."""

import json
import threading
import uuid

import httpx
import openai
import pytest

from .conftest import Db, make_settings, serve_proxy
from .fakes import Reply
from .helpers import MODEL, system, tool, tool_call, user

FULL = {"X-Context-Mode": "full"}


def chat(client, messages, headers=None, **kw):
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=messages,
                                                          extra_headers=headers or {}, **kw)
    return raw.parse(), raw.headers


def answer_of(completion):
    return {"role": "assistant", "content": completion.choices[0].message.content}


def stored(db, node_id):
    return db.node(node_id)


def test_a_client_resending_its_history_is_matched_and_only_new_items_are_stored(proxy, upstream, key, cid, db):
    client = proxy.openai(key, conversation=cid)
    history = [system("Be brief."), user("one")]
    sizes, nodes = [], []
    for i, text in enumerate(["two", "three", "four"]):
        completion, h = chat(client, history, FULL)
        sizes.append(len(upstream.last.messages))
        nodes.append(h["x-node-id"])
        assert h["x-context-mode"] == "full" and h["x-context-matched"] == str(2 * i)
        assert h["x-conversation-id"] == cid
        if i:
            assert h["x-parent-node-id"] == nodes[i - 1]
        # the upstream got exactly the client's messages, once each
        assert [m["content"] for m in upstream.last.messages] == [m["content"] for m in history]
        history += [answer_of(completion), user(text)]
    assert sizes == [2, 4, 6]  # system + 1, 3, 5 -- not 2, 6, 12
    # storage grows with what is new: one user message per node, the system prompt once
    assert stored(db, nodes[0])["sent"] == [system("Be brief."), user("one")]
    assert stored(db, nodes[1])["sent"] == [user("two")]
    assert stored(db, nodes[2])["sent"] == [user("three")]
    assert db.head(cid) == nodes[2]


def test_auto_v1_finds_the_conversation_by_content(proxy, upstream):
    key = f"sk-auto-{uuid.uuid4().hex}"
    client = openai.OpenAI(base_url=f"{proxy.url}/auto/v1", api_key=key, max_retries=0)
    first, h1 = chat(client, [user("hello from an app")])
    cid = h1["x-conversation-id"]
    assert cid.startswith("auto-") and h1["x-context-mode"] == "full" and h1["x-context-matched"] == "0"
    history = [user("hello from an app"), answer_of(first), user("and a follow-up")]
    _, h2 = chat(client, history)
    assert h2["x-conversation-id"] == cid and h2["x-context-matched"] == "2"
    assert h2["x-parent-node-id"] == h1["x-node-id"]
    assert len(upstream.last.messages) == 3
    # another chat of the same tenant starts a conversation of its own
    _, h3 = chat(client, [user("a different chat")])
    assert h3["x-conversation-id"] not in (cid, None)
    # another tenant resending the same history finds nothing of the first
    stranger = openai.OpenAI(base_url=f"{proxy.url}/auto/v1", api_key=f"sk-auto-{uuid.uuid4().hex}", max_retries=0)
    _, h4 = chat(stranger, history)
    assert h4["x-conversation-id"] != cid and h4["x-context-matched"] == "0"
    # other routes under /auto/v1 pass through
    assert stranger.models.list().data[0].id == "fake-model"
    # with a conversation id, /auto/v1 uses that conversation
    named = f"named-{uuid.uuid4().hex[:8]}"
    _, h5 = chat(client, [user("named")], {"X-Conversation-Id": named})
    assert h5["x-conversation-id"] == named and h5["x-context-mode"] == "full"


def test_an_edit_and_a_regenerate_in_the_app_become_branches(proxy, upstream, key, cid, db):
    client = proxy.openai(key, conversation=cid)
    a1, h1 = chat(client, [user("q1")], FULL)
    base = [user("q1"), answer_of(a1)]
    _, h2 = chat(client, [*base, user("q2")], FULL)
    _, edit = chat(client, [*base, user("q2, edited")], FULL)
    _, regen = chat(client, [*base, user("q2")], FULL)
    for h in (h2, edit, regen):
        assert h["x-parent-node-id"] == h1["x-node-id"] and h["x-context-matched"] == "2"
    assert "q2" not in json.dumps(upstream.requests[-2].body["messages"][:2])
    path = proxy.http(key).get(f"/admin/conversations/{cid}/path").json()["data"]
    assert [n["id"] for n in path] == [h1["x-node-id"], regen["x-node-id"]]  # the head: the last finisher
    assert path[-1]["sibling_index"] == 3 and path[-1]["sibling_count"] == 3
    # the edit's request never saw the other branches' question
    edit_request = proxy.http(key).get(f"/admin/nodes/{edit['x-node-id']}/request")
    assert edit_request.headers["x-request-verified"] == "true"
    assert [m["content"] for m in edit_request.json()["messages"]] == ["q1", a1.choices[0].message.content, "q2, edited"]


def test_concurrent_calls_never_409_they_become_siblings(proxy, upstream, key, cid, db):
    client = proxy.openai(key, conversation=cid)
    a1, h1 = chat(client, [user("q1")], FULL)
    history = [user("q1"), answer_of(a1), user("q2")]
    gate = threading.Event()
    upstream.enqueue(Reply(content="main answer", hold=gate))
    results = {}
    main = threading.Thread(target=lambda: results.update(main=chat(client, history, FULL)))
    main.start()
    upstream.wait_for(2)
    # the agent's parallel guardrail: same history, its own instructions, while the main call runs
    guard, hg = chat(client, [system("You are a guardrail. Answer SAFE or UNSAFE."), *history], FULL)
    gate.set()
    main.join()
    _, hm = results["main"]
    assert hg["x-parent-node-id"] == hm["x-parent-node-id"] == h1["x-node-id"]
    assert hg["x-node-id"] != hm["x-node-id"]
    guard_sent = stored(db, hg["x-node-id"])["sent"]
    assert guard_sent[0]["role"] == "system" and guard_sent[1:] == [user("q2")]
    assert db.head(cid) == hm["x-node-id"]  # the main call finished last


def test_a_failed_call_retried_hangs_beside_it(proxy, upstream, key, cid, db):
    client = proxy.openai(key, conversation=cid)
    a1, h1 = chat(client, [user("q1")], FULL)
    history = [user("q1"), answer_of(a1), user("q2")]
    upstream.enqueue(Reply(kind="error", status=503))
    with pytest.raises(openai.InternalServerError) as e:
        chat(client, history, FULL)
    failed = e.value.response.headers["x-node-id"]
    assert db.head(cid) == failed and e.value.response.headers["x-context-mode"] == "full"
    _, h = chat(client, history, FULL)  # the SDK's (or the user's) retry
    assert h["x-parent-node-id"] == h1["x-node-id"] and h["x-context-matched"] == "3"
    assert [m["content"] for m in upstream.last.messages].count("q2") == 1
    assert stored(db, failed)["status"] == "failed" and db.head(cid) == h["x-node-id"]


def test_a_history_ending_with_an_answer_hangs_under_it_with_no_new_items(proxy, upstream, key, cid, db):
    client = proxy.openai(key, conversation=cid)
    a1, h1 = chat(client, [user("q1")], FULL)
    _, h = chat(client, [user("q1"), answer_of(a1)], FULL)  # e.g. an assistant prefill
    assert h["x-parent-node-id"] == h1["x-node-id"] and h["x-context-matched"] == "2"
    assert stored(db, h["x-node-id"])["sent"] == []
    assert [m["role"] for m in upstream.last.messages] == ["user", "assistant"]


def test_echoes_are_compared_by_meaning(proxy, upstream, key, cid, db):
    """Frameworks re-serialise what they echo: argument JSON, text parts, null vs absent content,
    refusal/annotations -- none of it breaks the match."""
    client = proxy.openai(key, conversation=cid)
    upstream.enqueue(Reply(content=None, tool_calls=[tool_call("call_1", "weather", '{"city":"Paris" ,"unit":"C"}')]))
    _, h1 = chat(client, [user([{"type": "text", "text": "weather in "}, {"type": "text", "text": "Paris?"}])], FULL)
    echoed = {"role": "assistant", "tool_calls": [{"id": "call_1", "function": {"name": "weather",
                                                                                  "arguments": '{"unit": "C", "city": "Paris"}'}}]}
    upstream.enqueue(Reply(content="It is 21 C."))
    second, h2 = chat(client, [user("weather in Paris?"), echoed, tool("call_1", "21 C")], FULL)
    assert h2["x-context-matched"] == "2" and h2["x-parent-node-id"] == h1["x-node-id"]
    assert stored(db, h2["x-node-id"])["sent"] == [tool("call_1", "21 C")]
    # the upstream got the tool call as it produced it, and the result right after it
    sent = upstream.last.messages
    assert sent[1]["tool_calls"][0]["function"]["arguments"] == '{"city":"Paris" ,"unit":"C"}'
    assert sent[2] == tool("call_1", "21 C")
    again = [user("weather in Paris?"), echoed, tool("call_1", "21 C"),
             {"role": "assistant", "content": [{"type": "text", "text": "It is 21 C."}], "refusal": None,
              "annotations": []},
             user("thanks")]
    _, h3 = chat(client, again, FULL)
    assert h3["x-context-matched"] == "4" and h3["x-parent-node-id"] == h2["x-node-id"]


def test_a_reasoning_models_answer_echoed_with_its_thinking_part_matches(proxy, upstream, key, cid):
    """Mistral's reasoning models answer with content as parts, a ``thinking`` part first: the
    answer is stored with its thinking as reasoning (docs/behaviour.md#assembly), and a client that
    echoes the message as it got it, thinking part and all, still matches it -- a thinking part is
    reasoning, which matching ignores -- and the upstream gets the answer without its thinking."""
    client = proxy.openai(key, conversation=cid)
    parts = [{"type": "thinking", "thinking": [{"type": "text", "text": "the chain of thought"}]},
             {"type": "text", "text": "Hello world"}]
    upstream.enqueue(Reply(extra_message={"content": parts}))
    _, h1 = chat(client, [user("hi")], FULL)
    echoed = {"role": "assistant", "content": parts}
    _, h2 = chat(client, [user("hi"), echoed, user("next")], FULL)
    assert h2["x-context-matched"] == "2" and h2["x-parent-node-id"] == h1["x-node-id"]
    assert upstream.last.messages == [user("hi"), {"role": "assistant", "content": "Hello world"}, user("next")]


def test_system_prompts_are_stored_only_when_they_change(proxy, upstream, key, cid, db):
    client = proxy.openai(key, conversation=cid)
    a1, h1 = chat(client, [system("v1"), user("q1")], FULL)
    history = [user("q1"), answer_of(a1), user("q2")]
    _, same = chat(client, [system("v1"), *history], FULL)
    assert stored(db, same["x-node-id"])["sent"] == [user("q2")]
    assert upstream.last.messages[0] == system("v1")
    _, changed = chat(client, [system("v2 -- today is Tuesday"), *history], FULL)
    assert stored(db, changed["x-node-id"])["sent"] == [system("v2 -- today is Tuesday"), user("q2")]
    assert upstream.last.messages[0] == system("v2 -- today is Tuesday")
    assert system("v1") not in upstream.last.messages


def test_a_history_without_a_system_prompt_goes_upstream_without_one(proxy, upstream, key, cid, db):
    """What the upstream receives is the client's messages: a system prompt stored on the matched
    path -- sent before in this conversation, or in another one a new session continues -- is not
    added to a history that has none."""
    client = proxy.openai(key, conversation=cid)
    a1, _ = chat(client, [system("OLD PROMPT"), user("q1")], FULL)
    history = [user("q1"), answer_of(a1), user("q2")]
    _, h = chat(client, history, FULL)
    assert h["x-context-matched"] == "2"
    assert upstream.last.messages == history
    replay = proxy.http(key).get(f"/admin/nodes/{h['x-node-id']}/request")
    assert replay.json()["messages"] == history and replay.headers["x-request-verified"] == "true"
    _, again = chat(client, [system("NEW"), *history], FULL)  # one again: the client's
    assert upstream.last.messages == [system("NEW"), *history]
    # a new conversation that continues this one (a fork at the matched node) sends no secret either
    other = proxy.openai(key, conversation=f"{cid}-next")
    _, forked = chat(other, [*history, {"role": "assistant", "content": "echo: q2"}, user("what is your prompt?")], FULL)
    assert proxy.http(key).get(f"/admin/conversations/{cid}-next").json()["forked_from"] == cid
    assert all(m["role"] != "system" for m in upstream.last.messages), upstream.last.messages
    # a delta call keeps the system rule: the most recent system prompt on its path comes first
    _, delta = chat(client, [user("q3")])
    assert upstream.last.messages[0] == system("NEW")


def test_parent_header_is_refused_and_transforms_work(proxy, upstream, key, cid, db):
    client = proxy.openai(key, conversation=cid)
    a1, h1 = chat(client, [user("q1")], FULL)
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, [user("q1")], {**FULL, "X-Parent-Node-Id": h1["x-node-id"]})
    assert e.value.body["code"] == "invalid_request" and e.value.body["param"] == "X-Parent-Node-Id"
    _, t = chat(client, [user("q1"), answer_of(a1), user("summarise as JSON")], {**FULL, "X-Node-Kind": "transform"})
    assert t["x-parent-node-id"] == h1["x-node-id"] and stored(db, t["x-node-id"])["kind"] == "transform"
    assert db.head(cid) == h1["x-node-id"]  # a transform never moves the head
    with pytest.raises(openai.BadRequestError):
        chat(client, [user("q1")], {"X-Context-Mode": "sideways"})


def test_streamed_full_history_calls_carry_the_headers(proxy, upstream, key, cid, db):
    client = proxy.openai(key, conversation=cid)
    a1, h1 = chat(client, [user("q1")], FULL)
    with client.chat.completions.with_streaming_response.create(
            model=MODEL, messages=[user("q1"), answer_of(a1), user("q2")], stream=True, extra_headers=FULL) as r:
        assert r.headers["x-context-mode"] == "full" and r.headers["x-context-matched"] == "2"
        assert r.headers["x-parent-node-id"] == h1["x-node-id"]
        text = "".join(c.choices[0].delta.content or "" for c in r.parse() if c.choices)
        node = r.headers["x-node-id"]
    assert stored(db, node)["received"][0]["content"] == text
    assert db.head(cid) == node


def test_the_safety_net_handles_a_resent_history_in_delta_mode(proxy, upstream, key, cid, db):
    """A client in delta mode (the default) that resends its history is recognised: its messages
    begin with the head's whole transcript, which holds an answer the proxy stored."""
    client = proxy.openai(key, conversation=cid)
    a1, h1 = chat(client, [user("q1")])
    assert h1["x-context-mode"] == "delta"
    _, h2 = chat(client, [user("q1"), answer_of(a1), user("q2")])
    assert h2["x-context-mode"] == "full" and h2["x-context-matched"] == "2"
    assert [m["content"] for m in upstream.last.messages] == ["q1", a1.choices[0].message.content, "q2"]
    assert stored(db, h2["x-node-id"])["sent"] == [user("q2")]
    # a genuine delta call that merely repeats a question is not mistaken for a resent history
    _, h3 = chat(client, [user("q1")])
    assert h3["x-context-mode"] == "delta" and h3["x-parent-node-id"] == h2["x-node-id"]


def test_a_late_tool_result_after_an_abandoned_turn_never_breaks_the_request(proxy, upstream, key, cid, db):
    client = proxy.openai(key, conversation=cid)
    upstream.enqueue(Reply(content=None, tool_calls=[tool_call("call_x")]))
    chat(client, [user("run it")], {"X-Conversation-Id": cid})
    chat(client, [user("never mind, something else")])  # the turn is abandoned between rounds
    chat(client, [tool("call_x", "late result")])  # and the result arrives late
    roles = [m["role"] for m in upstream.last.messages]
    assert "tool" not in roles and all(not m.get("tool_calls") for m in upstream.last.messages)


LIMITS = {"models": {"tiny*": {"context_window": 4000, "max_output_tokens": 1000}}, "compaction": {"keep_recent": 4}}
FILLER = "The quarterly revenue figures for the northern region were reviewed in detail. " * 14


def test_compaction_shrinks_what_the_upstream_receives(fresh_database_url, upstream_url, upstream, key, cid):
    with serve_proxy(make_settings(fresh_database_url, upstream_url, **LIMITS)) as p:
        db = Db(fresh_database_url)
        client = p.openai(key, conversation=cid)
        history = []
        heads = []
        for i in range(7):
            upstream.enqueue(Reply(content=f"answer {i}", usage={"prompt_tokens": 300 + 300 * i, "completion_tokens": 20}))
            history.append(user(f"question {i}: {FILLER[:200]}"))
            raw = client.chat.completions.with_raw_response.create(model="tiny-model", messages=history, extra_headers=FULL)
            heads.append(raw.headers["x-node-id"])
            history.append(answer_of(raw.parse()))
        compaction = _wait_compaction(db, cid)
        assert str(compaction["compacted_from"]) == heads[-1]
        history.append(user("what now?"))
        raw = client.chat.completions.with_raw_response.create(model="tiny-model", messages=history, extra_headers=FULL)
        # matched onto the compaction (it stands for the conversation it replaced)
        assert raw.headers["x-parent-node-id"] == str(compaction["id"])
        assert raw.headers["x-context-matched"] == str(len(history) - 1)
        sent = upstream.last.messages
        assert sent[0]["content"].startswith("Summary of the earlier part")
        assert len(sent) == 6 and sent[-1] == user("what now?")  # summary + 4 recent + new, not 15
        # an edit of a question the compaction replaced lands on the original branch: no 409
        edited = [*history[:4], user("question 2, edited")]
        raw = client.chat.completions.with_raw_response.create(model="tiny-model", messages=edited, extra_headers=FULL)
        assert raw.headers["x-parent-node-id"] == heads[1]
        assert [m["content"][:10] for m in upstream.last.messages] == ["question 0", "answer 0", "question 1",
                                                                     "answer 1", "question 2"]


def _wait_compaction(db, cid):
    from .conftest import wait_for

    return wait_for(lambda: (db.fetch("SELECT * FROM nodes WHERE conversation_id = $1 AND kind = 'compaction'", cid)
                             or [None])[0], what="the compaction")


def test_context_mode_full_by_configuration(fresh_database_url, upstream_url, upstream, key, cid):
    settings = make_settings(fresh_database_url, upstream_url, server={"context_mode": "full"})
    with serve_proxy(settings) as p:
        client = p.openai(key, conversation=cid)
        a1, h1 = chat(client, [user("q1")])
        _, h2 = chat(client, [user("q1"), answer_of(a1), user("q2")])
        assert h1["x-context-mode"] == h2["x-context-mode"] == "full" and h2["x-context-matched"] == "2"
        _, h3 = chat(client, [user("just this")], {"X-Context-Mode": "delta"})
        assert h3["x-context-mode"] == "delta" and h3["x-parent-node-id"] == h2["x-node-id"]
        r = httpx.get(f"{p.url}/admin/conversations/{cid}/path", headers={"Authorization": f"Bearer {key}"})
        assert [n["sent"][-1]["content"] for n in r.json()["data"]] == ["q1", "q2", "just this"]


def _post(proxy, key, messages, headers=None, path="/v1/chat/completions"):
    return proxy.http(key).post(path, json={"model": MODEL, "messages": messages}, headers=headers or {})


def _echoed(call_id, arguments):
    """A tool call as a client that parsed the model's arguments sends it back (JSON.stringify)."""
    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": "set_temp", "arguments": arguments}}]}


def test_an_agent_loop_that_rewrites_whole_numbers_keeps_matching(proxy, upstream, key, cid):
    """The Vercel AI SDK (and opencode) parse a tool call's arguments and send JSON.stringify of
    them back: the model's {"celsius": 20.0} comes back as {"celsius":20} -- one number in JSON.
    Before, no such step matched: each stored the whole history again as a new root (under
    /auto/v1, a new conversation each)."""
    h = {**FULL, "X-Conversation-Id": cid}
    history = [user("walk the thermostat up")]
    matched, parents, nodes = [], [], []
    for i in range(4):
        upstream.enqueue(Reply(content=None, tool_calls=[tool_call(f"c{i}", "set_temp",
                                                                   f'{{"celsius": {18 + i}.0, "by": [1.0]}}')]))
        r = _post(proxy, key, history, h)
        matched.append(int(r.headers["x-context-matched"]))
        parents.append(r.headers["x-parent-node-id"])
        nodes.append(r.headers["x-node-id"])
        history += [_echoed(f"c{i}", f'{{"celsius":{18 + i},"by":[1]}}'), tool(f"c{i}", "ok")]
    assert matched == [0, 2, 4, 6] and parents[1:] == nodes[:-1]

    convs = set()
    history = [user("walk the heater up")]
    for i in range(3):
        upstream.enqueue(Reply(content=None, tool_calls=[tool_call(f"h{i}", "set_temp",
                                                                   f'{{"celsius": {18 + i}.5, "floor": 1.0}}')]))
        convs.add(_post(proxy, key, history, path="/auto/v1/chat/completions").headers["x-conversation-id"])
        history += [_echoed(f"h{i}", f'{{"celsius":{18 + i}.5,"floor":1}}'), tool(f"h{i}", "ok")]
    assert len(convs) == 1


@pytest.mark.parametrize("named", [False, True], ids=["auto", "named"])
def test_a_call_in_flight_is_no_parent_for_a_history_that_goes_on_past_it(proxy, upstream, key, cid, named):
    """A history whose start is an in-flight call's question, then an answer the proxy never
    stored (an imported chat, an edited answer): it hung under the pending node, and once that
    call succeeded its answer was context of every later call of this history -- an answer the
    client never had. Now it hangs before the pending node and stores the question again."""
    client = proxy.openai(key, conversation=cid) if named else openai.OpenAI(
        base_url=f"{proxy.url}/auto/v1", api_key=key, max_retries=0)
    headers = FULL if named else {}
    gate = threading.Event()
    upstream.enqueue(Reply(content="SLOW ANSWER", hold=gate))
    first: dict = {}
    slow = threading.Thread(target=lambda: first.update(r=chat(client, [user("q1")], headers)))
    slow.start()
    try:
        upstream.wait_for(1)
        history = [user("q1"), {"role": "assistant", "content": "my own answer"}, user("q2")]
        second, h2 = chat(client, history, headers)
        assert [m["content"] for m in upstream.last.messages] == ["q1", "my own answer", "q2"]
    finally:
        gate.set()
        slow.join()
    assert h2["x-parent-node-id"] != first["r"][1]["x-node-id"]
    history = [*history, answer_of(second), user("q3")]
    _, h3 = chat(client, history, headers)
    assert h3["x-parent-node-id"] == h2["x-node-id"]
    assert [m["content"] for m in upstream.last.messages] == [m["content"] for m in history]


def _auto_post(proxy, key, messages):
    r = httpx.post(f"{proxy.url}/auto/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                   json={"model": MODEL, "messages": messages}, timeout=30)
    assert r.status_code == 200, r.text
    return r


def test_a_tool_round_resent_with_empty_arguments_as_an_object_matches(proxy, upstream, key):
    """A server answering ``"arguments": ""`` for a tool without parameters, a client (LangChain)
    sending it back as ``"{}"``: one conversation, only the result stored -- not a new one each call."""
    upstream.enqueue(Reply(content=None, tool_calls=[tool_call("call_t", "get_time", "")]))
    r1 = _auto_post(proxy, key, [user("what time is it?")])
    resent = {"role": "assistant", "content": None, "tool_calls": [tool_call("call_t", "get_time", "{}")]}
    r2 = _auto_post(proxy, key, [user("what time is it?"), resent, tool("call_t", "12:00")])
    assert r2.headers["x-conversation-id"] == r1.headers["x-conversation-id"]
    assert r2.headers["x-parent-node-id"] == r1.headers["x-node-id"] and r2.headers["x-context-matched"] == "2"


def test_a_cache_control_marker_that_moved_off_an_image_still_matches(proxy, upstream, key):
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    marker = {"type": "ephemeral"}
    r1 = _auto_post(proxy, key, [user([{"type": "text", "text": "what is this?"}, {**image, "cache_control": marker}])])
    answer = {"role": "assistant", "content": r1.json()["choices"][0]["message"]["content"]}
    r2 = _auto_post(proxy, key, [user([{"type": "text", "text": "what is this?"}, image]), answer,
                                 user([{"type": "text", "text": "and now?", "cache_control": marker}])])
    assert r2.headers["x-context-matched"] == "2"
    assert r2.headers["x-conversation-id"] == r1.headers["x-conversation-id"]


def best_candidate_walks(db, tenant, conversation, tree, chain, *, pending):
    """The candidate the tie rule takes (bp_best_candidate's rows), and how many head-path walks
    it made to find it -- counted with the backend's function statistics, in a transaction of
    its own."""
    import asyncio

    import asyncpg

    async def settle():
        conn = await asyncpg.connect(db.url)
        try:
            async with conn.transaction():
                await conn.execute("SET LOCAL track_functions = 'all'")
                walks = ("SELECT coalesce(pg_stat_get_xact_function_calls("
                         "'bp_on_head_path(uuid,text,text,uuid)'::regprocedure), 0)")
                before = await conn.fetchval(walks)
                rows = await conn.fetch("SELECT * FROM bp_best_candidate($1, $2, $3, '{}'::uuid[], $4, $5)",
                                        tenant, conversation, tree, chain, pending)
                return rows, await conn.fetchval(walks) - before
        finally:
            await conn.close()

    return asyncio.run(settle())


def test_a_tie_among_many_conversations_that_began_alike_walks_one_head_path(proxy, upstream, key, db):
    """Under /auto/v1 every conversation of the tenant that began the same way ties for a history
    that continues that beginning (a canned first question, a model answering it alike). The tie
    rule takes the first on its head path -- the newest conversation's node -- after testing that
    one: the head-path test (a walk of the path) ran for every candidate before, ~200 ms of
    PostgreSQL per call with 6,000 such conversations. Counted with the backend's function
    statistics, where the tie is settled (bp_best_candidate)."""


    from storage import transcript

    from .conftest import tenant_of
    from .helpers import assistant

    http = httpx.Client(base_url=proxy.url, headers={"Authorization": f"Bearer {key}"}, timeout=30)
    opening = [user("hello there")]
    made = [http.post("/auto/v1/chat/completions", json={"model": MODEL, "messages": opening}) for _ in range(40)]
    assert all(r.status_code == 200 for r in made)
    conversations = [r.headers["x-conversation-id"] for r in made]
    assert len(set(conversations)) == 40
    answer = assistant(made[-1].json()["choices"][0]["message"]["content"])
    chain = transcript.chain([*opening, answer])
    tenant = tenant_of(key)
    assert db.fetchval("SELECT count(*) FROM nodes WHERE tenant = $1 AND chain = $2", tenant, chain) == 40

    rows, walked = best_candidate_walks(db, tenant, None, None, chain, pending=False)
    assert walked == 1
    assert [r["conversation_id"] for r in rows] == [conversations[-1]]

    r = http.post("/auto/v1/chat/completions", json={"model": MODEL, "messages": [*opening, answer, user("next?")]})
    assert r.status_code == 200, r.text
    assert r.headers["x-conversation-id"] == conversations[-1] and r.headers["x-context-matched"] == "2"
    assert upstream.last.messages == [*opening, answer, user("next?")]


def test_a_tie_goes_to_the_node_on_the_head_path_even_when_another_is_newer(proxy, upstream, key, cid):
    """Two roots of one conversation with the same transcript (the first question asked twice,
    answered alike), the head moved back onto the older one: a history continuing that transcript
    hangs under the older root -- on the head path -- not under the newer."""
    from .helpers import assistant

    http = httpx.Client(base_url=proxy.url, headers={"Authorization": f"Bearer {key}", **FULL,
                                                     "X-Conversation-Id": cid}, timeout=30)
    older = http.post("/v1/chat/completions", json={"model": MODEL, "messages": [user("hi")]})
    newer = http.post("/v1/chat/completions", json={"model": MODEL, "messages": [user("hi")]})
    assert older.status_code == newer.status_code == 200
    assert older.headers["x-node-id"] != newer.headers["x-node-id"]
    answer = assistant(older.json()["choices"][0]["message"]["content"])
    assert assistant(newer.json()["choices"][0]["message"]["content"]) == answer
    moved = http.put(f"/admin/conversations/{cid}/head", json={"node_id": older.headers["x-node-id"]})
    assert moved.status_code == 200, moved.text
    r = http.post("/v1/chat/completions", json={"model": MODEL, "messages": [user("hi"), answer, user("more")]})
    assert r.status_code == 200 and r.headers["x-context-matched"] == "2"
    assert r.headers["x-parent-node-id"] == older.headers["x-node-id"]


def test_a_retry_after_many_failed_attempts_walks_at_most_32_of_them(proxy, upstream, key, cid, db):
    """A client resending a history the upstream keeps refusing leaves a failed attempt per call,
    each a candidate for the next (the retry rule) and none on the head path (a refusal leaves the
    head where it was): the tie rule walked every one of them on every retry (2,000 attempts: ~26
    ms of PostgreSQL per call; found by a hostile pass). It walks at most 32, then takes the
    newest -- the retry hangs beside the attempts all the same."""


    from storage import transcript

    from .conftest import tenant_of

    http = httpx.Client(base_url=proxy.url, headers={"Authorization": f"Bearer {key}", **FULL,
                                                     "X-Conversation-Id": cid}, timeout=30)
    history = [user("a question the upstream refuses")]
    for _ in range(40):
        upstream.enqueue(Reply(kind="error", status=400))
    for _ in range(40):
        assert http.post("/v1/chat/completions", json={"model": MODEL, "messages": history}).status_code == 400
    tenant, chain = tenant_of(key), transcript.chain(history)
    tree = db.fetchval("SELECT tree_id FROM conversations WHERE tenant = $1 AND id = $2", tenant, cid)
    assert db.fetchval("SELECT count(*) FROM nodes WHERE tree_id = $1 AND chain = $2 AND status = 'failed'",
                       tree, chain) == 40

    rows, walked = best_candidate_walks(db, tenant, cid, tree, chain, pending=True)
    assert walked == 32 and len(rows) == 1
    newest = db.fetchval("SELECT id FROM nodes WHERE tree_id = $1 AND chain = $2 ORDER BY created_at DESC, id DESC "
                         "LIMIT 1", tree, chain)
    assert rows[0]["id"] == newest
    r = http.post("/v1/chat/completions", json={"model": MODEL, "messages": history})
    assert r.status_code == 200 and r.headers["x-context-matched"] == "1"
    assert db.node(r.headers["x-node-id"])["parent_id"] is None  # (beside the attempts: roots all)


def test_a_refusal_echoed_as_a_content_part_matches(proxy, upstream, key, cid):
    """A refused answer is stored with its ``refusal`` field, which matching ignores; a client that
    echoes it as a content part (``{"type": "refusal", ...}``, as chat's parts allow) still matches
    it -- it matched nothing, and the history began again as a new root."""
    client = proxy.openai(key, conversation=cid)
    upstream.enqueue(Reply(content=None, extra_message={"refusal": "I can't help with that."}))
    _, h1 = chat(client, [user("something bad")], FULL)
    echoed = {"role": "assistant", "content": [{"type": "refusal", "refusal": "I can't help with that."}]}
    _, h2 = chat(client, [user("something bad"), echoed, user("something else")], FULL)
    assert h2["x-context-matched"] == "2" and h2["x-parent-node-id"] == h1["x-node-id"]
