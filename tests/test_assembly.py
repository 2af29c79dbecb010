"""Assembly (docs/behaviour.md#assembly) as a pure function: path rows + new items -> upstream messages."""

import uuid

from proxy.assembly import Target, assemble, pair_check, shape_received
from storage import PathNode

from .helpers import assistant, tool, user

T = Target("openai")


def node(sent, received=None, status="success", provider="openai", parent=True):
    return PathNode(id=uuid.uuid4(), parent_id=uuid.uuid4() if parent else None, kind="turn", status=status,
                    sent=sent, received=received, provider=provider)


def call(id_, name="lookup", args="{}"):
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": args}}


def test_sent_then_received_root_first_then_new_items():
    path = [node([user("a")], [assistant("A")], parent=False), node([user("b")], [assistant("B")])]
    out = assemble(path, [user("c")], T)
    assert out.messages == [user("a"), assistant("A"), user("b"), assistant("B"), user("c")]
    assert out.dropped == []


def test_failed_and_pending_nodes_contribute_only_sent():
    path = [
        node([user("a")], [assistant("A")], parent=False),
        node([user("b")], [assistant("never seen")], status="failed"),
        node([user("c")], [assistant("also never")], status="pending"),
    ]
    out = assemble(path, [user("d")], T)
    assert out.messages == [user("a"), assistant("A"), user("b"), user("c"), user("d")]


def test_system_prompt_sent_once_first_and_most_recent_wins():
    sys1 = {"role": "system", "content": "be brief"}
    path = [node([sys1, user("a")], [assistant("A")], parent=False), node([user("b")], [assistant("B")])]
    out = assemble(path, [user("c")], T)
    assert out.messages[0] == sys1
    assert sum(m["role"] == "system" for m in out.messages) == 1

    sys2 = {"role": "developer", "content": "be verbose"}
    out = assemble(path, [sys2, user("c")], T)
    assert out.messages[0] == sys2
    assert sys1 not in out.messages

    # a later node's system prompt wins over an earlier one; several of one node stay together
    sys3 = [{"role": "system", "content": "x"}, {"role": "developer", "content": "y"}]
    path2 = path + [node([*sys3, user("c")], [assistant("C")])]
    out = assemble(path2, [user("d")], T)
    assert out.messages[:2] == sys3
    assert sys1 not in out.messages


def test_tool_rounds_pair_across_nodes():
    path = [
        node([user("q")], [assistant(None, tool_calls=[call("c1"), call("c2")])], parent=False),
        node([tool("c1", "r1"), tool("c2", "r2")], [assistant("answer")]),
    ]
    out = assemble(path, [user("next")], T)
    assert out.dropped == []
    assert [m["role"] for m in out.messages] == ["user", "assistant", "tool", "tool", "assistant", "user"]


def test_pairing_check_drops_unanswered_calls_and_orphans():
    items = [
        user("q"),
        assistant(None, tool_calls=[call("c1")]),
        user("never mind"),  # the turn was abandoned: no tool result
        tool("ghost", "orphan result"),
        assistant("partial", tool_calls=[call("c2"), call("c3")]),
        tool("c2", "r2"),
    ]
    kept, dropped = pair_check(items)
    assert kept == [
        user("q"),
        user("never mind"),
        {"role": "assistant", "content": "partial", "tool_calls": [call("c2")]},
        tool("c2", "r2"),
    ]
    reasons = sorted(d.get("tool_call_id") or d.get("message") for d in dropped)
    assert reasons == ["assistant", "c1", "c3", "ghost"]


def test_pairing_check_drops_result_before_its_call():
    items = [user("q"), tool("c1", "early"), assistant(None, tool_calls=[call("c1")])]
    kept, dropped = pair_check(items)
    assert kept == [user("q")]
    assert len(dropped) == 3  # the early result, the call, and the then-empty assistant message


