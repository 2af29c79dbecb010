"""OpenAI's compaction controls on the tree, through the official openai SDK: a call's own
``context_management`` threshold, the readable ``compaction`` output item (plain and streamed,
over chat and Responses upstreams), a stateless client sending it back, ``POST
/v1/responses/compact`` and ``truncation: "auto"`` -- asserted on what the fake upstream received."""

import uuid

import openai
import pytest

from proxy.compaction import SUMMARY_PREFIX

from .conftest import new_key
from .fakes import Reply
from .helpers import MODEL

CONTROL = [{"type": "compaction", "compact_threshold": 60}]
OVERFLOW = {"message": "This model's maximum context length is 128000 tokens. However, your messages resulted in "
                       "200000 tokens.", "type": "invalid_request_error", "param": "input",
            "code": "context_length_exceeded"}


def user_item(text):
    return {"type": "message", "role": "user", "content": text}


def contents(messages):
    return [m["content"] if isinstance(m["content"], str) else "".join(p["text"] for p in m["content"])
            for m in messages]


def summary_text(item):
    """A compaction item's readable summary (an extra field for the SDK's own type)."""
    part = item.summary[0]
    return part["text"] if isinstance(part, dict) else part.text


def item_text(item):
    item = item if isinstance(item, dict) else item.model_dump()
    if item.get("type") == "compaction":  # (its readable summary)
        return "".join(p["text"] for p in item["summary"])
    content = item["content"]
    return content if isinstance(content, str) else "".join(p["text"] for p in content)


def long_conversation(client, n=10):
    """A conversation of ``n`` items (more than compaction keeps raw), well below any default threshold."""
    return client.conversations.create(items=[user_item(f"fact {i}: the answer to item {i} is {i * 7}.")
                                              for i in range(n)])


def test_a_calls_own_threshold_compacts_and_the_answer_begins_with_a_readable_compaction_item(proxy, upstream, key):
    client = proxy.openai(key)
    plain = long_conversation(client)
    client.responses.create(model=MODEL, conversation=plain.id, input="no controls")
    assert upstream.summariser_requests == []  # far below the configured thresholds: nothing compacted
    conv = long_conversation(client)
    raw = client.responses.with_raw_response.create(model=MODEL, conversation=conv.id, input="the question",
                                                    context_management=CONTROL)
    response = raw.parse()
    assert len(upstream.summariser_requests) == 1
    compaction, answer = response.output[0], response.output[1]
    assert compaction.type == "compaction" and compaction.id.startswith("cmp_")
    assert summary_text(compaction).startswith(SUMMARY_PREFIX) and "Facts so far" in summary_text(compaction)
    assert compaction.encrypted_content and "Facts" not in compaction.encrypted_content  # opaque
    assert answer.type == "message" and response.output_text == "echo: the question"
    # the call hangs under the compaction node, and the upstream got the summary, the kept items, the question
    node_id = uuid.UUID(hex=compaction.id[4:])
    assert raw.headers["x-parent-node-id"] == str(node_id)
    sent = contents(upstream.last.messages)
    assert sent[0].startswith(SUMMARY_PREFIX) and sent[-1] == "the question"
    assert "fact 0: the answer to item 0 is 0." not in sent and "fact 9: the answer to item 9 is 63." in sent
    assert "context_management" not in upstream.last.body
    # stored: the compaction node; the call's own node holds only its answer (never the compaction item)
    assert proxy.db.node(node_id)["kind"] == "compaction"
    stored = proxy.db.node(raw.headers["x-node-id"])
    assert [i["type"] for i in stored["received"]] == ["message"]


def test_a_stateless_client_sends_the_compaction_item_back(proxy, upstream, key):
    client = proxy.openai(key)
    conv = long_conversation(client)
    first = client.responses.with_raw_response.create(model=MODEL, conversation=conv.id, input="question one",
                                                      context_management=CONTROL)
    response = first.parse()
    items = [i.model_dump(exclude_none=True) for i in response.output]
    stateless = proxy.openai(key)  # names no conversation, continues nothing: only the item
    again = stateless.responses.with_raw_response.create(
        model=MODEL, store=False, input=[*items, user_item("question two")])
    sent = contents(upstream.last.messages)
    assert sent[0].startswith(SUMMARY_PREFIX)
    assert sent[-3:] == ["question one", "echo: question one", "question two"]
    assert sum(s == "question one" for s in sent) == 1
    # resolved to the tree: the compacted call is the parent, in its conversation
    assert again.headers["x-conversation-id"] == conv.id
    assert again.headers["x-parent-node-id"] == first.headers["x-node-id"]
    # another tenant's item names nothing of theirs
    with pytest.raises(openai.NotFoundError):
        proxy.openai(new_key()).responses.create(model=MODEL, store=False, input=[*items, user_item("steal")])
    with pytest.raises(openai.NotFoundError):
        stateless.responses.create(model=MODEL, input=[{**items[0], "encrypted_content": "bpcmp1.AAAA",
                                                        "id": "cmp_" + "0" * 32}, user_item("x")])


