"""Context editing as a property over generated agent sessions (docs/behaviour.md#context-editing),
without a database: the same pure functions the proxy runs -- ``clearing.plan``, assembly and
each dialect's request body -- over paths of chat, Responses and Anthropic nodes, with the
compactor's rule (clear above the threshold when it frees at least ``clear_at_least``).

For every generated session and every call:
- between two clearings, each upstream request extends the one before byte for byte;
- a clearing frees at least ``clear_at_least`` and keeps the most recent results, the excluded
  tools' and every call/result pair (the pairing check drops nothing);
- a placeholder names the node whose items hold the original, and only contents change.
"""

from __future__ import annotations

import uuid
from typing import Any

from hypothesis import event as hyp_event
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.assembly import Target, assemble
from proxy.compaction.clearing import is_cleared, plan
from proxy.dialects import dialect, message_path
from proxy.dialects.messages.blocks import fragments, to_anthropic
from proxy.dialects.responses.outbound import to_items
from storage import PathNode

from .helpers import prefix_extends

EXCLUDED = frozenset({"memory"})
THRESHOLD, AT_LEAST = 600, 150  # tokens


def count(message: dict[str, Any]) -> int:
    """A message's tokens, cheaply (the compactor counts with tiktoken; the property does not
    depend on how)."""
    content = message.get("content")
    text = content if isinstance(content, str) else str(content or "")
    return 3 + len(text) // 4 + sum(len(str(c)) // 4 for c in message.get("tool_calls") or ())


@st.composite
def sessions(draw: Any) -> list[dict[str, Any]]:
    """An agent session: rounds of a task, the model's tool calls, their results, an answer."""
    rounds = []
    for r in range(draw(st.integers(3, 14))):
        calls = [(f"c{r}_{k}", draw(st.sampled_from(["read_file", "shell", "memory"])),
                  draw(st.integers(0, 900))) for k in range(draw(st.integers(0, 3)))]
        rounds.append({"task": f"task {r}" + " more" * draw(st.integers(0, 40)), "calls": calls,
                       "answer": f"answer {r}", "system": r == 0 or draw(st.booleans())})
    return rounds


def _node(sent: list[dict[str, Any]], received: list[dict[str, Any]], api: str, parent: uuid.UUID | None) -> PathNode:
    """A finished node as a client of ``api`` would have made it (its items in that dialect)."""
    if api == "responses":
        sent, received = to_items(sent), to_items(received)
    elif api == "messages":
        system = next((m["content"] for m in sent if m["role"] == "system"), None)
        sent = fragments(system, to_anthropic([m for m in sent if m["role"] != "system"], None)[1])
        received = fragments(None, to_anthropic(received, None)[1])
    return PathNode(id=uuid.uuid4(), parent_id=parent, kind="turn", status="success", sent=sent, received=received,
                    provider="up", api=api)


def _calls(session: list[dict[str, Any]]) -> list[tuple[list[dict[str, Any]], dict[str, Any]]]:
    """The session as calls: (the new chat items a delta call sends, the model's answer)."""
    out = []
    for r in session:
        system = [{"role": "system", "content": "You are an agent."}] if r["system"] else []
        task = {"role": "user", "content": r["task"]}
        if not r["calls"]:
            out.append(([*system, task], {"role": "assistant", "content": r["answer"]}))
            continue
        tool_calls = [{"id": cid, "type": "function", "function": {"name": name, "arguments": "{}"}}
                      for cid, name, _ in r["calls"]]
        out.append(([*system, task], {"role": "assistant", "content": None, "tool_calls": tool_calls}))
        results = [{"role": "tool", "tool_call_id": cid, "content": f"{name} says " + "x" * size}
                   for cid, name, size in r["calls"]]
        out.append((results, {"role": "assistant", "content": r["answer"]}))
    return out


@settings(max_examples=150, deadline=None)
@given(session=sessions(), api=st.sampled_from(["chat", "responses", "messages"]), keep=st.integers(0, 6))
def test_requests_extend_each_other_between_clearings(session: list[dict[str, Any]], api: str, keep: int) -> None:
    target = Target("up", api="chat" if api == "chat" else ("responses" if api == "responses" else "messages"))
    upstream = dialect(api)
    path: list[PathNode] = []  # as assembly reads it: from the root (or the last clearing) down
    tree: dict[uuid.UUID, PathNode] = {}
    previous: bytes | None = None
    key = "messages" if api in ("chat", "messages") else "input"
    for new_chat, answer in _calls(session):
        new_items = dialect(api).to_messages(_node(new_chat, [], api, None).sent, "up") if api != "chat" else new_chat
        readable = message_path(path)
        unclear = assemble(readable, new_items, target)
        event = False
        if sum(count(m) for m in unclear.messages) > THRESHOLD and readable:
            planned = plan(readable, new_items, keep=keep, exclude=EXCLUDED, count=count)
            if planned.count and planned.freed >= AT_LEAST:
                event = True
                clearing = PathNode(id=uuid.uuid4(), parent_id=None, kind="compaction", status="success",
                                    sent=[*planned.system, *planned.items], provider="up",
                                    compacted_from=readable[-1].id)
                _check_plan(planned, readable, new_items, tree, keep)
                tree[clearing.id] = clearing
                hyp_event(f"a clearing ({api})")
                path, readable = [clearing], [clearing]
        assembled = assemble(readable, new_items, target)
        assert assembled.dropped == []  # calls and results stay paired
        assert _shape(assembled.messages) == _shape(unclear.messages)  # only contents changed
        body = upstream.request_body({"model": "m"}, assembled.messages, "up", stream=False)
        if previous is not None and not event:
            assert prefix_extends(previous, body, key), "a request between clearings did not extend the one before"
        previous = body
        node = _node(new_chat, [answer], api, path[-1].id if path else None)
        tree[node.id] = node
        path = [*path, node]