def test_shape_received_keeps_portable_fields_and_reasoning_only_where_accepted():
    msg = {"role": "assistant", "content": "hi", "refusal": None, "annotations": [], "audio": None,
           "reasoning_content": "thinking", "reasoning_details": [{"type": "encrypted", "data": "x"}],
           "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}, "index": 0}]}
    plain = shape_received(msg, Target("openai", accepts_reasoning=False), "openai")
    assert plain == {"role": "assistant", "content": "hi",
                     "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    same = shape_received(msg, Target("deepseek", accepts_reasoning=True), "deepseek")
    assert same["reasoning_content"] == "thinking" and "reasoning_details" in same
    other = shape_received(msg, Target("deepseek", accepts_reasoning=True), "openrouter")
    assert other["reasoning_content"] == "thinking" and "reasoning_details" not in other
    empty = shape_received({"role": "assistant", "content": None}, T, "openai")
    assert empty == {"role": "assistant", "content": ""}


def test_pairing_is_strict_a_late_result_is_dropped_with_its_call():
    # a turn abandoned between rounds, then a late tool result: the API refuses
    # assistant(tool_calls) -> user -> ... -> tool, so both the call and the late result go
    items = [user("q"), assistant(None, tool_calls=[call("c1")]), user("never mind"), assistant("ok"),
             tool("c1", "late result"), user("next")]
    kept, dropped = pair_check(items)
    assert kept == [user("q"), user("never mind"), assistant("ok"), user("next")]
    assert sorted(d.get("tool_call_id") or d["message"] for d in dropped) == ["assistant", "c1", "c1"]


def test_pairing_drops_a_second_result_for_the_same_call():
    items = [user("q"), assistant(None, tool_calls=[call("c1"), call("c2")]), tool("c2", "b"), tool("c1", "a"),
             tool("c1", "again"), assistant("done")]
    kept, dropped = pair_check(items)
    assert kept == items[:4] + [assistant("done")]  # results in any order; the duplicate goes
    assert dropped == [{"tool_call_id": "c1", "reason": "a second result for the same call"}]


def test_a_well_paired_list_is_unchanged():
    items = [user("q"), assistant(None, tool_calls=[call("c1")]), tool("c1", "r"), assistant("a"), user("more")]
    assert pair_check(items) == (items, [])


def test_a_compaction_node_carries_answers_whole_and_each_provider_gets_its_own_shape():
    """``carried``: what a compaction node keeps of an answer -- normalised as any answer is (a
    missing role is the assistant's), every kind of reasoning kept with its producer; assembly
    shapes it for each call's provider. Only a compaction node's items are read so: an item of
    another node that happens to hold the marker is sent as it is."""
    from proxy.assembly import CARRIED, carried

    answer = {"content": "42", "reasoning_content": "6 times 7", "thinking_blocks": [{"signature": "s"}],
              "tool_calls": None, "audio": None}
    _, items = carried(node([user("q")], [answer], provider="deepseek"))
    assert items[1] == {"role": "assistant", "content": "42", "reasoning_content": "6 times 7",
                        "thinking_blocks": [{"signature": "s"}], CARRIED: "deepseek"}
    compaction = PathNode(id=uuid.uuid4(), parent_id=None, kind="compaction", status="success", sent=items,
                          received=None, provider="deepseek")
    same = assemble([compaction], [], Target("deepseek", accepts_reasoning=True)).messages
    assert same[1] == {"role": "assistant", "content": "42", "reasoning_content": "6 times 7",
                       "thinking_blocks": [{"signature": "s"}]}
    other = assemble([compaction], [], Target("other", accepts_reasoning=True)).messages
    assert other[1] == {"role": "assistant", "content": "42", "reasoning_content": "6 times 7"}
    plain = assemble([compaction], [], T).messages
    assert plain[1] == {"role": "assistant", "content": "42"}
    odd = {"role": "user", "content": "r", CARRIED: "openai"}
    assert assemble([node([odd], None, parent=False)], [], T).messages == [odd]


def test_an_audio_answer_goes_to_another_provider_or_api_as_its_transcript():
    import time
    msg = {"role": "assistant", "content": None,
           "audio": {"id": "audio_1", "data": "AAAA", "expires_at": int(time.time()) + 600, "transcript": "Paris."}}
    assert shape_received(msg, Target("openai"), "openai") == {"role": "assistant", "audio": {"id": "audio_1"},
                                                                "content": None}
    for target in (Target("groq"), Target("openai", api="responses"), Target("openai", api="anthropic")):
        assert shape_received(msg, target, "openai") == {"role": "assistant", "content": "Paris."}
    # text beside the audio stays the content (the transcript is not added to it)
    assert shape_received({**msg, "content": "Paris!"}, Target("groq"), "openai") == {"role": "assistant",
                                                                                       "content": "Paris!"}


def test_an_audio_answer_a_compaction_carries_keeps_what_shapes_it_later(monkeypatch):
    """A summary's node carries answers raw (``carried``): an audio answer among them keeps its id,
    expiry and transcript (not its data), so each later call gets it as its provider takes it --
    the reference while the maker keeps it, the transcript once it expired or for anyone else."""
    import time

    import proxy.assembly
    from proxy.assembly import carried

    audio = {"id": "audio_1", "data": "AAAA", "expires_at": int(time.time()) + 600, "transcript": "Paris."}
    turn = PathNode(id=uuid.uuid4(), parent_id=None, kind="turn", status="success", provider="openai",
                    sent=[{"role": "user", "content": "capital of France?"}],
                    received=[{"role": "assistant", "content": None, "audio": audio}])
    _, items = carried(turn)
    assert items[1]["audio"] == {"id": "audio_1", "expires_at": audio["expires_at"], "transcript": "Paris."}
    compaction = PathNode(id=uuid.uuid4(), parent_id=None, kind="compaction", status="success", sent=items,
                          received=None, provider="openai")
    assert assemble([compaction], [], Target("openai")).messages[1] == {
        "role": "assistant", "audio": {"id": "audio_1"}, "content": None}
    assert assemble([compaction], [], Target("groq")).messages[1] == {"role": "assistant", "content": "Paris."}
    later = time.time() + 3600
    monkeypatch.setattr(proxy.assembly.time, "time", lambda: later)
    assert assemble([compaction], [], Target("openai")).messages[1] == {"role": "assistant", "content": "Paris."}
    # an audio answer that says no expiry is not taken as kept
    no_expiry = {"role": "assistant", "content": None, "audio": {"id": "audio_2", "transcript": "Rome."}}
    assert shape_received(no_expiry, Target("openai"), "openai") == {"role": "assistant", "content": "Rome."}
