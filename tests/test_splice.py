"""The path cache's shortcut (docs/architecture.md#the-path-cache): splicing kept nodes' encoded
items must give the very bytes the long way (assemble + build_body) gives -- for any path,
including broken tool pairing, system messages, failed nodes and provider-specific fields."""

import uuid

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.assembly import SYSTEM_AT, Target, assemble, build_body, strip
from proxy.splice import EMPTY, segment, splice
from storage import PathCache, PathNode

from .helpers import assistant, system, tool, user

TARGETS = [Target("openai"), Target("other", accepts_reasoning=True)]


def _call(i):
    return {"id": f"call_{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}}


@st.composite
def items(draw, received=False):
    out = []
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(["user", "system", "tool", "assistant", "calls"] if not received
                                    else ["assistant", "calls", "reasoning"]))
        i = draw(st.integers(0, 4))
        if kind == "user":
            out.append(user(f"u{i}"))
        elif kind == "system":
            out.append({"role": "system", "content": f"s{i}"})
        elif kind == "tool":
            out.append(tool(f"call_{i}", f"r{i}"))
        elif kind == "assistant":
            out.append(assistant(f"a{i}"))
        elif kind == "calls":
            out.append({"role": "assistant", "content": None,
                        "tool_calls": [_call(j) for j in range(i, i + draw(st.integers(1, 2)))]})
        else:
            out.append({"role": "assistant", "content": "x", "reasoning_content": "thought", "refusal": None,
                        "_bp_items": [{"type": "reasoning"}]})
    return out


@st.composite
def paths(draw):
    nodes, parent = [], None
    for _ in range(draw(st.integers(1, 8))):
        node = PathNode(id=uuid.uuid4(), parent_id=parent, kind="turn",
                        status=draw(st.sampled_from(["success", "success", "success", "failed"])),
                        sent=draw(items()), received=draw(items(received=True)),
                        provider=draw(st.sampled_from(["openai", "other"])))
        nodes.append(node)
        parent = node.id
    return nodes


@settings(max_examples=400, deadline=None)
@given(paths(), items(), st.sampled_from(TARGETS), st.sampled_from([None, []]))
def test_splice_gives_the_bytes_of_assembly(path, new, target, system_at):
    """... by the system rule (None), and for a full-history call that sent no system message ([])."""
    slow = assemble(path, new, target, system_at)
    prefix, before = EMPTY, None
    for node in path:
        before = segment(node, before, target)
        prefix = prefix.extend(before.settled)
    spliced = splice(prefix, before, new, system_at=system_at)
    if spliced is None:  # the path's own pairing is broken: the long way is taken
        assert slow.dropped
        return
    messages, dropped = spliced
    assert dropped == slow.dropped
    assert build_body({"model": "m"}, messages, stream=False) == \
        build_body({"model": "m"}, strip(slow.messages), stream=False)


def _line(n, tree_parent=None):
    nodes, parent = [], tree_parent
    for i in range(n):
        node = PathNode(id=uuid.uuid4(), parent_id=parent, kind="turn", status="success",
                        sent=[user(f"q{i}")], received=[assistant(f"a{i}")], provider="openai")
        nodes.append(node)
        parent = node.id
    return nodes


def test_the_cache_completes_a_read_that_stopped_at_a_known_node():
    cache = PathCache(1 << 20)
    tree = uuid.uuid4()
    line = _line(5)
    assert cache.complete("t", "c", tree, None, line[:3]) == line[:3]
    assert cache.known("t", "c", None) == [line[2].id]
    # the next read stops above node 2: it returns nodes 3 and 4 only
    assert cache.complete("t", "c", tree, line[2].id, line[3:]) == line
    assert cache.hits == 3 and cache.reads == 5
    assert line[4].id in cache.known("t", "c", None)
    # an explicit parent that is kept is known too
    assert line[1].id in cache.known("t", "c", line[1].id)
    assert cache.known("t", "other conversation", None) == []


