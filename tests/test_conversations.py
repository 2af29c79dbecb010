"""OpenAI's Conversations API on the tree, driven by the official openai SDK
(``client.conversations.*``, ``client.responses.create(conversation=...)``): conversation objects
that are Branchpoint conversations, ``items`` nodes (no upstream call), the head path's items in
OpenAI's list shape with stable ids, deleting an item as a new branch, tenancy -- asserted on the
tree and on what the fake upstream received."""

import re
import uuid

import openai
import pytest

from .conftest import new_key
from .fakes import Reply
from .helpers import MODEL


def user_item(text):
    return {"type": "message", "role": "user", "content": text}


def texts(items):
    """The text of each listed item (messages: their parts joined; others: their type)."""
    out = []
    for item in items:
        item = item if isinstance(item, dict) else item.model_dump()
        if item.get("type", "message" if "role" in item else None) == "message":
            content = item["content"]
            out.append(content if isinstance(content, str) else "".join(p.get("text") or "" for p in content))
        else:
            out.append(item["type"])
    return out


def upstream_texts(recorded):
    """What a chat upstream received, as texts."""
    return [m["content"] if isinstance(m["content"], str) else "".join(p["text"] for p in m["content"])
            for m in recorded.messages]


def test_a_conversation_is_a_branchpoint_conversation_with_an_items_node(proxy, upstream, key, db):
    client = proxy.openai(key)
    conv = client.conversations.create(items=[user_item("Remember: the code is 42.")], metadata={"topic": "codes"})
    assert re.fullmatch(r"conv_[0-9a-f]{32}", conv.id) and conv.object == "conversation"
    assert conv.metadata == {"topic": "codes"} and isinstance(conv.created_at, int)
    assert upstream.requests == []  # adding items calls no model
    head = db.head(conv.id)
    node = db.node(head)
    assert node["kind"] == "items" and node["status"] == "success" and node["outcome"] == "success"
    assert node["sent"] == [user_item("Remember: the code is 42.")] and node["received"] is None
    assert node["api"] == "responses" and node["parent_id"] is None
    # the same conversation everywhere: retrieve, the admin API, /c/{id}/v1
    again = client.conversations.retrieve(conv.id)
    assert (again.id, again.created_at, again.metadata) == (conv.id, conv.created_at, {"topic": "codes"})
    admin = proxy.http(key).get(f"/admin/conversations/{conv.id}").json()
    assert admin["id"] == conv.id and admin["head_node_id"] == head and admin["node_count"] == 1
    assert admin["metadata"] == {"topic": "codes"}
    tree = proxy.http(key).get(f"/admin/conversations/{conv.id}/tree").json()["data"]
    assert [n["kind"] for n in tree] == ["items"]
    chat = proxy.openai(key, conversation=conv.id)
    chat.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "What is the code?"}])
    assert upstream_texts(upstream.last) == ["Remember: the code is 42.", "What is the code?"]
    assert db.node(db.head(conv.id))["parent_id"] == node["id"]


def test_an_empty_conversation_and_its_metadata(proxy, key, db):
    client = proxy.openai(key)
    conv = client.conversations.create()
    assert conv.metadata == {} and db.head(conv.id) is None
    updated = client.conversations.update(conv.id, metadata={"a": "1", "b": "2"})
    assert updated.metadata == {"a": "1", "b": "2"}
    assert client.conversations.retrieve(conv.id).metadata == {"a": "1", "b": "2"}
    assert client.conversations.items.list(conv.id).data == []
    with pytest.raises(openai.BadRequestError) as too_many:
        client.conversations.update(conv.id, metadata={f"k{i}": "v" for i in range(17)})
    assert too_many.value.body["param"] == "metadata"
    with pytest.raises(openai.BadRequestError):
        client.conversations.create(items=[user_item(str(i)) for i in range(21)])
    with pytest.raises(openai.BadRequestError):
        client.conversations.create(metadata={"k": "v" * 513})


def test_items_are_the_head_path_in_openais_list_shape_with_stable_ids(proxy, upstream, key):
    client = proxy.openai(key)
    conv = client.conversations.create(items=[user_item("one"), user_item("two")])
    added = client.conversations.items.create(conv.id, items=[user_item("three")])
    assert added.object == "list" and texts(added.data) == ["three"] and added.first_id == added.data[0].id
    upstream.enqueue(Reply(content="an answer"))
    client.responses.create(model=MODEL, conversation=conv.id, input="four")
    listing = client.conversations.items.list(conv.id, order="asc")
    assert texts(listing.data) == ["one", "two", "three", "four", "an answer"]
    assert listing.has_more is False and listing.first_id == listing.data[0].id and listing.last_id == listing.data[-1].id
    ids = [i.id for i in listing.data]
    assert len(set(ids)) == 5 and ids[2] == added.data[0].id
    # newest first by default; the same ids every time
    newest = client.conversations.items.list(conv.id)
    assert [i.id for i in newest.data] == ids[::-1]
    # pages: limit and after
    page = client.conversations.items.list(conv.id, order="asc", limit=2)
    assert [i.id for i in page.data] == ids[:2] and page.has_more is True
    rest = client.conversations.items.list(conv.id, order="asc", limit=2, after=page.last_id)
    assert [i.id for i in rest.data] == ids[2:4] and rest.has_more is True
    assert [i.id for i in client.conversations.items.list(conv.id, order="asc").data] == ids  # stable
    # the SDK's auto-pagination walks them all
    assert [i.id for i in client.conversations.items.list(conv.id, order="asc", limit=1)] == ids
    one = client.conversations.items.retrieve(ids[1], conversation_id=conv.id)
    assert one.id == ids[1] and texts([one]) == ["two"]
    with pytest.raises(openai.NotFoundError):
        client.conversations.items.retrieve("msg_nothing", conversation_id=conv.id)
    with pytest.raises(openai.BadRequestError):
        client.conversations.items.list(conv.id, limit=101)