@pytest.mark.parametrize("with_ids", [True, False])
def test_a_stateless_client_keeps_resending_its_window_after_a_compaction(proxy, upstream, key, with_ids):
    """OpenAI's stateless pattern after a compaction: each call sends the window so far -- the
    compaction item, the answers with (or, as some clients do, without) their ids, its questions --
    and the next question. Every turn continues the same line: the summary stays in the context,
    each item is stored once, nothing becomes a new root."""
    client = proxy.openai(key)
    conv = long_conversation(client)
    first = client.responses.with_raw_response.create(model=MODEL, conversation=conv.id, input="question one",
                                                      context_management=CONTROL)

    def window_of(output):
        items = [i.model_dump(exclude_none=True) for i in output]
        return items if with_ids else [i if i["type"] == "compaction" else
                                       {k: v for k, v in i.items() if k != "id"} for i in items]

    window = window_of(first.parse().output)
    stateless = proxy.openai(key)
    parent = first.headers["x-node-id"]
    for n in range(3):
        question = user_item(f"next {n}")
        r = stateless.responses.with_raw_response.create(model=MODEL, store=False, input=[*window, question])
        sent = contents(upstream.last.messages)
        assert sent[0].startswith(SUMMARY_PREFIX), (n, sent)
        expected = ["question one", "echo: question one"] + [x for k in range(n) for x in (f"next {k}", f"echo: next {k}")]
        assert sent[-len(expected) - 1:] == [*expected, f"next {n}"], (n, sent)
        assert r.headers["x-context-mode"] == "delta" and r.headers["x-conversation-id"] == conv.id
        assert r.headers["x-parent-node-id"] == parent, n  # the turn before: one line
        assert [i["content"] for i in proxy.db.node(r.headers["x-node-id"])["sent"]] == [f"next {n}"]
        parent = r.headers["x-node-id"]
        window += [question, *window_of(r.parse().output)]
    # a retry of the last question (its answer lost on the way): beside the turn, not under it
    r = stateless.responses.with_raw_response.create(model=MODEL, store=False, input=window[:-1])
    assert r.headers["x-parent-node-id"] == str(proxy.db.node(parent)["parent_id"])


def test_the_compaction_item_in_a_stream_over_a_chat_upstream(proxy, upstream, key):
    client = proxy.openai(key)
    conv = long_conversation(client)
    events = list(client.responses.create(model=MODEL, conversation=conv.id, input="streamed",
                                          context_management=CONTROL, stream=True))
    added = [e for e in events if e.type == "response.output_item.added"]
    assert added[0].item.type == "compaction" and added[0].output_index == 0
    assert added[1].item.type == "message" and added[1].output_index == 1
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert deltas and all(e.output_index == 1 for e in deltas)
    final = events[-1].response
    assert [i.type for i in final.output] == ["compaction", "message"] and final.output_text == "echo: streamed"


def test_compaction_controls_over_a_responses_upstream(native, upstream, key):
    client = native.openai(key)
    conv = long_conversation(client)
    upstream.enqueue(Reply(content="native answer"))
    response = client.responses.create(model="native-1", conversation=conv.id, input="native question",
                                       context_management=CONTROL)
    assert [i.type for i in response.output] == ["compaction", "message"]
    request = upstream.responses_requests[-1].body
    assert "context_management" not in request and "truncation" not in request
    texts = [item_text(i) for i in request["input"]]
    assert texts[0].startswith(SUMMARY_PREFIX) and texts[-1] == "native question"
    upstream.enqueue(Reply(content="streamed native"))
    conv2 = long_conversation(client)
    events = list(client.responses.create(model="native-1", conversation=conv2.id, input="q",
                                          context_management=CONTROL, stream=True))
    added = [e for e in events if e.type == "response.output_item.added"]
    assert [(e.output_index, e.item.type) for e in added] == [(0, "compaction"), (1, "message")]
    assert [i.type for i in events[-1].response.output] == ["compaction", "message"]
    kinds = [e.type for e in events]  # (the items come once the response is in progress, as over chat)
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    # the stored answer is the upstream's alone: the compaction is listed once, as the summary's item
    listed = client.conversations.items.list(conv2.id, order="asc").data
    types = [i.type for i in listed]
    assert types[-1] == "message" and types.count("compaction") == 1 and types[0] == "compaction"
    assert listed[0].id == events[-1].response.output[0].id


