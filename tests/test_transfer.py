"""Export and import over the admin API (docs/behaviour.md#export-and-import): a tree goes out as
JSON Lines and comes back as a new conversation with the same shape and context; an import is
checked whole -- whatever a tenant sends, a file the tree could not take is a 400 and nothing is
written."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

import openai
import pytest

from .conftest import assert_invariants, make_settings, serve_proxy, tenant_of
from .fakes import Reply
from .helpers import say, tool, tool_call, user


def build(proxy: Any, upstream: Any, key: str, cid: str) -> dict[str, str]:
    """A conversation with a tool round, an edit (a branch), a side call and a failed call; the
    answer of the first question holds a NUL character."""
    client = proxy.openai(key)
    upstream.enqueue(Reply(content="sales were up\x00 3 %"))
    _, h1 = say(client, cid, user("How were sales?"))
    upstream.enqueue(Reply(content=None, tool_calls=[tool_call("call_1")]))
    _, h2 = say(client, cid, user("Query them."))
    _, h3 = say(client, cid, tool("call_1", "42 rows"))
    say(client, cid, user("Query them by region."), parent=h1["x-node-id"])
    say(client, cid, user("A title for this chat?"), kind="transform")
    upstream.enqueue(Reply(kind="error", status=500))
    with pytest.raises(Exception):  # noqa: B017 -- the SDK's error for a 500
        say(client, cid, user("and this one fails"))
    return {"q1": h1["x-node-id"], "q2": h2["x-node-id"], "tool": h3["x-node-id"]}


def export(proxy: Any, key: str, cid: str) -> list[dict[str, Any]]:
    r = proxy.http(key).get(f"/admin/conversations/{cid}/export")
    assert r.status_code == 200, r.text
    return [json.loads(line) for line in r.text.splitlines()]


def jsonl(lines: list[Any]) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def test_an_export_imports_as_a_conversation_with_the_same_tree_and_context(own_proxy, upstream, key, cid):
    proxy = own_proxy  # (a database of its own: the invariants are checked over all of it)
    build(proxy, upstream, key, cid)
    lines = export(proxy, key, cid)
    http = proxy.http(key)
    copy = f"{cid}-copy"
    r = http.post(f"/admin/conversations/{copy}/import", content=jsonl(lines))
    assert r.status_code == 201, r.text
    assert r.json()["id"] == copy and r.json()["node_count"] == len(lines) == 6

    def shape(conversation: str) -> list[Any]:
        return [(n["kind"], n["status"], n["outcome"], n["sent"], n["received"])
                for n in http.get(f"/admin/conversations/{conversation}/path").json()["data"]]

    assert shape(copy) == shape(cid)
    assert "\x00" in shape(copy)[0][4][0]["content"]  # kept losslessly, as the original
    copied = export(proxy, key, copy)
    assert {n["id"] for n in copied}.isdisjoint({n["id"] for n in lines})  # new ids
    assert [(n["kind"], n["outcome"], n["sent"], n["head"]) for n in copied] == \
           [(n["kind"], n["outcome"], n["sent"], n["head"]) for n in lines]
    # the next turn sees the same context in both
    client = proxy.openai(key)
    say(client, cid, user("next"))
    original = upstream.last.messages
    say(client, copy, user("next"))
    assert upstream.last.messages == original
    # the same id again: 409; another tenant does not see the copy
    again = http.post(f"/admin/conversations/{copy}/import", content=jsonl(lines))
    assert again.status_code == 409 and again.json()["error"]["code"] == "conversation_exists"
    assert proxy.http(f"sk-other-{uuid.uuid4().hex}").get(f"/admin/conversations/{copy}").status_code == 404
    assert_invariants(proxy.db.url)


def test_a_call_in_flight_when_exported_comes_back_interrupted(proxy, upstream, key, cid):
    build(proxy, upstream, key, cid)
    lines = export(proxy, key, cid)
    lines[-1].update(outcome=None, status="pending", error=None, finished_at=None, received=None, head=False)
    head = next(line for line in lines if line["sent"] == [user("Query them by region.")])
    head["head"], lines[0]["conversation"]["head_node_id"] = True, head["id"]
    r = proxy.http(key).post(f"/admin/conversations/{cid}-p/import", content=jsonl(lines))
    assert r.status_code == 201, r.text
    last = export(proxy, key, f"{cid}-p")[-1]
    assert last["status"] == "failed" and last["error"]["code"] == "interrupted"


def _mutations(lines: list[dict[str, Any]]) -> dict[str, bytes]:
    def changed(i: int, **fields: Any) -> bytes:
        copy = [dict(line) for line in lines]
        copy[i].update(fields)
        return jsonl(copy)

    without_id = [dict(line) for line in lines]
    del without_id[0]["id"]
    return {
        "not JSON": b"this is not an export\n",
        "empty": b"",
        "an array line": b"[1, 2]\n",
        "no id": jsonl(without_id),
        "a parent nowhere": changed(1, parent_id=str(uuid.uuid4())),
        "a parent cycle": changed(0, parent_id=lines[1]["id"]),  # (lines in any order, but a tree)
        "a node twice": jsonl([*lines, lines[0]]),
        "an unknown kind": changed(0, kind="weird"),
        "a compaction with a parent": changed(1, kind="compaction", compacted_from=lines[0]["id"]),
        "a turn with compacted_from": changed(1, compacted_from=lines[0]["id"]),
        "an item that is no object": changed(0, sent=["hello"]),
        "a message without a role": changed(0, sent=[{"content": "hello"}]),
        "a wizard's message": changed(0, received=[{"role": "wizard", "content": "hello"}]),
        "two heads": changed(0, head=True),
        "a date that is none": changed(0, created_at="yesterday"),
        "an outcome that is none": changed(0, outcome="splendid"),
        "params that are a list": changed(0, params=[1]),
        "a NUL in a key": jsonl([{**lines[0], "sent": [{"role": "user", "content": "x", "\x00": 1}]}, *lines[1:]]),
    }


def test_an_import_that_the_tree_could_not_take_is_refused_whole(proxy, upstream, key, cid):
    build(proxy, upstream, key, cid)
    lines = export(proxy, key, cid)
    http = proxy.http(key)
    refused = {}
    for name, body in _mutations(lines).items():
        target = f"{cid}-bad-{len(refused)}"
        r = http.post(f"/admin/conversations/{target}/import", content=body)
        refused[name] = r.status_code
        if r.status_code == 400:
            error = r.json()["error"]
            assert error["code"] == "invalid_request" and error["param"] == "body", (name, error)
            assert http.get(f"/admin/conversations/{target}").status_code == 404, name  # nothing written
    assert {name: status for name, status in refused.items() if status != 400} == {"a NUL in a key": 201}
    # a NUL in a key is kept too (the key's object is stored in another form): the import took it
    imported = export(proxy, key, f"{cid}-bad-{len(refused) - 1}")
    assert imported[0]["sent"] == [{"role": "user", "content": "x", "\x00": 1}]


def test_imports_are_scoped_to_the_callers_tenant(proxy, upstream, key, cid):
    build(proxy, upstream, key, cid)
    lines = export(proxy, key, cid)
    other = f"sk-other-{uuid.uuid4().hex}"
    r = proxy.http(other).post(f"/admin/conversations/{cid}/import", content=jsonl(lines))
    assert r.status_code == 201  # the same id in another tenant is another conversation
    assert len(export(proxy, other, cid)) == len(lines)
    say(proxy.openai(other), cid, user("mine now"))
    assert upstream.last.messages[-1] == user("mine now")
    assert len(export(proxy, key, cid)) == len(lines)  # the original is untouched


def test_the_command_refuses_what_the_api_refuses(proxy, upstream, key, cid, tmp_path):
    from click.testing import CliRunner

    from proxy.cli import main

    build(proxy, upstream, key, cid)
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(_mutations(export(proxy, key, cid))["a parent nowhere"])
    result = CliRunner().invoke(main, ["conversations", "import", str(bad), "--as", f"{cid}-cli", "--key", key],
                                env={"BRANCHPOINT_DATABASE_URL": proxy.settings.database.url, "BRANCHPOINT_CONFIG": ""})
    assert result.exit_code == 1 and "on no line" in result.output


def test_the_export_format_is_what_an_older_export_held_too(proxy, upstream, key, cid):
    """Exports made before nodes had an outcome of their own carried status and error.kind (and
    their first line neither the head nor a node count)."""
    build(proxy, upstream, key, cid)
    lines = export(proxy, key, cid)
    for field in ("head_node_id", "node_count"):
        lines[0]["conversation"].pop(field)
    for line in lines:
        line.pop("outcome")
        line.pop("api")
        if line["status"] == "failed":
            line["error"] = {**line["error"], "kind": "transient"}
    r = proxy.http(key).post(f"/admin/conversations/{cid}-old/import", content=jsonl(lines))
    assert r.status_code == 201, r.text
    assert [n["outcome"] for n in export(proxy, key, f"{cid}-old")] == \
           ["success" if n["status"] == "success" else "transient" for n in lines]


def test_nothing_else_is_stored_for_a_refused_import(proxy, upstream, key, cid, db):
    r = proxy.http(key).post(f"/admin/conversations/{cid}/import", content=b'{"id": "x"}\n')
    assert r.status_code == 400
    # (the shared database: what the test's own tenant holds -- nothing, the key being new)
    tenant = tenant_of(key)
    assert db.fetchval("SELECT count(*) FROM nodes WHERE tenant = $1", tenant) == 0
    assert db.fetchval("SELECT count(*) FROM conversations WHERE tenant = $1", tenant) == 0


@pytest.mark.parametrize("where", ["a side call", "a failed call"])
def test_a_head_the_admin_api_put_anywhere_comes_back_with_the_import(proxy, upstream, key, cid, where):
    """PUT /admin/.../head moves the head to any finished node of the tree -- a side call's, a
    turn that failed as invalid: the conversation's export carries it there, and its import takes
    it (it was refused: "cannot be the head")."""
    build(proxy, upstream, key, cid)
    lines = export(proxy, key, cid)
    kind, outcome = ("transform", "success") if where == "a side call" else ("turn", "invalid")
    if where == "a failed call":
        upstream.enqueue(Reply(kind="error", status=400))
        with pytest.raises(Exception):  # noqa: B017 -- the SDK's error for a 400
            say(proxy.openai(key), cid, user("refused"))
        lines = export(proxy, key, cid)
    target = next(line for line in lines if line["kind"] == kind and line["outcome"] == outcome)
    http = proxy.http(key)
    assert http.put(f"/admin/conversations/{cid}/head", json={"node_id": target["id"]}).status_code == 200
    r = http.post(f"/admin/conversations/{cid}-copy/import", content=jsonl(export(proxy, key, cid)))
    assert r.status_code == 201, r.text
    head = http.get(f"/admin/conversations/{cid}-copy/path").json()["data"][-1]
    assert (head["kind"], head["outcome"], head["sent"]) == (kind, outcome, target["sent"])


def _copy(proxy: Any, key: str, cid: str, name: str = "copy") -> tuple[str, list[dict[str, Any]], list[dict[str, Any]]]:
    """The conversation exported and imported as ``<cid>-<name>``: (the copy's id, the original's
    lines, the copy's lines)."""
    lines = export(proxy, key, cid)
    r = proxy.http(key).post(f"/admin/conversations/{cid}-{name}/import", content=jsonl(lines))
    assert r.status_code == 201, r.text
    return f"{cid}-{name}", lines, export(proxy, key, f"{cid}-{name}")


def test_an_imported_copy_keeps_its_safety_net_and_its_requests(proxy, upstream, key, cid):
    """What a copy's calls and readers need beyond the items: the digest of each answer (a delta
    call resending one is read as a resent history, in the copy as in the original -- an import
    that left it out duplicated the history into the call's context), the request a node sent
    (still verified) and a summary's request to the summariser (it read as {})."""
    client, http = proxy.openai(key), proxy.http(key)
    upstream.enqueue(Reply(content="answer one"))
    say(client, cid, user("q1"))
    for q in ("q2", "q3", "q4"):
        say(client, cid, user(q))
    copy, _, _ = _copy(proxy, key, cid)
    resend = [user("q1"), {"role": "assistant", "content": "answer one"}, user("q1 again, differently")]
    sent = {}
    for conversation in (cid, copy):
        _, h = say(client, conversation, *resend)
        sent[conversation] = (h["x-context-mode"], upstream.last.messages)
    assert sent[cid] == sent[copy] and sent[copy][0] == "full"
    assert [m["content"] for m in sent[copy][1]] == ["q1", "answer one", "q1 again, differently"]
    for q in ("q5", "q6"):
        say(client, cid, user(q))
    assert http.post(f"/admin/conversations/{cid}/compact").json()["compacted"] is True
    _, lines, copied = _copy(proxy, key, cid, "compacted")
    for old, new in zip(lines, copied, strict=True):
        a, b = (http.get(f"/admin/nodes/{n['id']}/request") for n in (old, new))
        assert (b.status_code, b.content, b.headers["x-request-verified"]) == \
               (200, a.content, a.headers["x-request-verified"]), new["kind"]
    assert [n for n in copied if n["kind"] == "compaction"][0]["summariser_request"].startswith("{")


def test_an_imported_copy_keeps_withdrawals_and_its_conversations_fields(proxy, upstream, key, cid):
    """A response withdrawn from the Responses API stays withdrawn in the copy (an import brought
    it back: retrievable, continuable); the Conversations API's metadata and the conversation's
    creation time come with it."""
    client = proxy.openai(key)
    conv = client.conversations.create(metadata={"topic": "codes"})
    first = client.responses.create(model="gpt-x", input="the code is 42", conversation=conv.id)
    client.responses.create(model="gpt-x", input="and then?", conversation=conv.id)
    client.responses.delete(first.id)  # (the second's context: withdrawn, not deleted)
    copy, lines, copied = _copy(proxy, key, conv.id)
    assert [n["response_deleted"] for n in copied] == [n["response_deleted"] for n in lines] == [True, False]
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(f"resp_{uuid.UUID(copied[0]['id']).hex}")
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="gpt-x", input="go on", previous_response_id=f"resp_{uuid.UUID(copied[0]['id']).hex}")
    original, imported = client.conversations.retrieve(conv.id), client.conversations.retrieve(copy)
    assert (imported.metadata, imported.created_at) == (original.metadata, original.created_at) == \
           ({"topic": "codes"}, conv.created_at)