def test_deleting_an_item_makes_a_new_branch_and_removes_nothing(proxy, upstream, key, db):
    client = proxy.openai(key)
    conv = client.conversations.create(items=[user_item("keep me"), user_item("drop me")])
    client.responses.create(model=MODEL, conversation=conv.id, input="first question")
    before = client.conversations.items.list(conv.id, order="asc").data
    assert texts(before) == ["keep me", "drop me", "first question", "echo: first question"]
    old_head = db.head(conv.id)
    answer = client.conversations.items.delete(before[1].id, conversation_id=conv.id)
    assert answer.id == conv.id and answer.object == "conversation"
    after = client.conversations.items.list(conv.id, order="asc").data
    assert texts(after) == ["keep me", "first question", "echo: first question"]
    assert [i.id for i in after] == [before[0].id, before[2].id, before[3].id]  # ids carried along
    new_head = db.head(conv.id)
    assert new_head != old_head
    # nothing removed: the old nodes are still there, a branch beside the new one
    tree = proxy.http(key).get(f"/admin/conversations/{conv.id}/tree").json()["data"]
    assert old_head in {n["id"] for n in tree} and len(tree) == 4
    roots = [n for n in tree if n["parent_id"] is None]
    assert len(roots) == 2 and all(n["kind"] == "items" for n in roots)
    # the next call's context leaves the deleted item out
    client.responses.create(model=MODEL, conversation=conv.id, input="second question")
    assert upstream_texts(upstream.last) == ["keep me", "first question", "echo: first question", "second question"]
    # the old branch is a branch: the head can go back to it
    proxy.http(key).put(f"/admin/conversations/{conv.id}/head", json={"node_id": old_head}).raise_for_status()
    assert "drop me" in texts(client.conversations.items.list(conv.id).data)


def test_an_id_given_twice_names_one_item_and_a_delete_removes_only_it(proxy, upstream, key):
    """Items added with ids that are taken (the same id twice, or an answer sent back with its id)
    are listed under ids of their own: each id names one item, to read and to delete."""
    client = proxy.openai(key)
    conv = client.conversations.create(items=[{**user_item("one"), "id": "msg_dup"}, {**user_item("two"), "id": "msg_dup"}])
    listed = client.conversations.items.list(conv.id, order="asc").data
    assert texts(listed) == ["one", "two"] and listed[0].id == "msg_dup" and listed[1].id != "msg_dup"
    answer = client.responses.create(model=MODEL, conversation=conv.id, input="q")
    sent_back = answer.output[-1].model_dump(exclude_none=True)
    added = client.conversations.items.create(conv.id, items=[sent_back, user_item("follow")]).data
    listed = client.conversations.items.list(conv.id, order="asc").data
    ids = [i.id for i in listed]
    assert texts(listed) == ["one", "two", "q", "echo: q", "echo: q", "follow"]
    assert len(set(ids)) == len(ids) and ids[3] == sent_back["id"]
    assert [i.id for i in added] == ids[4:]  # the answer to the add names them as the list does
    assert client.conversations.items.retrieve(ids[4], conversation_id=conv.id).id == ids[4]
    client.conversations.items.delete(sent_back["id"], conversation_id=conv.id)  # the answer itself, once
    assert texts(client.conversations.items.list(conv.id, order="asc").data) == ["one", "two", "q", "echo: q", "follow"]
    client.conversations.items.delete("msg_dup", conversation_id=conv.id)
    assert texts(client.conversations.items.list(conv.id, order="asc").data) == ["two", "q", "echo: q", "follow"]
    # the id a list gives an item is the id a reference names it by
    renamed = client.conversations.items.list(conv.id, order="asc").data[0]
    assert renamed.id != "msg_dup"
    client.responses.create(model=MODEL, conversation=conv.id, input=[{"type": "item_reference", "id": renamed.id}])
    assert upstream_texts(upstream.last)[-1] == "two"