def test_compact_now_a_conversation_and_continue(proxy, upstream, key):
    client = proxy.openai(key)
    conv = long_conversation(client)
    compacted = client.responses.compact(model=MODEL, extra_body={"conversation": conv.id})  # (not an SDK argument yet)
    assert compacted.object == "response.compaction"
    first = compacted.output[0]
    assert first.type == "compaction" and summary_text(first).startswith(SUMMARY_PREFIX)
    node_id = uuid.UUID(hex=first.id[4:])
    assert proxy.db.head(conv.id) == str(node_id)  # the head moved to the compaction node
    kept = [item_text(i) for i in compacted.output[1:]]
    assert kept and kept[-1] == "fact 9: the answer to item 9 is 63."
    client.responses.create(model=MODEL, conversation=conv.id, input="after")
    sent = contents(upstream.last.messages)
    assert sent[0].startswith(SUMMARY_PREFIX) and sent[1:] == [*kept, "after"]


def test_compact_now_always_answers_a_compaction_item(proxy, upstream, key):
    """Asked to compact now, a conversation too short to keep the usual recent messages raw is
    summarised whole; compacted again with nothing new, its compaction comes back as it is; the
    kept items of a stateless input are typed and have ids."""
    client = proxy.openai(key)
    conv = client.conversations.create()
    client.responses.create(model=MODEL, conversation=conv.id, input="short one")
    first = client.responses.compact(model=MODEL, extra_body={"conversation": conv.id})
    assert [i.type for i in first.output] == ["compaction"]
    assert summary_text(first.output[0]).startswith(SUMMARY_PREFIX)
    assert proxy.db.head(conv.id) == str(uuid.UUID(hex=first.output[0].id[4:]))
    again = client.responses.compact(model=MODEL, extra_body={"conversation": conv.id})
    assert [i.type for i in again.output] == ["compaction"] and again.output[0].id == first.output[0].id
    client.responses.create(model=MODEL, conversation=conv.id, input="after")
    assert contents(upstream.last.messages)[0].startswith(SUMMARY_PREFIX)
    stateless = client.responses.compact(model=MODEL, input=[user_item(f"note {i}") for i in range(10)])
    assert stateless.output[0].type == "compaction" and len(stateless.output) > 1
    for item in stateless.output[1:]:
        assert item.type == "message" and item.id and item.id.startswith("msg_")


def test_compact_now_under_auto_v1(proxy, upstream, key):
    """``/auto/v1`` -- the base URL the README gives Codex -- compacts here too: the request went to
    the upstream as a pass-through of a response id named "compact" (our items sent out; a chat
    upstream has no such endpoint)."""
    import openai as sdk

    client = sdk.OpenAI(base_url=f"{proxy.url}/auto/v1", api_key=key, max_retries=0)
    before = len(upstream.requests)
    compacted = client.responses.compact(model=MODEL, input=[user_item(f"note {i}") for i in range(10)])
    assert compacted.object == "response.compaction" and compacted.output[0].type == "compaction"
    assert all(not r.path.endswith("/responses/compact") for r in upstream.requests[before:])


def test_compacted_items_are_the_conversations_and_a_compaction_is_not_summarised_again(proxy, upstream, key):
    """The kept items of a compact answer have the ids the conversation's items list gives them
    (retrieving one answers that item, not the summary); compacting again with nothing new answers
    the same compaction, without another summary."""
    client = proxy.openai(key)
    conv = long_conversation(client)
    compacted = client.responses.compact(model=MODEL, extra_body={"conversation": conv.id})
    kept = compacted.output[1:]
    assert kept
    for item in kept:
        assert client.conversations.items.retrieve(item.id, conversation_id=conv.id).model_dump(
            exclude_none=True) == item.model_dump(exclude_none=True)
    summaries = len(upstream.requests)
    again = client.responses.compact(model=MODEL, extra_body={"conversation": conv.id})
    assert again.output[0].id == compacted.output[0].id and [i.id for i in again.output] == [
        i.id for i in compacted.output]
    assert len(upstream.requests) == summaries  # no summariser call