def test_placeholders_kept_by_a_summary_name_the_copys_nodes(database_url, upstream_url, upstream, key, cid):
    """A summary made after a clearing keeps the clearing's placeholders among its recent items;
    in the copy they name the copy's nodes (they named the original's, which the copy's tenant
    may not even reach)."""
    with serve_proxy(make_settings(database_url, upstream_url, compaction={"keep_recent": 20})) as proxy:
        _placeholders_in_a_copy(proxy, upstream, key, cid)


def _placeholders_in_a_copy(proxy: Any, upstream: Any, key: str, cid: str) -> None:
    client, http = proxy.openai(key), proxy.http(key)

    def rounds(n: int, start: int) -> None:
        for i in range(start, start + n):
            upstream.enqueue(Reply(content=None, tool_calls=[tool_call(f"call_{i}", "read_file", "{}")]))
            say(client, cid, user(f"task {i}"))
            say(client, cid, tool(f"call_{i}", f"output {i} " * 300))

    rounds(5, 0)
    assert http.post(f"/admin/conversations/{cid}/compact", json={"method": "clear_tool_results"}).json()["compacted"]
    rounds(1, 5)
    assert http.post(f"/admin/conversations/{cid}/compact").json()["compacted"]
    copy, lines, copied = _copy(proxy, key, cid)
    say(client, copy, user("next"))
    named = set(re.findall(r"in node ([0-9a-f-]{36})", json.dumps(upstream.last.body)))
    assert named and named <= {n["id"] for n in copied}