def test_listed_tool_calls_and_their_outputs_are_completed(proxy, upstream, key):
    client = proxy.openai(key)
    conv = client.conversations.create()
    upstream.enqueue(Reply(content=None, tool_calls=[{"id": "call_7", "type": "function",
                                                      "function": {"name": "look", "arguments": "{}"}}]))
    client.responses.create(model=MODEL, conversation=conv.id, input="go",
                            tools=[{"type": "function", "name": "look", "parameters": {"type": "object"}}])
    client.conversations.items.create(conv.id, items=[{"type": "function_call_output", "call_id": "call_7",
                                                       "output": "seen"}])
    listed = [i.model_dump() for i in client.conversations.items.list(conv.id, order="asc").data]
    assert [(i["type"], i.get("status")) for i in listed] == [
        ("message", "completed"), ("function_call", "completed"), ("function_call_output", "completed")]


def test_deleting_a_conversation(proxy, key):
    client = proxy.openai(key)
    conv = client.conversations.create(items=[user_item("hello")])
    deleted = client.conversations.delete(conv.id)
    assert deleted.id == conv.id and deleted.deleted is True and deleted.object == "conversation.deleted"
    with pytest.raises(openai.NotFoundError) as gone:
        client.conversations.retrieve(conv.id)
    assert gone.value.body["code"] == "conversation_not_found"
    assert proxy.http(key).get(f"/admin/conversations/{conv.id}").status_code == 404


def test_another_tenants_conversation_is_not_found(proxy, upstream, key):
    mine = proxy.openai(key)
    conv = mine.conversations.create(items=[user_item("secret")])
    theirs = proxy.openai(new_key())
    for attempt in (lambda: theirs.conversations.retrieve(conv.id),
                    lambda: theirs.conversations.items.list(conv.id),
                    lambda: theirs.conversations.items.create(conv.id, items=[user_item("x")]),
                    lambda: theirs.conversations.update(conv.id, metadata={"a": "b"}),
                    lambda: theirs.conversations.delete(conv.id),
                    lambda: theirs.responses.create(model=MODEL, conversation=conv.id, input="hi")):
        with pytest.raises(openai.NotFoundError) as missing:
            attempt()
        assert missing.value.body["code"] == "conversation_not_found"
    assert upstream.requests == []
    assert texts(mine.conversations.items.list(conv.id).data) == ["secret"]  # untouched


def test_responses_with_a_conversation_over_a_chat_upstream(proxy, upstream, key, db):
    client = proxy.openai(key)
    conv = client.conversations.create(items=[user_item("My name is Ada.")])
    first = client.responses.with_raw_response.create(model=MODEL, conversation=conv.id, input="Hello")
    assert first.headers["x-conversation-id"] == conv.id
    assert upstream_texts(upstream.last) == ["My name is Ada.", "Hello"]
    assert "conversation" not in upstream.last.body  # ours: never sent upstream
    assert db.head(conv.id) == first.headers["x-node-id"]
    # {"id": ...} names it too, and continues from the head
    client.responses.create(model=MODEL, conversation={"id": conv.id}, input="Again")
    assert upstream_texts(upstream.last) == ["My name is Ada.", "Hello", "echo: Hello", "Again"]
    # any conversation of ours, not only conv_ ones
    named = f"plain-{uuid.uuid4().hex}"
    proxy.openai(key, conversation=named).responses.create(model=MODEL, input="first")
    client.responses.create(model=MODEL, conversation=named, input="second")
    assert upstream_texts(upstream.last) == ["first", "echo: first", "second"]
    # with previous_response_id as well: refused, as OpenAI does
    with pytest.raises(openai.BadRequestError) as both:
        client.responses.create(model=MODEL, conversation=conv.id, input="x",
                                previous_response_id="resp_" + uuid.UUID(first.headers["x-node-id"]).hex)
    assert both.value.body["code"] == "invalid_request" and both.value.body["param"] == "conversation"
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=MODEL, conversation="conv_" + "0" * 32, input="x")