def test_compact_stateless_input_then_send_the_output_back(proxy, upstream, key):
    client = proxy.openai(key)
    compacted = client.responses.compact(model=MODEL, input=[user_item(f"note {i}") for i in range(10)])
    assert compacted.output[0].type == "compaction"
    output = [i.model_dump(exclude_none=True) for i in compacted.output]
    kept = [item_text(i) for i in output[1:]]
    answer = client.responses.create(model=MODEL, store=False, input=[*output, user_item("and now?")])
    sent = contents(upstream.last.messages)
    assert sent[0].startswith(SUMMARY_PREFIX) and sent[1:] == [*kept, "and now?"]  # the kept items once
    # the next turn resends it all: the same line, each item once
    window = [*output, user_item("and now?"), *[i.model_dump(exclude_none=True) for i in answer.output]]
    client.responses.create(model=MODEL, store=False, input=[*window, user_item("and then?")])
    sent = contents(upstream.last.messages)
    assert sent[0].startswith(SUMMARY_PREFIX) and sent[1:] == [*kept, "and now?", "echo: and now?", "and then?"]


def test_a_withdrawn_compaction_is_not_resumed_nor_copied(proxy, upstream, key):
    """The compaction item of a response its client deleted (withdrawn: its node still holds its
    conversation's path) names nothing any more, as GET, previous_response_id and item_reference
    already said: a stateless call resending it, or a conversation made with it, is 404 -- the
    deleted summary was sent upstream again, or copied into the new conversation."""
    client = proxy.openai(key)
    compacted = client.responses.compact(model=MODEL, input=[user_item(f"note {i}") for i in range(10)])
    output = [i.model_dump(exclude_none=True) for i in compacted.output]
    client.responses.delete(compacted.id)
    sent = len(upstream.requests)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=MODEL, store=False, input=[*output, user_item("and now?")])
    with pytest.raises(openai.NotFoundError):
        client.conversations.create(items=[output[0]])
    assert len(upstream.requests) == sent


def test_compact_a_stored_response(proxy, upstream, key, cid):
    client = proxy.openai(key, conversation=cid)
    last = None
    for i in range(5):
        last = client.responses.create(model=MODEL, input=f"turn {i}")
    compacted = proxy.openai(key).responses.compact(model=MODEL, previous_response_id=last.id)
    assert compacted.output[0].type == "compaction"
    assert proxy.db.head(cid) == str(uuid.UUID(hex=compacted.output[0].id[4:]))
    # its id is a response id: continuing from it continues from the compaction
    proxy.openai(key).responses.create(model=MODEL, input="next", previous_response_id=compacted.id)
    assert contents(upstream.last.messages)[0].startswith(SUMMARY_PREFIX)
    with pytest.raises(openai.NotFoundError):
        proxy.openai(new_key()).responses.compact(model=MODEL, previous_response_id=last.id)


def test_truncation_auto_compacts_instead_of_failing(proxy, upstream, key):
    client = proxy.openai(key)
    failing = long_conversation(client)
    upstream.enqueue(Reply(kind="error", status=400, error=OVERFLOW))
    with pytest.raises(openai.BadRequestError) as refused:  # "disabled", the default: the overflow fails the call
        client.responses.create(model=MODEL, conversation=failing.id, input="too long")
    assert refused.value.body["code"] == "context_length_exceeded" and upstream.summariser_requests == []
    conv = long_conversation(client)
    upstream.enqueue(Reply(kind="error", status=400, error=OVERFLOW), Reply(content="fits now"))
    raw = client.responses.with_raw_response.create(model=MODEL, conversation=conv.id, input="too long",
                                                    truncation="auto")
    response = raw.parse()
    assert response.output_text == "fits now" and response.output[0].type == "compaction"
    assert response.truncation == "auto"
    assert len(upstream.summariser_requests) == 1
    sent = contents(upstream.last.messages)
    assert sent[0].startswith(SUMMARY_PREFIX) and sent[-1] == "too long"
    assert proxy.db.head(conv.id) == raw.headers["x-node-id"]  # a success like any turn
    assert "truncation" not in upstream.last.body
    # every attempt is one node: the refused one is a failed sibling where it hung, its request kept
    node = proxy.db.node(raw.headers["x-node-id"])
    first = proxy.db.fetchrow("SELECT * FROM nodes WHERE conversation_id = $1 AND outcome = 'overflow'", conv.id)
    compaction = proxy.db.node(node["parent_id"])
    assert compaction["kind"] == "compaction" and first["parent_id"] == compaction["compacted_from"]
    assert first["sent"] == node["sent"] and first["kind"] == "turn" and first["status"] == "failed"
    assert first["error"]["code"] == "context_overflow" and first["error"]["status"] == 400
    assert first["request_hash"] != node["request_hash"]
    replay = proxy.http(key).get(f"/admin/nodes/{first['id']}/request")
    assert replay.headers["x-request-verified"] == "true"
    assert contents(replay.json()["messages"])[-1] == "too long"
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model=MODEL, conversation=conv.id, input="x", truncation="sometimes")