def test_a_fork_restored_from_its_export_counts_only_its_own_calls(proxy, upstream, key, cid):
    """A fork's export holds the nodes of its source it sees, and an import makes every line a
    node of the new conversation: a fork backed up, deleted and restored counted its source's
    calls a second time (the tenant's usage report 3 calls and 1,200 prompt tokens, then 5 and
    1,400). The export marks those lines (``inherited``); the import keeps their usage for the
    record and counts it nowhere -- the report and the fork's usage are what they were -- and the
    restored fork's next call sends the context the fork's would."""
    fork = f"{cid}-fork"
    client, http = proxy.openai(key), proxy.http(key)
    for q in ("one", "two"):
        upstream.enqueue(Reply(content=f"answer {q}", usage={"prompt_tokens": 100, "completion_tokens": 10,
                                                              "total_tokens": 110}))
        say(client, cid, user(q))
    assert http.post(f"/admin/conversations/{cid}/fork", json={"conversation_id": fork}).status_code == 200
    upstream.enqueue(Reply(content="answer three", usage={"prompt_tokens": 1000, "completion_tokens": 1,
                                                          "total_tokens": 1001}))
    say(client, fork, user("three"))
    report = http.get("/admin/usage").json()
    assert (report["calls"], report["prompt_tokens"]) == (3, 1200)
    counted = http.get(f"/admin/conversations/{fork}").json()["usage"]
    lines = export(proxy, key, fork)
    assert http.delete(f"/admin/conversations/{fork}").status_code == 200
    r = http.post(f"/admin/conversations/{fork}/import", content=jsonl(lines))
    assert r.status_code == 201, r.text
    report = http.get("/admin/usage").json()
    assert (report["calls"], report["prompt_tokens"]) == (3, 1200)
    assert http.get(f"/admin/conversations/{fork}").json()["usage"] == counted
    assert [line.get("inherited") for line in lines] == [True, True, False]
    copied = export(proxy, key, fork)
    assert [n["usage"] for n in copied] == [n["usage"] for n in lines]  # (kept for the record)
    for old, new in zip(lines[:2], copied[:2], strict=True):  # their requests still read back as sent
        a, b = (http.get(f"/admin/nodes/{n['id']}/request") for n in (old, new))
        assert (b.content, b.headers["x-request-verified"]) == (a.content, "true")
    say(client, fork, user("four"))
    assert [m["content"] for m in upstream.last.messages] == [
        "one", "answer one", "two", "answer two", "three", "answer three", "four"]