def test_the_conversations_api_under_auto_v1(proxy, upstream, key, db):
    """/auto/v1 is the base URL the README gives the Agents SDK: its conversations are the tree's
    there too -- they went to the upstream (made there, its items never reaching a call here, and
    our ids sent out to be looked up; found by a hostile pass)."""
    import openai as sdk

    client = sdk.OpenAI(base_url=f"{proxy.url}/auto/v1", api_key=key, max_retries=0)
    conv = client.conversations.create(items=[user_item("My name is Ada.")], metadata={"from": "auto"})
    assert re.fullmatch(r"conv_[0-9a-f]{32}", conv.id) and upstream.requests == []
    assert client.conversations.retrieve(conv.id).metadata == {"from": "auto"}
    answer = client.responses.with_raw_response.create(model=MODEL, conversation=conv.id, input="Hello")
    assert answer.headers["x-conversation-id"] == conv.id
    assert upstream_texts(upstream.last) == ["My name is Ada.", "Hello"]
    assert texts(client.conversations.items.list(conv.id, order="asc").data) == ["My name is Ada.", "Hello", "echo: Hello"]
    assert client.conversations.delete(conv.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.conversations.retrieve(conv.id)
    assert all("/conversations" not in r.path for r in upstream.requests)


def test_responses_with_a_conversation_over_a_responses_upstream(native, upstream, key):
    client = native.openai(key)
    conv = client.conversations.create(items=[user_item("Context item.")])
    upstream.enqueue(Reply(content="native answer"))
    client.responses.create(model="native-1", conversation=conv.id, input="Question?")
    request = upstream.responses_requests[-1].body
    assert "conversation" not in request and request["store"] is False
    assert [i.get("content") for i in request["input"]] == ["Context item.", "Question?"]
    client.responses.create(model="native-1", conversation=conv.id, input="Next?")
    request = upstream.responses_requests[-1].body
    assert texts(request["input"]) == ["Context item.", "Question?", "native answer", "Next?"]
    assert texts(client.conversations.items.list(conv.id, order="asc").data) == [
        "Context item.", "Question?", "native answer", "Next?", "echo: Next?"]


def test_item_ids_over_a_responses_upstream_are_distinct_and_delete_one_item(native, upstream, key):
    """An answer's output items and its call's input items are items of one node: their ids must
    differ, or deleting the answer deletes its question (and a page after it starts at itself)."""
    client = native.openai(key)
    conv = client.conversations.create()
    for q in ("q0", "q1", "q2"):
        client.responses.create(model="native-1", conversation=conv.id, input=q)
    listing = client.conversations.items.list(conv.id, order="asc").data
    assert texts(listing) == ["q0", "echo: q0", "q1", "echo: q1", "q2", "echo: q2"]
    ids = [i.id for i in listing]
    assert len(set(ids)) == len(ids), ids
    assert texts([client.conversations.items.retrieve(ids[1], conversation_id=conv.id)]) == ["echo: q0"]
    after = client.conversations.items.list(conv.id, order="asc", limit=1, after=ids[1]).data
    assert [i.id for i in after] == [ids[2]]
    client.conversations.items.delete(ids[1], conversation_id=conv.id)  # the first answer only
    assert texts(client.conversations.items.list(conv.id, order="asc").data) == [
        "q0", "q1", "echo: q1", "q2", "echo: q2"]
    client.responses.create(model="native-1", conversation=conv.id, input="after")
    assert texts(upstream.responses_requests[-1].body["input"]) == ["q0", "q1", "echo: q1", "q2", "echo: q2", "after"]


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_a_response_made_in_a_conversation_names_it(proxy, native, upstream, key, api):
    """A response whose request named a conversation says so (``conversation: {"id"}``), as
    OpenAI's does -- answered, streamed (from response.created on) and read back; one whose request
    named none says null."""
    server, model = (proxy, MODEL) if api == "chat" else (native, "native-1")
    client = server.openai(key)
    conv = client.conversations.create()
    answered = client.responses.create(model=model, conversation=conv.id, input="one")
    assert answered.conversation.id == conv.id
    events = list(client.responses.create(model=model, conversation={"id": conv.id}, input="two", stream=True))
    named = [e.response.conversation for e in events if e.type in ("response.created", "response.completed")]
    assert [c.id for c in named] == [conv.id, conv.id]
    assert client.responses.retrieve(answered.id).conversation.id == conv.id
    alone = server.openai(key, conversation=f"plain-{uuid.uuid4().hex}").responses.create(model=model, input="x")
    assert alone.conversation is None
    nulled = server.openai(key, conversation=f"plain-{uuid.uuid4().hex}").responses.create(
        model=model, input="x", extra_body={"conversation": None})
    assert nulled.conversation is None


def test_conversations_under_a_prefix_and_raw_http_errors(proxy, key):
    http = proxy.http(key)
    made = http.post("/c/whatever/v1/conversations", json={"items": [user_item("hi")]})
    assert made.status_code == 200 and made.json()["id"].startswith("conv_")
    cid = made.json()["id"]
    assert http.get(f"/c/{cid}/v1/conversations/{cid}/items").json()["data"][0]["content"] == [
        {"type": "input_text", "text": "hi"}]
    assert http.post(f"/v1/conversations/{cid}/items", json={"items": []}).status_code == 400
    assert http.post(f"/v1/conversations/{cid}/items", json={"items": [42]}).status_code == 400
    assert http.post("/v1/conversations", content=b"not json").status_code == 400
    assert http.get(f"/v1/conversations/{cid}/items", params={"order": "sideways"}).status_code == 400


def test_items_nodes_export_import_and_keep_the_invariants(own_proxy, upstream, key):
    proxy = own_proxy  # (a database of its own: the invariants are checked over all of it)
    client = proxy.openai(key)
    conv = client.conversations.create(items=[user_item("alpha"), user_item("beta")])
    client.responses.create(model=MODEL, conversation=conv.id, input="gamma")
    client.conversations.items.create(conv.id, items=[user_item("delta")])
    listed = client.conversations.items.list(conv.id, order="asc").data
    client.conversations.items.delete(listed[1].id, conversation_id=conv.id)  # a branch of copies
    http = proxy.http(key)
    lines = http.get(f"/admin/conversations/{conv.id}/export").text
    assert sum('"kind":"items"' in line for line in lines.splitlines()) == 5  # 2 + 3 copies
    copy = f"copy-{uuid.uuid4().hex}"
    r = http.post(f"/admin/conversations/{copy}/import", content=lines.encode())
    assert r.status_code == 201, r.text
    mine = client.conversations.items.list(conv.id, order="asc").data
    theirs = client.conversations.items.list(copy, order="asc").data
    assert texts(theirs) == texts(mine) == ["alpha", "gamma", "echo: gamma", "delta"]
    assert [i.id for i in theirs if i.id.startswith("msg_") and i.type == "message"][0] == mine[0].id  # kept ids
    client.responses.create(model=MODEL, conversation=copy, input="epsilon")
    assert upstream_texts(upstream.last) == ["alpha", "gamma", "echo: gamma", "delta", "epsilon"]
    from .conftest import assert_invariants

    assert_invariants(proxy.db.url)


def test_a_full_history_client_matches_the_items_as_part_of_the_transcript(proxy, upstream, key):
    client = proxy.openai(key)
    conv = client.conversations.create(items=[user_item("from the items API")])
    client.responses.create(model=MODEL, conversation=conv.id, input="a question")
    head = proxy.db.head(conv.id)
    full = proxy.openai(key, conversation=conv.id, default_headers={"X-Context-Mode": "full"})
    raw = full.chat.completions.with_raw_response.create(model=MODEL, messages=[
        {"role": "user", "content": "from the items API"}, {"role": "user", "content": "a question"},
        {"role": "assistant", "content": "echo: a question"}, {"role": "user", "content": "next"}])
    assert raw.headers["x-parent-node-id"] == head  # the items and the turn matched: only "next" is new
    assert upstream_texts(upstream.last) == ["from the items API", "a question", "echo: a question", "next"]
    assert proxy.db.node(raw.headers["x-node-id"])["sent"] == [{"role": "user", "content": "next"}]


def test_items_cannot_be_added_while_a_turn_is_in_flight(proxy, upstream, key):
    import threading

    client = proxy.openai(key)
    conv = client.conversations.create()
    answer = threading.Event()
    upstream.enqueue(Reply(hold=answer))  # (in flight until the items have been refused)
    t = threading.Thread(target=lambda: client.responses.create(model=MODEL, conversation=conv.id, input="slow"))
    t.start()
    upstream.wait_for(1)
    try:
        with pytest.raises(openai.ConflictError) as busy:
            client.conversations.items.create(conv.id, items=[user_item("impatient")])
    finally:
        answer.set()
    t.join(20)
    assert busy.value.body["code"] == "conversation_busy"
    assert texts(client.conversations.items.list(conv.id, order="asc").data) == ["slow", "ok"]
    client.conversations.items.create(conv.id, items=[user_item("now")])  # the lease was released
    assert texts(client.conversations.items.list(conv.id, order="asc").data) == ["slow", "ok", "now"]


def test_the_agents_sdks_conversation_session_unmodified(proxy, upstream, key):
    """The Agents SDK's conversation-backed session (``OpenAIConversationsSession``) keeps its
    history in the Conversations API: here, on the tree -- and a Runner using it sends that history."""
    import asyncio

    from agents import Agent, OpenAIResponsesModel, Runner, set_tracing_disabled
    from agents.memory import OpenAIConversationsSession

    set_tracing_disabled(True)  # (nothing leaves the machine)

    async def scenario():
        client = proxy.async_openai(key)
        session = OpenAIConversationsSession(openai_client=client)
        agent = Agent(name="helper", instructions="Be brief.",
                      model=OpenAIResponsesModel(model=MODEL, openai_client=client))
        await Runner.run(agent, "first question", session=session)
        await Runner.run(agent, "second question", session=session)
        cid = await session._get_session_id()
        items = await session.get_items()
        popped = await session.pop_item()
        after = await session.get_items()
        await session.clear_session()
        await client.close()
        return cid, items, popped, after

    cid, items, popped, after = asyncio.run(scenario())
    assert re.fullmatch(r"conv_[0-9a-f]{32}", cid)
    assert texts(items) == ["first question", "echo: first question", "second question", "echo: second question"]
    # the second turn was sent the session's history (the model call itself names no conversation)
    sent = upstream.responses_requests[-1].body["input"]
    assert texts(sent) == ["first question", "echo: first question", "second question"]
    assert texts([popped]) == ["echo: second question"] and texts(after) == texts(items)[:3]
    with pytest.raises(openai.NotFoundError):  # cleared: the conversation is gone
        proxy.openai(key).conversations.retrieve(cid)


def test_a_conversation_session_under_auto_v1_holds_each_turn_once(proxy, upstream, key, db):
    """The Agents SDK for JS (``@openai/agents``, ``OpenAIConversationsSession``) with the base URL
    the README gives it, /auto/v1: each run lists the conversation's items, sends them with the new
    question to ``responses.create`` -- naming no conversation -- and adds the question and the
    answer through the items API. A call found by content must not land in the Conversations API's
    conversation (OpenAI's holds only what its items calls and the calls naming it put there):
    when it did, each turn after the first was in it twice, and the third run sent it twice."""
    auto = openai.OpenAI(base_url=f"{proxy.url}/auto/v1", api_key=key, max_retries=0)
    try:
        conv = auto.conversations.create()
        for question in ("first question", "second question", "third question"):
            listed = auto.conversations.items.list(conv.id, order="asc").data
            history = [{"role": i.role, "content": i.content[0].text}  # (the SDK resends them as messages)
                       for i in listed]
            new = {"role": "user", "content": question}
            raw = auto.responses.with_raw_response.create(model=MODEL, instructions="Be brief.",
                                                          input=[*history, new])
            answer = raw.parse()
            assert raw.headers["x-conversation-id"] != conv.id  # found by content: not the API's conversation
            auto.conversations.items.create(conv.id, items=[new, {
                "type": "message", "role": "assistant", "status": "completed",
                "content": [{"type": "output_text", "text": answer.output_text, "annotations": []}]}])
        listed = auto.conversations.items.list(conv.id, order="asc").data
    finally:
        auto.close()
    assert texts(listed) == ["first question", "echo: first question", "second question", "echo: second question",
                             "third question", "echo: third question"]
    assert upstream_texts(upstream.last) == ["Be brief.", "first question", "echo: first question", "second question",
                                             "echo: second question", "third question"]
    # the runs' calls are one line of their own conversation, each storing only its question
    found = raw.headers["x-conversation-id"]
    rows = db.fetch("SELECT kind, sent FROM nodes WHERE conversation_id = $1 ORDER BY created_at", found)
    assert [r["kind"] for r in rows] == ["turn"] * 3 and [len(r["sent"]) for r in rows] == [2, 1, 1]
    # (that conversation given metadata through the API is still found by content: only the API's own are not)
    proxy.openai(key).conversations.update(found, metadata={"topic": "weather"})
    history.append({"role": "assistant", "content": answer.output_text})
    with openai.OpenAI(base_url=f"{proxy.url}/auto/v1", api_key=key, max_retries=0) as again:
        raw = again.responses.with_raw_response.create(model=MODEL, instructions="Be brief.",
                                                       input=[*history, new, {"role": "user", "content": "fourth"}])
    assert raw.headers["x-conversation-id"] == found, "an auto conversation given metadata is found no more"


def test_conversation_under_auto_is_delta_and_item_references_resolve(proxy, upstream, key):
    client = proxy.openai(key)
    conv = client.conversations.create(items=[user_item("referenced later")])
    item_id = client.conversations.items.list(conv.id).data[0].id
    auto = openai.OpenAI(base_url=f"{proxy.url}/auto/v1", api_key=key, max_retries=0)
    try:
        raw = auto.responses.with_raw_response.create(model=MODEL, conversation=conv.id, input="new only")
    finally:
        auto.close()
    assert raw.headers["x-context-mode"] == "delta" and raw.headers["x-conversation-id"] == conv.id
    assert upstream_texts(upstream.last) == ["referenced later", "new only"]
    # an item_reference to an item the Conversations API added is resolved from the tree
    client.responses.create(model=MODEL, input=[{"type": "item_reference", "id": item_id}, user_item("again")],
                            extra_headers={"X-Conversation-Id": f"other-{uuid.uuid4().hex}"})
    assert upstream_texts(upstream.last) == ["referenced later", "again"]


def test_a_full_history_client_with_unchanged_instructions_keeps_its_questions_listed(proxy, upstream, key):
    """Full history stores a call's instructions only when they changed: the call's first stored
    item is then its own question, and the response's input items and the conversation's items
    list it (before, it was taken for the instructions and left out of both)."""
    client = openai.OpenAI(base_url=f"{proxy.url}/auto/v1", api_key=key, max_retries=0)
    first = client.responses.with_raw_response.create(model=MODEL, instructions="SYS", input=[
        {"role": "user", "content": "q1"}])
    one = first.parse()
    history = [{"role": "user", "content": "q1"}, *[o.model_dump(exclude_none=True) for o in one.output],
               {"role": "user", "content": "q2"}]
    second = client.responses.with_raw_response.create(model=MODEL, instructions="SYS", input=history)
    two = second.parse()
    assert second.headers["x-parent-node-id"] == first.headers["x-node-id"]
    # (its input: the history the client resent, as OpenAI lists a stateless call's input)
    assert [i.content[0].text for i in client.responses.input_items.list(two.id, order="asc").data] == [
        "q1", one.output_text, "q2"]
    cid = second.headers["x-conversation-id"]
    listed = proxy.http(key).get(f"/v1/conversations/{cid}/items", params={"order": "asc"}).json()["data"]
    assert [i["content"][0]["text"] for i in listed] == ["q1", one.output_text, "q2", two.output_text]
    changed = client.responses.create(model=MODEL, instructions="SYS 2", input=[*history, *[
        o.model_dump(exclude_none=True) for o in two.output], {"role": "user", "content": "q3"}])
    assert [i.content[0].text for i in client.responses.input_items.list(changed.id, order="asc").data] == [
        "q1", one.output_text, "q2", two.output_text, "q3"]


def test_an_item_deletes_branch_is_a_sibling_of_the_one_it_copies(proxy, upstream, key):
    """The branch a DELETE makes begins with an items node beside the turn it copies: the path
    counts them as siblings (1/2, 2/2), as the branch arrows (switch) move between them."""
    http = proxy.http(key)
    cid = http.post("/v1/conversations", json={"items": [{"type": "message", "role": "user", "content": "first"}]}).json()["id"]
    for text in ("second", "third"):
        assert http.post("/v1/responses", json={"model": MODEL, "input": text, "conversation": cid}).status_code == 200
    before = http.get(f"/admin/conversations/{cid}/path").json()["data"]
    items = http.get(f"/v1/conversations/{cid}/items", params={"order": "asc"}).json()["data"]
    second = next(i for i in items if i.get("role") == "user" and "second" in str(i.get("content")))
    assert http.delete(f"/v1/conversations/{cid}/items/{second['id']}").status_code == 200
    after = http.get(f"/admin/conversations/{cid}/path").json()["data"]
    copy = next(n for n in after if n["id"] not in {b["id"] for b in before})
    old = next(b for b in before if b.get("parent_id") == copy.get("parent_id"))
    assert (copy["kind"], old["kind"]) == ("items", "turn")
    assert (copy["sibling_index"], copy["sibling_count"]) == (2, 2)
    assert http.post(f"/admin/conversations/{cid}/switch", json={"node_id": old["id"]}).status_code == 200
    back = next(n for n in http.get(f"/admin/conversations/{cid}/path").json()["data"] if n["id"] == old["id"])
    assert (back["sibling_index"], back["sibling_count"]) == (1, 2)


@pytest.mark.parametrize(("bad", "param"), [
    ({"type": "message", "role": "wizard", "content": "x"}, "items[1].role"),
    ({"type": "message", "role": "user"}, "items[1].content"),
    ({"type": "message", "role": "user", "content": 5}, "items[1].content"),
    ({"role": "user", "content": [5]}, "items[1].content[0]"),
    ({"role": "user", "content": [{"type": "input_text"}]}, "items[1].content[0].text"),
    ({"role": "user", "content": [{"type": "input_image", "detail": "auto"}]}, "items[1].content[0].image_url"),
    ({"type": "function_call", "name": "f", "arguments": "{}"}, "items[1].call_id"),
    ({"type": "function_call_output", "call_id": "call_1"}, "items[1].output"),
    ({"type": "reasoning", "summary": "not a list"}, "items[1].summary"),
    ({"type": "compaction", "encrypted_content": 5}, "items[1].encrypted_content"),
    ({"type": "message", "role": "user", "content": "x", "id": 7}, "items[1].id"),
])
def test_an_item_that_cannot_be_context_is_refused_when_added(proxy, upstream, key, bad, param):
    """Added items reach no upstream that could refuse them: stored unchecked, a malformed one would
    go upstream with every later call of the conversation, and each would be refused. They are
    checked as they are added -- on create and on an items add alike -- and nothing is stored."""
    client = proxy.openai(key)
    for create in (True, False):
        conv = client.conversations.create(items=[] if create else [user_item("kept")])
        with pytest.raises(openai.BadRequestError) as refused:
            if create:
                client.conversations.create(items=[user_item("ok"), bad])
            else:
                client.conversations.items.create(conv.id, items=[user_item("ok"), bad])
        assert refused.value.body["param"] == param
        assert texts(client.conversations.items.list(conv.id, order="asc").data) == ([] if create else ["kept"])
    client.responses.create(model=MODEL, conversation=conv.id, input="q")
    assert upstream_texts(upstream.last) == ["kept", "q"]


def test_items_of_every_type_the_proxy_reads_and_of_types_it_does_not_are_added(proxy, upstream, key):
    """What the checks let through: the item types as OpenAI's reference shapes them, and an item of
    a type the proxy does not know (kept and forwarded as it came: OpenAI adds types)."""
    client = proxy.openai(key)
    items = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "be brief"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "look"},
                                                        {"type": "input_image", "image_url": "https://x/y.png"},
                                                        {"type": "input_file", "file_id": "file_1"}]},
        {"type": "function_call", "call_id": "call_1", "name": "look", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": [{"type": "input_text", "text": "seen"}]},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "thought"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "done", "annotations": []},
                                                             {"type": "refusal", "refusal": "no"}]},
        {"type": "mcp_list_tools", "server_label": "s", "tools": []},
    ]
    conv = client.conversations.create(items=items)
    assert len(client.conversations.items.list(conv.id).data) == len(items)
    # an SDK's dump of an item writes its absent id as null: none
    dumped = {"type": "function_call", "call_id": "call_2", "name": "look", "arguments": "{}", "id": None, "status": None}
    assert len(client.conversations.items.create(conv.id, items=[dumped]).data) == 1
    # a compaction item of ours named by its id alone passes the checks (and is looked for: none here)
    with pytest.raises(openai.NotFoundError):
        client.conversations.items.create(conv.id, items=[{"type": "compaction", "id": "cmp_" + "ab" * 16}])