def _shape(messages: list[dict[str, Any]]) -> list[Any]:
    return [(m.get("role"), m.get("tool_call_id"), [c.get("id") for c in m.get("tool_calls") or ()]) for m in messages]


def _check_plan(planned: Any, path: list[PathNode], new_items: list[dict[str, Any]], tree: dict[uuid.UUID, PathNode],
                keep: int) -> None:
    assert planned.freed >= AT_LEAST
    results = [m for m in planned.items if m.get("role") == "tool"]
    newer = sum(1 for m in new_items if m.get("role") == "tool")
    in_path = max(0, keep - newer)
    kept = results[max(0, len(results) - in_path):] if in_path else []
    assert not any(is_cleared(m) for m in kept)  # the most recent are never cleared
    names = {c["id"]: c["function"]["name"] for m in planned.items for c in m.get("tool_calls") or ()}
    for entry in planned.cleared:
        assert entry["tool"] not in EXCLUDED and names[entry["tool_call_id"]] == entry["tool"]
        holder = tree[uuid.UUID(entry["node_id"])]  # a turn, or an earlier clearing that kept it whole
        originals = [m for m in message_path([holder])[0].sent if m.get("tool_call_id") == entry["tool_call_id"]]
        assert len(originals) == 1 and not is_cleared(originals[0])  # the node named holds the original
    for m in results:
        if is_cleared(m):
            assert m["content"].endswith("]") and " in node " in m["content"]


def test_fewer_results_than_kept_clears_none() -> None:
    """``keep`` larger than the path's results (and the call's own): nothing is cleared -- not the
    oldest ones by a slice counted from the end."""
    path: list[PathNode] = []
    for new_chat, answer in _calls([{"task": f"task {r}", "calls": [(f"c{r}", "shell", 900)], "answer": "ok",
                                     "system": r == 0} for r in range(2)]):
        node = _node(new_chat, [answer], "chat", path[-1].id if path else None)
        path.append(node)
    for keep in (2, 3, 5):
        assert plan(path, [], keep=keep, exclude=EXCLUDED, count=count).count == 0
    assert plan(path, [], keep=1, exclude=EXCLUDED, count=count).count == 1
    assert plan(path, [{"role": "tool", "tool_call_id": "x", "content": "new"}], keep=2, exclude=EXCLUDED,
                count=count).count == 1


def test_a_result_is_counted_once_across_plans() -> None:
    """Planning again (the next call, still above the clearing threshold) counts only what is new:
    a finished node's results were counted by the plan before, and the plan is the same."""
    path: list[PathNode] = []
    for new_chat, answer in _calls([{"task": f"task {r}", "calls": [(f"c{r}", "shell", 900)], "answer": "ok",
                                     "system": r == 0} for r in range(6)]):
        path.append(_node(new_chat, [answer], "chat", path[-1].id if path else None))
    counted: list[Any] = []

    def counting(message: dict[str, Any]) -> int:
        counted.append(message)
        return count(message)

    memo: dict[Any, Any] = {}
    first = plan(path, [], keep=2, exclude=EXCLUDED, count=counting, memo=memo)
    assert first.count == 4 and len(counted) == 8  # each result and its placeholder
    counted.clear()
    again = plan(path, [], keep=2, exclude=EXCLUDED, count=counting, memo=memo)
    assert len(counted) == 4 and all(is_cleared(m) for m in counted)  # (only the short placeholders)
    assert again.items == first.items and again.freed == first.freed
    assert again.cleared == first.cleared
    plain = plan(path, [], keep=2, exclude=EXCLUDED, count=count)
    assert plain.items == first.items and plain.freed == first.freed


def test_two_results_of_one_node_with_the_same_call_id_keep_their_own_placeholders() -> None:
    """A node may hold two results answering calls of the same id (a full-history first call, a
    model that numbers its calls per turn): each is planned as itself, memo or not."""
    call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]}
    again = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "grep", "arguments": "{}"}}]}
    sent = [{"role": "user", "content": "go"}, call, {"role": "tool", "tool_call_id": "c1", "content": "a" * 900},
            again, {"role": "tool", "tool_call_id": "c1", "name": "grep", "content": "b" * 900},
            {"role": "user", "content": "more"}]
    node = PathNode(id=uuid.uuid4(), parent_id=None, kind="turn", status="success", sent=sent,
                    received=[{"role": "assistant", "content": "ok"}], provider="up")
    plain = plan([node], [], keep=0, exclude=frozenset(), count=count)
    memo: dict[Any, Any] = {}
    memoised = plan([node], [], keep=0, exclude=frozenset(), count=count, memo=memo)
    assert plan([node], [], keep=0, exclude=frozenset(), count=count, memo=memo).items == plain.items
    assert memoised.items == plain.items
    results = [m for m in plain.items if m.get("role") == "tool"]
    assert results[1].get("name") == "grep" and all(is_cleared(m) for m in results)