def test_a_call_under_a_clearing_reads_back_verified_in_the_copy(proxy, upstream, key, cid):
    """An import renames the nodes a clearing's placeholders name, so the request a call under it
    rebuilds in the copy names the copy's nodes: the hash it was exported with cannot match, and
    the copy's ``/request`` read unverified. The import checks the rebuilt body, the original's
    ids put back, against the exported hash and then takes the copy's -- a hash that did not match
    (forged) stays unverified."""
    client, http = proxy.openai(key), proxy.http(key)
    for i in range(5):
        upstream.enqueue(Reply(content=None, tool_calls=[tool_call(f"call_{i}", "read_file", "{}")]))
        say(client, cid, user(f"task {i}"))
        say(client, cid, tool(f"call_{i}", f"output {i} " * 300))
    assert http.post(f"/admin/conversations/{cid}/compact", json={"method": "clear_tool_results"}).json()["compacted"]
    _, h = say(client, cid, user("after clearing"))
    sent = upstream.last.raw
    copy, lines, copied = _copy(proxy, key, cid)
    after = copied[[n["id"] for n in lines].index(h["x-node-id"])]["id"]
    original, copied_request = http.get(f"/admin/nodes/{h['x-node-id']}/request"), http.get(f"/admin/nodes/{after}/request")
    assert original.content == sent and original.headers["x-request-verified"] == "true"
    assert copied_request.headers["x-request-verified"] == "true"
    assert set(re.findall(r"in node ([0-9a-f-]{36})", copied_request.text)) <= {n["id"] for n in copied}
    forged = [dict(n) for n in lines]
    forged[[n["id"] for n in lines].index(h["x-node-id"])]["request_hash"] = "0" * 64
    r = http.post(f"/admin/conversations/{cid}-forged/import", content=jsonl(forged))
    assert r.status_code == 201, r.text
    node = export(proxy, key, f"{cid}-forged")[[n["id"] for n in lines].index(h["x-node-id"])]
    assert node["request_hash"] == "0" * 64
    assert http.get(f"/admin/nodes/{node['id']}/request").headers["x-request-verified"] == "false"