def test_truncation_auto_holds_a_calls_own_threshold_to_the_input_limit(fresh_database_url, upstream_url, upstream,
                                                                         key):
    from .conftest import make_settings, serve_proxy

    settings = make_settings(fresh_database_url, upstream_url,
                             models={"tiny*": {"context_window": 1200, "max_output_tokens": 200}})  # input limit 1000
    lax = [{"type": "compaction", "compact_threshold": 1_000_000}]  # far above what the model takes
    filler = "The quarterly revenue figures for the northern region were reviewed in detail. " * 20
    with serve_proxy(settings) as p:
        client = p.openai(key)
        # (each conversation's items say whose they are: the fake upstream is the session's, and
        # another test's background summary may still reach it)
        alone = client.conversations.create(items=[user_item(f"alone {i}: {filler}") for i in range(10)])
        client.responses.create(model="tiny-1", conversation=alone.id, input="no truncation", context_management=lax)
        assert not [r for r in upstream.summariser_requests if "alone 0:" in r.text()]  # its own threshold: sent whole
        conv = client.conversations.create(items=[user_item(f"held {i}: {filler}") for i in range(10)])
        response = client.responses.create(model="tiny-1", conversation=conv.id, input="held", truncation="auto",
                                           context_management=lax)
        assert [r for r in upstream.summariser_requests if "held 0:" in r.text()] and response.output[0].type == "compaction"
        assert contents(upstream.last.messages)[0].startswith(SUMMARY_PREFIX)


def test_kept_items_keep_their_ids_through_compactions(proxy, upstream, key):
    """§14's stable ids: the items a summary kept raw are listed with the ids they had before it
    -- through a second summary too -- and can be retrieved and deleted by them."""
    client = proxy.openai(key)
    conv = client.conversations.create(items=[user_item(f"fact {i}") for i in range(6)])
    for q in ("q1", "q2", "q3"):
        client.responses.create(model=MODEL, conversation=conv.id, input=q)
    before = {item_text(i): i.id for i in client.conversations.items.list(conv.id, order="asc", limit=100).data}
    assert len(before) == 12
    compacted = client.responses.compact(model=MODEL, extra_body={"conversation": conv.id})
    assert compacted.output[0].type == "compaction"
    after = client.conversations.items.list(conv.id, order="asc", limit=100).data
    # the summary is listed as the compaction item /responses/compact answered, the kept items after it
    assert after[0].type == "compaction" and after[0].id == compacted.output[0].id
    kept = after[1:]
    assert kept and [i.id for i in kept] == [before[item_text(i)] for i in kept]
    assert [i.id for i in compacted.output[1:]] == [i.id for i in kept]  # the compact answer says the same
    client.responses.create(model=MODEL, conversation=conv.id, input="q4")
    proxy.http(key).post(f"/admin/conversations/{conv.id}/compact").raise_for_status()  # a summary of the summary
    again = [i for i in client.conversations.items.list(conv.id, order="asc", limit=100).data if i.type != "compaction"]
    for item in again:
        if item_text(item) in before:
            assert item.id == before[item_text(item)], item_text(item)
    old = next(i for i in again if item_text(i) in before)
    assert item_text(client.conversations.items.retrieve(old.id, conversation_id=conv.id)) == item_text(old)
    client.conversations.items.delete(old.id, conversation_id=conv.id)
    remaining = client.conversations.items.list(conv.id, order="asc", limit=100).data
    assert old.id not in [i.id for i in remaining] and item_text(old) not in [item_text(i) for i in remaining]
    assert [i.id for i in remaining if i.id in before.values()] == [i.id for i in again if i.id != old.id and i.id in before.values()]