def test_an_item_reference_finds_an_added_item_only_while_its_conversation_lists_it(proxy, upstream, key):
    """A deleted item stays a branch of the tree (nothing is removed), but a reference to it is
    not found, as a GET of it is not -- the deleted text is not sent upstream again; the item
    beside it, copied to the new branch, is still found by its id."""
    client = proxy.openai(key)
    conv = client.conversations.create(items=[user_item("KEEP"), user_item("DELETED-SECRET")])
    kept, gone = [i.id for i in client.conversations.items.list(conv.id, order="asc").data]
    client.conversations.items.delete(gone, conversation_id=conv.id)
    other = client.conversations.create()
    for target in (conv.id, other.id):
        with pytest.raises(openai.NotFoundError):
            client.responses.create(model=MODEL, conversation=target,
                                    input=[{"type": "item_reference", "id": gone}, user_item("Q")])
    assert all("DELETED-SECRET" not in str(r.body) for r in upstream.requests)
    client.responses.create(model=MODEL, conversation=other.id, input=[{"type": "item_reference", "id": kept}])
    assert upstream_texts(upstream.last) == ["KEEP"]
    assert texts(client.conversations.items.list(conv.id, order="asc").data) == ["KEEP"]


@pytest.mark.parametrize("given", ["msg_mine", "msg_" + "ab" * 16, "fc_custom1"])
def test_an_item_reference_finds_an_id_the_client_gave_in_the_conversation_it_continues(proxy, upstream, key, given):
    """An id the client gave names no node: it is found among the items of the conversation the
    call continues (docs/behaviour.md#the-conversations-api)."""
    client = proxy.openai(key)
    item, answered = {**user_item("NAMED-ITEM"), "id": given}, []
    if given.startswith("fc_"):  # (a call goes with its output)
        item = {"type": "function_call", "call_id": "call_z", "name": "f", "arguments": "{}", "id": given}
        answered = [{"type": "function_call_output", "call_id": "call_z", "output": "NAMED-ITEM"}]
    conv = client.conversations.create(items=[item])
    client.responses.create(model=MODEL, conversation=conv.id, input=[{"type": "item_reference", "id": given},
                                                                      *answered, user_item("Q")])
    sent = upstream.last.messages
    assert [m.get("content") for m in sent[-2:]] == ["NAMED-ITEM", "Q"]
    assert not answered or sent[-3]["tool_calls"][0]["id"] == "call_z"
    with pytest.raises(openai.NotFoundError):  # another conversation's: not looked for
        client.responses.create(model=MODEL, conversation=client.conversations.create().id,
                                input=[{"type": "item_reference", "id": given}])



