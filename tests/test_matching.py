"""Matching a resent history onto the tree: the canonical form (unit), the hash chain that SQL keeps
equal to the one computed from the items, and the property that makes full-history mode correct --
the context assembled from the match plus what is new equals, by meaning, what the client sent --
checked with hypothesis over random trees and random echo shapes against the real database."""

from __future__ import annotations

import json
import uuid
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.assembly import Target, assemble
from storage import AdminStore, CallStart, TreeStore, open_database, transcript, uuid7
from storage.transcript import canonical, digest, node_keys

from .conftest import Db, run
from .helpers import assistant, system, tool, tool_call, user


def test_content_forms_that_mean_the_same_compare_equal():
    assert digest(user("hi there")) == digest(user([{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]))
    assert digest(assistant(None, tool_calls=[tool_call("c")])) == digest(
        {"role": "assistant", "content": "", "tool_calls": [tool_call("c")], "refusal": None, "annotations": []})
    assert digest({"role": "assistant", "tool_calls": [tool_call("c")]}) == digest(assistant(None, tool_calls=[tool_call("c")]))
    assert digest(assistant("x", reasoning_content="hmm", audio=None)) == digest(assistant("x"))
    assert digest(user("hi")) != digest(user("hi!"))
    assert digest(user("hi")) != digest(assistant("hi"))  # the role compares
    assert digest({"role": "user", "content": "hi", "name": "ann"}) != digest(user("hi"))  # so does the name
    image = {"type": "image_url", "image_url": {"url": "data:x"}}
    assert digest(user([{"type": "text", "text": "see"}, image])) != digest(user("see"))
    assert canonical(system("s")) is None and canonical({"role": "developer", "content": "d"}) is None
    # arguments as parsed JSON: a whole number is one number, with or without its ".0"; others compare
    assert digest(assistant(None, tool_calls=[tool_call("c", args='{"a": 20.0, "b": [1.0, {"c": -0.0}]}')])) == \
        digest(assistant(None, tool_calls=[tool_call("c", args='{"b":[1,{"c":0}],"a":20}')]))
    assert digest(assistant(None, tool_calls=[tool_call("c", args='{"a": 20.5}')])) != \
        digest(assistant(None, tool_calls=[tool_call("c", args='{"a": 20}')]))
    assert digest(assistant(None, tool_calls=[tool_call("c", args='{"a": "20.0"}')])) != \
        digest(assistant(None, tool_calls=[tool_call("c", args='{"a": "20"}')]))
    # a key whose value is false or null is absent, at any depth (defaults a client's schema fills in)
    edit = '{"file_path": "a", "old_string": "x", "new_string": "y"}'
    assert digest(assistant(None, tool_calls=[tool_call("c", args=edit)])) == digest(assistant(None, tool_calls=[
        tool_call("c", args='{"replace_all": false, "file_path": "a", "old_string": "x", "new_string": "y", "n": null}')]))
    assert digest(assistant(None, tool_calls=[tool_call("c", args='{"edits": [{"a": 1}]}')])) == digest(assistant(
        None, tool_calls=[tool_call("c", args='{"edits": [{"a": 1, "all": false}]}')]))
    assert digest(assistant(None, tool_calls=[tool_call("c", args='{"a": null}')])) == digest(assistant(
        None, tool_calls=[tool_call("c", args="")]))
    for other in ('{"all": true}', '{"all": 0}', '{"all": ""}', '{"all": []}', '{"all": "false"}'):
        assert digest(assistant(None, tool_calls=[tool_call("c", args=other)])) != digest(assistant(
            None, tool_calls=[tool_call("c", args="{}")])), other


def test_the_edges_of_a_text_do_not_count_but_its_inside_does():
    assert digest(user("hi there")) == digest(user("\n\n  hi there \t\n")) == digest(
        user([{"type": "text", "text": "\nhi "}, {"type": "text", "text": "there\n\n"}]))
    assert digest(assistant("   ")) == digest(assistant(None)) == digest({"role": "assistant"})
    assert digest(tool("c", "r\n")) == digest(tool("c", "r"))
    image = {"type": "image_url", "image_url": {"url": "data:x"}}
    assert digest(user([{"type": "text", "text": " see\n"}, image])) == digest(user([{"type": "text", "text": "see"}, image]))
    for other in ("hi  there", "hi\nthere", "hithere", "hi there!"):
        assert digest(user("hi there")) != digest(user(other)), other
    # tool-call arguments that are not JSON compare as they are; the system hash keeps its texts
    assert digest(assistant(None, tool_calls=[tool_call("c", "f", "x ")])) != digest(
        assistant(None, tool_calls=[tool_call("c", "f", "x")]))
    assert transcript.system_hash([system("s\n")]) != transcript.system_hash([system("s")])


def test_tool_call_arguments_compare_as_json():
    a = assistant(None, tool_calls=[tool_call("c", "f", '{"a": 1, "b": [1, 2]}')])
    b = {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                              "function": {"name": "f", "arguments": '{"b":[1,2],"a":1}'}}]}
    untyped = {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": '{"a":1,"b":[1,2]}'}}]}
    assert digest(a) == digest(b) == digest(untyped)
    assert digest(a) != digest(assistant(None, tool_calls=[tool_call("c", "f", '{"a": 2, "b": [1, 2]}')]))
    assert digest(a) != digest(assistant(None, tool_calls=[tool_call("d", "f", '{"a": 1, "b": [1, 2]}')]))
    broken = assistant(None, tool_calls=[tool_call("c", "f", "{not json")])
    assert digest(broken) == digest(assistant(None, tool_calls=[tool_call("c", "f", "{not json")]))
    legacy = {"role": "assistant", "content": None, "function_call": {"name": "f", "arguments": '{"x": 1}'}}
    assert digest(legacy) == digest({"role": "assistant", "function_call": {"name": "f", "arguments": '{ "x":1 }'}})
    assert digest(tool("c", "r")) != digest(tool("d", "r"))
    # no arguments, however said: a model's "" comes back as "{}" from LangChain, null from others
    none = [digest(assistant(None, tool_calls=[tool_call("c", "f", args)])) for args in ("", "{}", None, "{ }")]
    assert len(set(none)) == 1
    assert digest(assistant(None, tool_calls=[tool_call("c", "f", "[]")])) not in none


def test_a_cache_control_marker_on_a_part_does_not_count():
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    marked = {**image, "cache_control": {"type": "ephemeral"}}
    assert digest(user([{"type": "text", "text": "what?"}, marked])) == digest(user([{"type": "text", "text": "what?"}, image]))
    other = {"type": "image_url", "image_url": {"url": "data:image/png;base64,BBBB"}}
    assert digest(user([{"type": "text", "text": "what?"}, image])) != digest(user([{"type": "text", "text": "what?"}, other]))


def test_chains_kept_by_sql_equal_the_ones_computed_from_the_items(proxy, upstream, key, cid, db: Db):
    """bp_begin_call/bp_finish_call fold the chain in SQL; node_keys computes it from the stored
    items (migrations, imports). They must agree, through successes, failures and tool rounds."""
    from .fakes import Reply

    client = proxy.openai(key, conversation=cid)
    upstream.enqueue(Reply(content=None, tool_calls=[tool_call("call_a", "f", '{"q": 1}')]))
    client.chat.completions.create(model="m", messages=[system("s"), user("go")])
    client.chat.completions.create(model="m", messages=[tool("call_a", "result")])
    upstream.enqueue(Reply(kind="error", status=500))
    try:
        client.chat.completions.create(model="m", messages=[user("fails")])
    except Exception:
        pass
    client.chat.completions.create(model="m", messages=[user("continue")], extra_headers={"X-Context-Mode": "delta"})
    rows = db.fetch("SELECT * FROM nodes WHERE conversation_id = $1", cid)
    nodes = [{**dict(r), "sent": r["sent"], "received": r["received"]} for r in rows]
    keys = node_keys(nodes)
    assert len(rows) == 4
    for r in rows:
        k = keys[r["id"]]
        assert (bytes(r["chain"]), r["answered"], bytes(r["system_hash"]) if r["system_hash"] else None) == \
               (k.chain, k.answered, k.system_hash), r["id"]


# -- the property ------------------------------------------------------------------------------

WORDS = st.sampled_from(["hi", "yes", "no", "why?", "ok", "tell me more"])


@st.composite
def trees(draw: Any) -> list[dict[str, Any]]:
    """Random trees of stored calls: each node answers its parent's tool calls when it made some,
    else asks something; it succeeds (an answer, maybe with tool calls) or fails transiently."""
    nodes: list[dict[str, Any]] = []
    for i in range(draw(st.integers(1, 12))):
        parent = draw(st.sampled_from([None, *[n["id"] for n in nodes]])) if nodes and draw(st.booleans()) else (
            nodes[-1]["id"] if nodes else None)
        up = next((n for n in nodes if n["id"] == parent), None)
        calls = [c["id"] for m in (up["received"] or []) for c in m.get("tool_calls") or []] if up else []
        if calls:
            sent = [tool(c, draw(WORDS)) for c in calls]
        else:
            sent = [user(draw(WORDS))]
            if draw(st.integers(0, 4)) == 0:
                sent.insert(0, system(draw(st.sampled_from(["be brief", "be kind"]))))
        ok = draw(st.integers(0, 5)) > 0
        received = None
        if ok:
            if draw(st.booleans()):
                received = [{"role": "assistant", "content": draw(WORDS), "refusal": None, "annotations": []}]
            else:
                n_calls = draw(st.integers(1, 2))
                received = [{"role": "assistant", "content": None, "refusal": None, "tool_calls": [
                    tool_call(f"call_{i}_{j}", "lookup", json.dumps({"q": draw(WORDS), "n": j}))
                    for j in range(n_calls)]}]
        nodes.append({"id": uuid7(), "parent_id": parent, "kind": "turn", "outcome": "success" if ok else "transient",
                      "sent": sent, "received": received, "compacted_from": None})
    return nodes


def _path(nodes: list[dict[str, Any]], node_id: Any) -> list[dict[str, Any]]:
    by_id = {n["id"]: n for n in nodes}
    out = []
    while node_id is not None:
        out.append(by_id[node_id])
        node_id = by_id[node_id]["parent_id"]
    return out[::-1]


def _echo(message: dict[str, Any], data: Any) -> dict[str, Any]:
    """How a framework might echo a message back: same meaning, different shape."""
    m = {k: v for k, v in message.items() if k not in ("refusal", "annotations") or data.draw(st.booleans())}
    if isinstance(m.get("content"), str) and m["content"] and data.draw(st.booleans()):
        text = m["content"]
        cut = data.draw(st.integers(0, len(text)))
        m["content"] = [{"type": "text", "text": text[:cut]}, {"type": "text", "text": text[cut:]}]
    if m.get("content") is None and data.draw(st.booleans()):
        del m["content"]
    if m.get("tool_calls"):
        m["tool_calls"] = [{"id": c["id"], "function": {"name": c["function"]["name"], "arguments": json.dumps(
            json.loads(c["function"]["arguments"]), indent=data.draw(st.sampled_from([None, 1])),
            sort_keys=data.draw(st.booleans()))}} for c in m["tool_calls"]]
    return m


def _meaning(messages: list[dict[str, Any]]) -> list[Any]:
    return [canonical(m) for m in messages if canonical(m) is not None]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(nodes=trees(), data=st.data())
def test_match_plus_remainder_is_what_the_client_sent(fresh_database_url, nodes, data):
    target = data.draw(st.sampled_from(nodes))
    history: list[dict[str, Any]] = []
    for n in _path(nodes, target["id"]):
        history += [_echo(m, data) for m in n["sent"] if canonical(m) is not None]
        if n["outcome"] == "success":
            history += [_echo(m, data) for m in n["received"]]
    calls = [c["id"] for c in (history[-1].get("tool_calls") or [])] if history else []
    new = [tool(c, "fresh") for c in calls] if calls else [user(data.draw(WORDS)) for _ in range(data.draw(st.integers(0, 2)))]
    client = history + new
    if not _meaning(client):
        return
    tenant = f"t_{uuid.uuid4().hex}"

    async def go() -> tuple[Any, list[Any]]:
        db = await open_database(fresh_database_url, min_size=1, max_size=2, connect_timeout=30)  # (a loaded machine)
        try:
            keys = node_keys(nodes)
            rows = [{**n, "depth": len(_path(nodes, n["id"])) - 1, "created_at": f"2026-01-01T00:00:{i:02d}Z",
                     "finished_at": f"2026-01-01T00:00:{i:02d}Z",
                     "model": "m", "provider": "p", "params": {}, "usage": None, "finish_reason": None,
                     "error": None if n["outcome"] == "success" else {"type": "x", "code": "x", "message": "x", "status": 500},
                     "chain": keys[n["id"]].chain.hex(), "answered": keys[n["id"]].answered,
                     "system_hash": keys[n["id"]].system_hash.hex() if keys[n["id"]].system_hash else None}
                    for i, n in enumerate(nodes)]
            assert await AdminStore(db).import_tree(tenant, "c", rows, None, 0) == len(nodes)
            digests = transcript.digests(client)
            begun = await TreeStore(db).begin_call(CallStart(
                tenant=tenant, conversation_id="c", node_id=uuid7(), new_tree_id=uuid7(), kind="turn", mode="full",
                parent_mode="head", parent_id=None, sent=client, digests=digests,
                prefixes=transcript.prefix_hashes(digests), system_hash=transcript.system_hash(client),
                lease_seconds=30, model="m", provider="p", params={}))
            return begun, client
        finally:
            await db.close()

    begun, client = run(go())
    new_items = transcript.tail(client, begun.start, with_system=begun.with_system)
    assembled = assemble(begun.path, new_items, Target("p"))
    assert assembled.dropped == []
    assert _meaning(assembled.messages) == _meaning(client)
    assert begun.matched >= len(_meaning(history))  # at least the target itself matched
    assert begun.mode == "full"



def test_the_fast_digest_is_the_general_one():
    import hashlib

    from storage.transcript import _encode

    for m in (user("plain"), assistant("x", refusal=None, tool_calls=None), {"role": "user", "content": ""},
              {"role": "user", "content": 'quote " and \\u00e9 \u00e9'}, {"role": None, "content": "no role"},
              {"role": "assistant", "content": "named", "name": None}, user("\n padded \t"), user("   "),
              {"role": "user", "content": "empty name", "name": ""}, {"role": "tool", "content": "r", "tool_call_id": ""},
              {"role": "assistant", "content": "legacy", "function_call": {}}):
        assert digest(m) == hashlib.sha256(_encode(canonical(m))).digest(), m
    # an empty name is no name, whatever the content's form (a string, or text parts)
    for m in ({"role": "user", "content": "hi", "name": ""}, {"role": "user", "content": [{"type": "text", "text": "hi"}],
                                                              "name": ""}):
        assert digest(m) == digest(user("hi")), m


def test_bp_tail_cuts_as_the_python_tail_does(db: Db):
    """bp_tail's jsonpath slices (system items first, or none) and its general query agree with
    transcript.tail on every layout -- system items anywhere, shared ones, roles that only look
    like a system role to a lax jsonpath (a list, an object), items that are no objects."""
    import random

    shapes = [system("s"), {"role": "developer", "content": "d"}, user("u"), assistant("a"), tool("c", "r"),
              {"_bp_shared": "ab" * 32, "role": "system"}, {"role": ["system"], "content": "x"},
              {"role": {"r": "system"}}, {"role": 5}, {"content": "no role"}, "text", [system("inside a list")],
              {"role": None}]
    rng = random.Random(4)
    cases = []
    for _ in range(300):
        n = rng.randrange(7)
        if rng.random() < 0.5:  # the usual layout: system items first
            items = [rng.choice(shapes[:2] + shapes[5:6]) for _ in range(rng.randrange(3))] + [
                rng.choice(shapes[2:5]) for _ in range(n)]
        else:
            items = [rng.choice(shapes) for _ in range(n)]
        for skip in range(len(items) + 2):
            for with_system in (False, True):
                cases.append({"items": items, "skip": skip, "with_system": with_system})
    got = db.fetch("SELECT bp_tail(c.items, c.skip, c.with_system) AS t "
                   "FROM ROWS FROM (jsonb_to_recordset($1::jsonb) AS (items jsonb, skip integer, with_system boolean)) "
                   "WITH ORDINALITY AS c(items, skip, with_system, i) ORDER BY c.i", cases)
    assert len(got) == len(cases)
    for case, row in zip(cases, got, strict=True):
        expected = transcript.tail(case["items"], case["skip"], with_system=case["with_system"])
        assert row["t"] == expected, case