def test_a_summary_keeps_the_system_items_ids_and_lists_no_instructions(proxy, upstream, key):
    """The system message a summary carries (so the system rule still finds it) is the item it was
    -- the same id, retrievable by it; a Responses call's instructions, which it carries too, are
    context and were never an item: not listed after it either, but still sent."""
    client = proxy.openai(key)
    conv = client.conversations.create(items=[{"type": "message", "role": "system", "content": "SYS"},
                                              *[user_item(f"fact {i}") for i in range(8)]])
    system_id = client.conversations.items.list(conv.id, order="asc").data[0].id
    client.responses.compact(model=MODEL, extra_body={"conversation": conv.id})
    after = client.conversations.items.list(conv.id, order="asc", limit=100).data
    assert [(i.id, item_text(i)) for i in after if getattr(i, "role", None) == "system"] == [(system_id, "SYS")]
    assert item_text(client.conversations.items.retrieve(system_id, conversation_id=conv.id)) == "SYS"
    # a system item of odd content (parts of another kind) is carried as well, and lists
    odd = client.conversations.create(items=[{"type": "message", "role": "system",
                                              "content": [{"type": "odd_part", "form": "x"}]},
                                             *[user_item(f"fact {i}") for i in range(8)]])
    odd_id = client.conversations.items.list(odd.id, order="asc").data[0].id
    client.responses.compact(model=MODEL, extra_body={"conversation": odd.id})
    assert odd_id in [i.id for i in client.conversations.items.list(odd.id, order="asc", limit=100).data]

    other = client.conversations.create(items=[user_item(f"fact {i}") for i in range(4)])
    for q in ("q1", "q2", "q3"):
        client.responses.create(model=MODEL, conversation=other.id, input=q, instructions="INSTRUCTIONS-XYZ")
    listed = client.conversations.items.list(other.id, order="asc", limit=100).data
    assert "INSTRUCTIONS-XYZ" not in [item_text(i) for i in listed if i.type == "message"]
    client.responses.compact(model=MODEL, extra_body={"conversation": other.id})
    listed = client.conversations.items.list(other.id, order="asc", limit=100).data
    assert listed[0].type == "compaction"
    assert "INSTRUCTIONS-XYZ" not in [item_text(i) for i in listed if i.type == "message"]
    client.responses.create(model=MODEL, conversation=other.id, input="q4")  # no instructions of its own
    assert upstream.last.messages[0] == {"role": "system", "content": "INSTRUCTIONS-XYZ"}  # the context still
    # a delete copies the summary's items: the instructions stay context in the copy, not an item
    kept = next(i for i in client.conversations.items.list(other.id, order="asc", limit=100).data if i.type == "message")
    client.conversations.items.delete(kept.id, conversation_id=other.id)
    listed = client.conversations.items.list(other.id, order="asc", limit=100).data
    assert "INSTRUCTIONS-XYZ" not in [item_text(i) for i in listed if i.type == "message"]
    client.responses.create(model=MODEL, conversation=other.id, input="q5")
    assert upstream.last.messages[0] == {"role": "system", "content": "INSTRUCTIONS-XYZ"}


def test_listed_items_resent_by_a_stateless_client_continue_from_the_compaction(proxy, upstream, key):
    client = proxy.openai(key)
    conv = client.conversations.create(items=[user_item(f"fact {i}") for i in range(6)])
    for q in ("q1", "q2", "q3"):
        client.responses.create(model=MODEL, conversation=conv.id, input=q)
    client.responses.compact(model=MODEL, extra_body={"conversation": conv.id})
    listed = [i.model_dump(exclude_none=True) for i in client.conversations.items.list(conv.id, order="asc", limit=100)]
    assert listed[0]["type"] == "compaction"
    r = client.responses.with_raw_response.create(model=MODEL, store=False, input=[*listed, user_item("from the list")])
    sent = contents(upstream.last.messages)
    assert sent[0].startswith(SUMMARY_PREFIX) and sent[1:] == [*[item_text(i) for i in listed[1:]], "from the list"]
    # (the compaction node: the head the compact moved there)
    assert r.headers["x-conversation-id"] == conv.id
    assert r.headers["x-parent-node-id"] == str(uuid.UUID(hex=listed[0]["id"][4:]))


