"""The delta-mode safety net (docs/behaviour.md#delta-mode): a delta client never resends the
model's answers, so a delta call holding an answer stored in its conversation's tree resends its
history and is handled in full-history mode -- also when an app's side call (a title request) has
moved the head, so its messages no longer begin with the head path's transcript. Driven through
the HTTP API with the openai SDK, the way opencode talks to /c/<id>/v1 without X-Context-Mode."""

import json

import asyncpg

from storage import latest_version, migrate
from storage.transcript import digest

from .conftest import new_database, run
from .fakes import Reply
from .helpers import MODEL, system, tool, tool_call, user

DELTA = {"X-Context-Mode": "delta"}
AGENT = system("You are opencode, an interactive CLI coding agent.")
TITLE = system("You are a title generator. Output only a short title for the conversation.")


def chat(client, messages, headers=None):
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=messages,
                                                          extra_headers=headers or {})
    return raw.parse(), raw.headers


def answer_of(completion):
    return {"role": "assistant", "content": completion.choices[0].message.content}


def contents(messages):
    return [(m["role"], m.get("content")) for m in messages]


def test_an_agent_resending_its_history_after_a_title_call_is_matched_in_full(proxy, upstream, key, cid, db):
    client = proxy.openai(key, conversation=cid)
    prompt = user("Fix the off-by-one error in parser.py")
    # the app's side call first: its own system prompt, the user's first message quoted inside
    upstream.enqueue(Reply(content="Fixing parser.py"), Reply(content="Found it: line 42."),
                     Reply(content="Tests pass now."), Reply(content="Done."))
    _, ht = chat(client, [TITLE, user(f"Generate a title for: {prompt['content']}")])
    assert ht["x-context-mode"] == "delta"
    # the agent's first call: one question, indistinguishable from a delta follow-up -- it hangs
    # under the title node (the head) in delta mode
    a1, h1 = chat(client, [AGENT, prompt])
    assert h1["x-context-mode"] == "delta" and h1["x-parent-node-id"] == ht["x-node-id"]
    # its second turn resends everything: the answer it holds is stored (not on the head path's
    # transcript's start: that begins with the title request) -- full-history mode
    q2 = user("Now run the tests")
    history = [AGENT, prompt, answer_of(a1), q2]
    a2, h2 = chat(client, history)
    assert h2["x-context-mode"] == "full"
    assert contents(upstream.last.messages) == contents(history)  # each message once
    assert db.node(h2["x-node-id"])["parent_id"] is None  # no stored transcript begins it: a new root
    assert db.node(h2["x-node-id"])["sent"] == history
    assert db.head(cid) == h2["x-node-id"]
    # the third turn matches the second: the upstream gets the history once, the node the new item
    q3 = user("Commit it")
    history += [answer_of(a2), q3]
    _, h3 = chat(client, history)
    assert h3["x-context-mode"] == "full" and h3["x-context-matched"] == "4"
    assert h3["x-parent-node-id"] == h2["x-node-id"]
    assert contents(upstream.last.messages) == contents(history)
    assert db.node(h3["x-node-id"])["sent"] == [q3]
    assert db.head(cid) == h3["x-node-id"]
    # every request the upstream got held each of its messages once
    for request in upstream.chat_requests:
        seen = contents(request.messages)
        assert len(seen) == len(set(seen)), seen


def test_a_resent_history_after_a_side_call_over_the_head_path(proxy, upstream, key, cid, db):
    """The agent's history already on the head path, then a side call moves the head: the next
    resend still finds its deepest match, under the agent's node, and stores only the new item."""
    client = proxy.openai(key, conversation=cid)
    upstream.enqueue(Reply(content="first answer"), Reply(content="A title"), Reply(content="second answer"))
    a1, h1 = chat(client, [AGENT, user("q1")])
    _, ht = chat(client, [TITLE, user("Generate a title for: q1")])
    assert ht["x-parent-node-id"] == h1["x-node-id"]  # (a delta call: under the head)
    history = [AGENT, user("q1"), answer_of(a1), user("q2")]
    _, h2 = chat(client, history)
    assert h2["x-context-mode"] == "full" and h2["x-context-matched"] == "2"
    assert h2["x-parent-node-id"] == h1["x-node-id"]
    assert contents(upstream.last.messages) == contents(history)
    assert db.node(h2["x-node-id"])["sent"] == [user("q2")]


def test_a_plain_delta_conversation_stays_delta(proxy, upstream, key, cid, db):
    client = proxy.openai(key, conversation=cid)
    upstream.enqueue(Reply(content="a1"), Reply(content=None, tool_calls=[tool_call("call_1")]), Reply(content="a3"),
                     Reply(content="a4"))
    _, h1 = chat(client, [AGENT, user("q1")], DELTA)
    _, h2 = chat(client, [user("q2")], DELTA)
    _, h3 = chat(client, [tool("call_1", "result")], DELTA)
    # an assistant message the proxy never stored (a few-shot example) is not a resent history
    _, h4 = chat(client, [{"role": "assistant", "content": "an example answer"}, user("q4")], DELTA)
    for h, parent in ((h2, h1), (h3, h2), (h4, h3)):
        assert h["x-context-mode"] == "delta" and h["x-context-matched"] == "0"
        assert h["x-parent-node-id"] == parent["x-node-id"]
    assert [m.get("content") for m in upstream.last.messages if m["role"] != "system"] == [
        "q1", "a1", "q2", None, "result", "a3", "an example answer", "q4"]
    assert db.node(h4["x-node-id"])["sent"] == [{"role": "assistant", "content": "an example answer"},
                                                           user("q4")]
    assert db.head(cid) == h4["x-node-id"]