def test_an_export_cut_at_a_line_end_is_refused(proxy, upstream, key, cid):
    """The format has no end: a file cut short at a line's end reads as whole lines, and imported
    as half a conversation without a head -- its next call silently lost the context. The first
    line counts the nodes and names the head: a file with fewer, or without that head, is refused
    (an older export, without them, still imports as it is)."""
    build(proxy, upstream, key, cid)
    lines = export(proxy, key, cid)
    assert lines[0]["conversation"]["node_count"] == len(lines) == 6
    assert lines[0]["conversation"]["head_node_id"] == next(n["id"] for n in lines if n["head"])
    http = proxy.http(key)
    for cut in (lines[:3], lines[:-1]):
        r = http.post(f"/admin/conversations/{cid}-cut/import", content=jsonl(cut))
        assert r.status_code == 400 and "cut short" in r.json()["error"]["message"], r.text
        assert http.get(f"/admin/conversations/{cid}-cut").status_code == 404
    unmarked = [{**n, "head": False} for n in lines]
    r = http.post(f"/admin/conversations/{cid}-cut/import", content=jsonl(unmarked))
    assert r.status_code == 400 and "head" in r.json()["error"]["message"], r.text
    later = export(proxy, key, cid)  # (a node made meanwhile comes at the end, not the head the export began with)
    say(proxy.openai(key), cid, user("made while the export ran"))
    r = http.post(f"/admin/conversations/{cid}-later/import", content=jsonl([*later, {**export(proxy, key, cid)[-1], "head": False}]))
    assert r.status_code == 201 and r.json()["node_count"] == 7, r.text
    older = [dict(n) for n in lines[:3]]
    older[0]["conversation"] = {"created_at": lines[0]["conversation"]["created_at"]}
    assert http.post(f"/admin/conversations/{cid}-older/import", content=jsonl(older)).status_code == 201