def test_a_resumed_window_matches_in_its_own_conversation_not_a_fork(proxy, upstream, key):
    """A fork shares the tree: a node of it with the same content (the same question, the same
    answer) is not where a stateless client of the original conversation continues."""
    client = proxy.openai(key)
    conv = long_conversation(client)
    first = client.responses.with_raw_response.create(model=MODEL, conversation=conv.id, input="question one",
                                                      context_management=CONTROL)
    window = [i.model_dump(exclude_none=True) for i in first.parse().output]
    mine = client.responses.with_raw_response.create(model=MODEL, store=False, input=[*window, user_item("next")])
    assert mine.headers["x-conversation-id"] == conv.id
    fork = proxy.http(key).post(f"/admin/conversations/{conv.id}/fork",
                                json={"node_id": first.headers["x-node-id"]}).json()["id"]
    theirs = client.responses.with_raw_response.create(model=MODEL, conversation=fork, input="next")  # newer, same content
    assert theirs.headers["x-parent-node-id"] == first.headers["x-node-id"]
    window += [user_item("next"), *[i.model_dump(exclude_none=True) for i in mine.parse().output]]
    r = client.responses.with_raw_response.create(model=MODEL, store=False, input=[*window, user_item("and then")])
    assert r.headers["x-conversation-id"] == conv.id
    assert r.headers["x-parent-node-id"] == mine.headers["x-node-id"]


def test_nodes_made_finished_are_never_finished_before_they_were_made(proxy, upstream, key):
    """An items node and a compaction node are made and finished at one moment (their
    ``finished_at`` was read from the clock before the row's ``created_at`` was)."""
    client = proxy.openai(key)
    conv = client.conversations.create(items=[user_item(f"fact {i}") for i in range(8)])
    client.responses.create(model=MODEL, conversation=conv.id, input="q")
    client.responses.compact(model=MODEL, extra_body={"conversation": conv.id})
    rows = proxy.db.fetch("SELECT kind, created_at, finished_at FROM nodes WHERE conversation_id = $1", conv.id)
    assert {r["kind"] for r in rows} >= {"items", "compaction"}
    assert all(r["finished_at"] >= r["created_at"] for r in rows), rows


# -- a compaction item among a conversation's items ----------------------------------------------------


def test_compacting_a_window_again_carries_the_first_summary_on(proxy, upstream, key):
    """OpenAI's stateless loop: the window after a compaction begins with the compaction item, and
    compacting that window again must summarise the first summary too -- before, the item was
    stored as nothing readable and the earlier history was lost. Another tenant's item is 404."""
    client = proxy.openai(key)
    upstream.enqueue_summary(Reply(content="FIRST-SUMMARY: the notes were about zebras."))
    first = client.responses.compact(model=MODEL, input=[user_item(f"note {i}") for i in range(10)])
    window = [i.model_dump(exclude_none=True) for i in first.output]
    assert window[0]["type"] == "compaction"
    with pytest.raises(openai.NotFoundError):
        proxy.openai(new_key()).responses.compact(model=MODEL, input=[*window, user_item("more")])
    asked = len(upstream.summariser_requests)
    client.responses.compact(model=MODEL, input=[*window, *(user_item(f"later {i}") for i in range(10))])
    assert len(upstream.summariser_requests) == asked + 1
    assert "FIRST-SUMMARY: the notes were about zebras." in upstream.summariser_requests[-1].text()


@pytest.mark.parametrize("upstream_api", ["chat", "responses"])
def test_a_compaction_item_among_a_conversations_items_is_context(proxy, native, upstream, key, upstream_api):
    """``conversations.create(items=[compaction item, kept ...])`` (or ``items.create``): the item
    is listed as it came, and the next call's upstream reads its summary -- never our token."""
    p, model = (proxy, MODEL) if upstream_api == "chat" else (native, "native-1")
    client = p.openai(key)
    upstream.enqueue_summary(Reply(content="SUMMARY: giraffes are tall."))
    window = [i.model_dump(exclude_none=True)
              for i in client.responses.compact(model=model, input=[user_item(f"note {i}") for i in range(10)]).output]
    conv = client.conversations.create(items=window)
    listed = client.conversations.items.list(conv.id, order="asc").data
    assert [i.type for i in listed][0] == "compaction" and listed[0].id == window[0]["id"]
    client.responses.create(model=model, conversation=conv.id, input="q")
    if upstream_api == "chat":
        assert "giraffes are tall" in contents(upstream.last.messages)[0]
    else:
        sent = upstream.responses_requests[-1].body["input"]
        assert not any(i.get("type") == "compaction" for i in sent)
        assert sent[0]["role"] == "user" and item_text(sent[0]) == item_text(window[0])
    with pytest.raises(openai.NotFoundError):  # (a token names a node: only the tenant's own)
        p.openai(new_key()).conversations.create(items=window)