def test_pending_nodes_and_what_hangs_below_them_are_not_kept():
    cache = PathCache(1 << 20)
    tree = uuid.uuid4()
    line = _line(3)
    pending = PathNode(id=line[1].id, parent_id=line[0].id, kind="turn", status="pending", sent=[user("q1")])
    cache.complete("t", "c", tree, None, [line[0], pending, line[2]])
    assert cache.entry(tree, line[0].id) is not None
    assert cache.entry(tree, line[1].id) is None and cache.entry(tree, line[2].id) is None
    assert cache.chain(tree, line[2].id) is None


def test_whole_trees_are_evicted_least_recently_used_first():
    line_a, line_b = _line(20), _line(20)
    cache = PathCache(1 << 20)
    cache.complete("t", "a", uuid.UUID(int=1), None, line_a)
    size_a = cache.nbytes
    cache = PathCache(size_a + size_a // 2)  # room for one tree and a half
    cache.complete("t", "a", uuid.UUID(int=1), None, line_a)
    cache.complete("t", "b", uuid.UUID(int=2), None, line_b)
    assert cache.chain(uuid.UUID(int=1), line_a[-1].id) is None  # a went, b (the newest) stays
    assert cache.chain(uuid.UUID(int=2), line_b[-1].id) == line_b
    assert cache.nbytes <= cache.max_bytes
    # a read that stopped at a node evicted meanwhile cannot be completed: the caller reads it all
    assert cache.complete("t", "a", uuid.UUID(int=1), line_a[9].id, line_a[10:]) is None


def test_a_tree_larger_than_the_whole_budget_is_not_kept():
    line = _line(20)
    cache = PathCache(1000)
    assert cache.complete("t", "c", uuid.UUID(int=3), None, line) == line  # the caller still gets its path
    assert cache.nbytes == 0 and cache.chain(uuid.UUID(int=3), line[-1].id) is None


def test_a_zero_budget_keeps_nothing():
    cache = PathCache(0)
    line = _line(3)
    assert cache.complete("t", "c", uuid.uuid4(), None, line) == line
    assert cache.known("t", "c", None) == [] and cache.nbytes == 0


@settings(max_examples=150, deadline=None)
@given(paths(), st.lists(st.tuples(st.integers(0, 7), st.sampled_from(TARGETS)), min_size=1, max_size=8), items(),
       st.sampled_from([{}, {SYSTEM_AT: []}]))
def test_the_builder_resumes_from_kept_prefixes_and_still_gives_the_same_bytes(path, calls, new, layout):
    """Calls under different nodes of one kept chain, in any order and for changing targets, by
    the system rule or as a full-history call without system messages: each body equals the one
    assembled the long way."""
    from proxy.builder import RequestBuilder

    class _Tree:
        cache = PathCache(1 << 24)

    tree_id = uuid.uuid4()
    _Tree.cache.complete("t", "c", tree_id, None, path)
    builder = RequestBuilder(_Tree())  # type: ignore[arg-type]
    for index, target in calls:
        sub = path[:min(index, len(path) - 1) + 1]
        fast = builder.build(sub, new, {"model": "m", **layout}, target, stream=False, tree_id=tree_id)
        slow = builder.build(sub, new, {"model": "m", **layout}, target, stream=False)
        assert fast.payload == slow.payload and fast.dropped == slow.dropped


def test_a_full_history_call_without_system_messages_is_spliced(monkeypatch):
    """(no system message of the client's: none is sent, and the kept prefix is still spliced in)"""
    from proxy import builder as builder_module
    from proxy.builder import RequestBuilder

    class _Tree:
        cache = PathCache(1 << 24)

    path = _line(3)
    path[0].sent.insert(0, system("stored prompt"))
    tree_id = uuid.uuid4()
    _Tree.cache.complete("t", "c", tree_id, None, path)
    spliced = []
    monkeypatch.setattr(builder_module, "splice", lambda *a, **k: spliced.append(1) or splice(*a, **k))
    built = RequestBuilder(_Tree()).build(path, [user("next")], {"model": "m", SYSTEM_AT: []}, TARGETS[0],  # type: ignore[arg-type]
                                          stream=False, tree_id=tree_id)
    assert spliced and b"stored prompt" not in built.payload and b'"next"' in built.payload