def test_items_may_reference_stored_items_as_openais_input_item_union_allows(proxy, upstream, key):
    """``items`` of ``conversations.create`` and ``items.create`` are OpenAI's input items, which
    hold ``item_reference``: a reference is resolved from the tree (the stored item is added, and
    is context), an unknown one is 404 ``item_not_found`` and stores nothing -- it was refused."""
    client = proxy.openai(key)
    upstream.enqueue(Reply(content="The answer is 42."))
    source = client.responses.create(model=MODEL, input="What is the answer?",
                                     extra_headers={"X-Conversation-Id": f"src-{uuid.uuid4().hex}"})
    conv = client.conversations.create(items=[{"type": "item_reference", "id": source.output[0].id}])
    assert texts(client.conversations.items.list(conv.id).data) == ["The answer is 42."]
    question = client.conversations.items.list(conv.id).data[0]
    other = client.conversations.create(items=[user_item("first")])
    added = client.conversations.items.create(other.id, items=[{"type": "item_reference", "id": question.id},
                                                               user_item("Repeat it.")])
    assert texts(added.data) == ["The answer is 42.", "Repeat it."]
    client.responses.create(model=MODEL, conversation=other.id, input="Go")
    assert upstream_texts(upstream.last) == ["first", "The answer is 42.", "Repeat it.", "Go"]
    with pytest.raises(openai.NotFoundError) as missing:
        client.conversations.items.create(other.id, items=[{"type": "item_reference", "id": "msg_nothing"}])
    assert missing.value.body["code"] == "item_not_found"
    with pytest.raises(openai.NotFoundError):
        proxy.openai(new_key()).conversations.create(items=[{"type": "item_reference", "id": source.output[0].id}])
    assert len(client.conversations.items.list(other.id).data) == 5  # (nothing stored by the refusal)


def test_items_a_client_added_reach_a_responses_upstream_as_they_came(native, upstream, key):
    """Items added through the Conversations API that the proxy does not read (a hosted tool's
    call, a type newer than it) go to the Responses upstream as they came, as the same items in a
    call's own input do -- they were kept back as a provider's own items, for the provider that
    made them, and no call's upstream made these. Reasoning still goes only to its producer."""
    client = native.openai(key)
    search = {"type": "web_search_call", "id": "ws_1", "status": "completed",
              "action": {"type": "search", "query": "oslo weather"}}
    newer = {"type": "future_item_type", "payload": 1}
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "enc-someone-elses"}
    conv = client.conversations.create(items=[user_item("Context item."), search, newer, reasoning])
    client.responses.create(model="native-1", conversation=conv.id, input="Question?")
    sent = upstream.responses_requests[-1].body["input"]
    assert [i.get("type", "message") for i in sent] == ["message", "web_search_call", "future_item_type", "message"]
    assert sent[1]["action"] == search["action"] and sent[2] == newer