@pytest.mark.parametrize(("api", "item"), [
    ("chat", {"role": "user", "content": 5}),
    ("chat", {"role": "user", "content": [{"type": "text"}]}),
    ("responses", {"type": "message", "role": "user", "content": 5}),
    ("responses", {"foo": 1}),
    ("messages", {"role": "user", "content": [{"x": 1}]}),
])
def test_an_imported_item_meets_the_checks_of_items_stored_unchecked(proxy, upstream, key, cid, api, item):
    """An import stores items no upstream has refused, as the Conversations API does, and checks
    them as it does (a Messages fragment as a Messages request's message): it took any item but
    a chat message without a role, and the copy's every later call sent it upstream malformed
    (``content: 5``) or lost it (an item without a type; blocks without one). A failed call that
    nothing continues is no one's context: its items come back as they were."""
    build(proxy, upstream, key, cid)
    upstream.enqueue(Reply(kind="error", status=400))
    with pytest.raises(Exception):  # noqa: B017 -- the SDK's error for a 400
        say(proxy.openai(key), cid, user("refused"))
    lines = export(proxy, key, cid)
    http = proxy.http(key)
    junk = [dict(line) for line in lines]
    junk[0].update(api=api, sent=[item])
    r = http.post(f"/admin/conversations/{cid}-junk/import", content=jsonl(junk))
    assert r.status_code == 400 and "line 1 " in r.json()["error"]["message"], r.text
    assert http.get(f"/admin/conversations/{cid}-junk").status_code == 404
    as_added = item if api == "responses" else {"type": "message", **item}
    assert http.post("/v1/conversations", json={"items": [as_added]}).status_code == 400  # (the same checks)
    failed = [dict(line) for line in lines]
    assert failed[-1]["outcome"] == "invalid" and not failed[-1]["head"]
    failed[-1].update(api=api, sent=[item])
    r = http.post(f"/admin/conversations/{cid}-failed/import", content=jsonl(failed))
    assert r.status_code == 201, r.text
    assert export(proxy, key, f"{cid}-failed")[-1]["sent"] == [item]