def test_deleting_an_item_after_a_summary_keeps_the_compaction_item(proxy, upstream, key):
    """The new branch a DELETE makes copies the summary as the compaction item it is listed as --
    before, it became a user message under the item's cmp_ id, and a stateless client resending
    the listed items no longer sent a compaction item."""
    client = proxy.openai(key)
    conv = long_conversation(client)
    upstream.enqueue_summary(Reply(content="SUMMARY: the facts, in short."))
    client.responses.compact(model=MODEL, extra_body={"conversation": conv.id})
    before = client.conversations.items.list(conv.id, order="asc", limit=100).data
    assert before[0].type == "compaction"
    client.conversations.items.delete(before[-1].id, conversation_id=conv.id)
    after = client.conversations.items.list(conv.id, order="asc", limit=100).data
    assert [i.id for i in after] == [i.id for i in before[:-1]]
    assert after[0].type == "compaction" and summary_text(after[0]) == summary_text(before[0])
    client.responses.create(model=MODEL, conversation=conv.id, input="q")
    sent = contents(upstream.last.messages)
    assert "SUMMARY: the facts, in short." in sent[0] and item_text(before[-1]) not in sent


def test_a_conversation_call_with_a_compaction_item_in_its_input_continues_from_the_head(proxy, upstream, key, db):
    """``conversation=``: the input holds new items, whatever they are -- a compaction item among
    them (its own conversation's or another's) is one of them, read as its summary; the call
    continues from the head, not from the compacted call the item names."""
    client = proxy.openai(key)
    a = long_conversation(client)
    upstream.enqueue_summary(Reply(content="SUMMARY OF A."))
    first = client.responses.create(model=MODEL, conversation=a.id, input="question one", context_management=CONTROL)
    compacted = first.output[0].model_dump(exclude_none=True)
    client.responses.create(model=MODEL, conversation=a.id, input="question two")
    b = client.conversations.create(items=[user_item("B's own context")])
    for conv, earlier in ((a, "question two"), (b, "B's own context")):
        head = db.head(conv.id)
        raw = client.responses.with_raw_response.create(model=MODEL, conversation=conv.id,
                                                        input=[compacted, user_item("q3")])
        assert raw.headers["x-parent-node-id"] == head
        sent = contents(upstream.last.messages)
        assert earlier in sent and sent[-2:] == [summary_text(first.output[0]), "q3"]


def test_compact_now_never_drops_the_input_it_is_given(proxy, upstream, key):
    """``POST /v1/responses/compact`` takes one of input, previous_response_id and conversation: with
    input and either of the others it is refused (400, ``param: input``) and nothing is stored --
    the input was silently dropped, and a client replacing its window with the answer lost it
    (stored first instead, a compaction that then failed left it in the conversation, added again
    by each retry)."""
    client = proxy.openai(key)
    conv = client.conversations.create(items=[user_item("word " * 40), user_item("more " * 40)])
    first = client.responses.create(model=MODEL, conversation=conv.id, input="q1")
    before = [item_text(i) for i in client.conversations.items.list(conv.id, order="asc").data]
    for named in ({"extra_body": {"conversation": conv.id}}, {"previous_response_id": first.id}):
        with pytest.raises(openai.BadRequestError) as both:
            client.responses.compact(model=MODEL, input=[user_item("NEW-INPUT-XYZ")], **named)
        assert both.value.body["param"] == "input"
    assert [item_text(i) for i in client.conversations.items.list(conv.id, order="asc").data] == before
    assert upstream.summariser_requests == []
    out = client.responses.compact(model=MODEL, input=[user_item("NEW-INPUT-XYZ")])  # (alone: compacted)
    assert out.output[0].type == "compaction"


def test_a_responses_input_items_after_a_compaction_are_the_conversations_items(proxy, upstream, key):
    """The input items of a response after a compaction are the conversation's items up to it --
    the compaction item, the kept ones, its own input -- and not the instructions the summary
    carries as context (never an item: not in the conversation's list, not in OpenAI's)."""
    client = proxy.openai(key)
    conv = long_conversation(client, 8)
    for q in ("q1", "q2", "q3"):
        client.responses.create(model=MODEL, conversation=conv.id, instructions="SYS-INSTR", input=q)
    client.responses.compact(model=MODEL, extra_body={"conversation": conv.id})
    last = client.responses.create(model=MODEL, conversation=conv.id, input="after")
    inputs = [i.model_dump(exclude_none=True) for i in client.responses.input_items.list(last.id, order="asc",
                                                                                            limit=100).data]
    listed = [i.model_dump(exclude_none=True) for i in client.conversations.items.list(conv.id, order="asc",
                                                                                         limit=100).data]
    assert inputs == listed[:-1] and inputs[0]["type"] == "compaction" and inputs[-1]["content"][0]["text"] == "after"
    assert all(i.get("role") not in ("system", "developer") for i in inputs)