def test_a_call_that_says_where_its_items_go_is_never_taken_for_a_resent_history(proxy, upstream, key, cid):
    """The safety net is for a delta client that resends its history without saying so. A call
    that names its parent (X-Parent-Node-Id, previous_response_id), or sends new items by the
    Conversations API's word (conversation=), may send an earlier answer again -- an edit quoting
    it, an item_reference to it: it hangs where it said, with its context whole."""
    client = proxy.openai(key, conversation=cid)
    upstream.enqueue(Reply(content="a1"), Reply(content="a2"), Reply(content="a3"), Reply(content="a4"))
    c1, h1 = chat(client, [user("q1")], DELTA)
    _, h2 = chat(client, [user("q2")], DELTA)
    chat(client, [user("q3")], DELTA)
    _, h4 = chat(client, [answer_of(c1), user("q4 about that answer")], {**DELTA, "X-Parent-Node-Id": h2["x-node-id"]})
    assert (h4["x-context-mode"], h4["x-parent-node-id"]) == ("delta", h2["x-node-id"])
    assert [m["content"] for m in upstream.last.messages] == ["q1", "a1", "q2", "a2", "a1", "q4 about that answer"]

    bare = proxy.openai(key)
    conv = bare.conversations.create(items=[{"type": "message", "role": "user", "content": "seed"}])
    bare.responses.create(model=MODEL, conversation=conv.id, input="Q1")
    bare.responses.create(model=MODEL, conversation=conv.id, input="Q2")
    said = [i for i in bare.conversations.items.list(conv.id, order="asc").data if i.role == "assistant"][0]
    raw = bare.responses.with_raw_response.create(model=MODEL, conversation=conv.id, input=[
        {"type": "item_reference", "id": said.id}, {"type": "message", "role": "user", "content": "Q3 on it"}])
    assert raw.headers["x-context-mode"] == "delta"
    texts = [m["content"] for m in upstream.last.messages]
    assert texts[:5] == ["seed", "Q1", "echo: Q1", "Q2", "echo: Q2"] and texts[-2:] == ["echo: Q1", "Q3 on it"]
    first = bare.responses.create(model=MODEL, input="R1", extra_headers={"X-Conversation-Id": f"{cid}-r"})
    second = bare.responses.with_raw_response.create(model=MODEL, input="R2", previous_response_id=first.id)
    raw = bare.responses.with_raw_response.create(model=MODEL, previous_response_id=second.parse().id, input=[
        {"type": "item_reference", "id": first.output[0].id}, {"type": "message", "role": "user", "content": "R3"}])
    assert (raw.headers["x-parent-node-id"], raw.headers["x-context-mode"]) == (second.headers["x-node-id"], "delta")
    assert [m["content"] for m in upstream.last.messages][:4] == ["R1", "echo: R1", "R2", "echo: R2"]


def test_answers_are_indexed_by_their_digest(proxy, upstream, key, cid, db):
    client = proxy.openai(key, conversation=cid)
    upstream.enqueue(Reply(content="indexed"))
    a1, h1 = chat(client, [user("q")])
    assert bytes(db.node(h1["x-node-id"])["answer"]) == digest(answer_of(a1))


def test_the_migration_backfills_the_answers_of_existing_nodes(pg_server_url):
    from .test_schema import _migrate_to

    url = new_database(pg_server_url)
    tree = "00000000-0000-7000-8000-000000000001"
    answer = {"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "1"}]}

    async def check():
        conn = await asyncpg.connect(url)
        try:
            await _migrate_to(conn, 16)
            await conn.execute("INSERT INTO conversations (tenant, id, tree_id) VALUES ('t', 'c', $1)", tree)
            for n, (outcome, received) in enumerate((("success", [answer]), ("transient", None), ("success", []))):
                await conn.execute(
                    "INSERT INTO nodes (tree_id, id, tenant, conversation_id, kind, outcome, sent, received, depth, "
                    "chain) VALUES ($1, $2, 't', 'c', 'turn', $3, '[]', $4::jsonb, 0, '\\x00')",
                    tree, f"00000000-0000-7000-8000-0000000000a{n}", outcome,
                    None if received is None else json.dumps(received))
        finally:
            await conn.close()
        assert await migrate(url) == list(range(17, latest_version() + 1))
        conn = await asyncpg.connect(url)
        try:
            return {str(r["id"])[-1]: r["answer"] for r in await conn.fetch("SELECT id, answer FROM nodes")}
        finally:
            await conn.close()

    answers = run(check())
    assert answers == {"0": digest({"role": "assistant", "content": "a1"}), "1": None, "2": None}
