"""Export and import over the admin API (docs/behaviour.md#export-and-import): a tree goes out as
JSON Lines and comes back as a new conversation with the same shape and context; an import is
checked whole -- whatever a tenant sends, a file the tree could not take is a 400 and nothing is
written."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from .conftest import assert_invariants, tenant_of
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
    next(line for line in lines if line["sent"] == [user("Query them by region.")])["head"] = True
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
        "a NUL in a key": jsonl([{**lines[0], "sent": [{"role": "user", "content": "x", "\x00": 1}]}]),
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
    """Exports made before nodes had an outcome of their own carried status and error.kind."""
    build(proxy, upstream, key, cid)
    lines = export(proxy, key, cid)
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
