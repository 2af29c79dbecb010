"""Deleted means gone, and an import holds only what the tree can read back (issue "Hardening,
second round: deleted means gone").

- A conversation and its forks deleted at the same moment (threads of one process, or two
  processes) leave none of their nodes: the admin and Responses reads answer 404 and `branchpoint
  check` is clean. `check` reports a node nothing reaches.
- An import's times must be ones PostgreSQL and Python both hold (years 1..9999 in UTC), and a
  succeeded call must carry what it received; so must a usage report's range. All 400s, never 500.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from datetime import timedelta
from typing import Any

import httpx
import pytest

from .conftest import assert_invariants, run, spawn_proxy
from .helpers import MODEL, say, user

# -- deletes at the same moment ---------------------------------------------------------------


def _tree(proxy: Any, key: str, cid: str, forks: int) -> tuple[list[str], list[str]]:
    """A conversation of two Responses turns and ``forks`` forks of it, each with a turn of its
    own under the source's head. Returns (the conversations, every node id)."""
    client = proxy.openai(key)
    nodes = []
    previous = None
    for question in ("first question", "second question"):
        raw = client.responses.with_raw_response.create(model=MODEL, input=question, extra_headers={"X-Conversation-Id": cid},
                                                        **({"previous_response_id": previous} if previous else {}))
        previous = raw.parse().id
        nodes.append(raw.headers["x-node-id"])
    conversations = [cid]
    http = proxy.http(key)
    for i in range(forks):
        fork = f"{cid}-fork{i}"
        r = http.post(f"/admin/conversations/{cid}/fork", json={"conversation_id": fork})
        assert r.status_code == 200, r.text
        _, headers = say(client, fork, user(f"a question of fork {i}"))
        nodes.append(headers["x-node-id"])
        conversations.append(fork)
    return conversations, nodes


def _delete_at_once(urls: list[str], key: str, conversations: list[str]) -> list[int]:
    """DELETE each conversation from a thread of its own, all released at one moment; each thread
    uses the next of ``urls`` (several processes, when they differ)."""
    barrier = threading.Barrier(len(conversations))
    statuses: list[Any] = [None] * len(conversations)

    def delete(i: int) -> None:
        with httpx.Client(base_url=urls[i % len(urls)], headers={"Authorization": f"Bearer {key}"}, timeout=30) as http:
            http.get("/readyz")  # the connection open before the race
            barrier.wait(10)
            statuses[i] = http.delete(f"/admin/conversations/{conversations[i]}").status_code

    threads = [threading.Thread(target=delete, args=(i,)) for i in range(len(conversations))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return statuses


def _assert_gone(proxy: Any, key: str, conversations: list[str], nodes: list[str]) -> None:
    http = proxy.http(key)
    left = proxy.db.fetchval("SELECT count(*) FROM nodes WHERE id = ANY($1::uuid[])", [uuid.UUID(n) for n in nodes])
    assert left == 0, f"{left} of {len(nodes)} nodes of deleted conversations remain"
    for node in nodes:
        assert http.get(f"/admin/nodes/{node}").status_code == 404
        assert http.get(f"/admin/nodes/{node}/request").status_code == 404
        assert http.get(f"/v1/responses/resp_{uuid.UUID(node).hex}").status_code == 404
    for conversation in conversations:
        assert http.get(f"/admin/conversations/{conversation}").status_code == 404


def _race(proxy: Any, urls: list[str], key: str, forks: int, trials: int = 20, budget: float = 60.0) -> int:
    deadline = time.monotonic() + budget
    done = 0
    while done < trials and time.monotonic() < deadline:
        conversations, nodes = _tree(proxy, key, f"race-{uuid.uuid4().hex[:10]}", forks)
        assert _delete_at_once(urls, key, conversations) == [200] * len(conversations)
        _assert_gone(proxy, key, conversations, nodes)
        done += 1
    assert done >= 5, f"only {done} trials in {budget} s"
    return done


@pytest.mark.parametrize("forks", [1, 2])
@pytest.mark.slow  # (seconds of its own: the slow CI step, .ci/slow.sh)
def test_a_conversation_and_its_forks_deleted_at_once_leave_nothing(own_proxy, key, fresh_database_url, forks):
    _race(own_proxy, [own_proxy.url], key, forks)
    assert own_proxy.db.fetchval("SELECT count(*) FROM nodes") == 0
    assert_invariants(fresh_database_url)


@pytest.mark.slow  # (seconds of its own: the slow CI step, .ci/slow.sh)
def test_deletes_at_once_from_two_processes_leave_nothing(own_proxy, key, fresh_database_url, upstream_url, tmp_path):
    proc, url = spawn_proxy(fresh_database_url, upstream_url, tmp_path)
    try:
        _race(own_proxy, [own_proxy.url, url], key, forks=1)
    finally:
        proc.terminate()
        proc.wait(10)
    assert own_proxy.db.fetchval("SELECT count(*) FROM nodes") == 0
    assert_invariants(fresh_database_url)


def test_a_fork_still_keeps_what_it_reaches_and_check_is_clean(own_proxy, key, fresh_database_url):
    conversations, nodes = _tree(own_proxy, key, f"keep-{uuid.uuid4().hex[:10]}", forks=1)
    http = own_proxy.http(key)
    r = http.delete(f"/admin/conversations/{conversations[0]}")
    assert r.status_code == 200 and r.json()["nodes_kept"] == 2, r.text
    assert all(http.get(f"/admin/nodes/{n}").status_code == 200 for n in nodes)
    assert_invariants(fresh_database_url)  # kept nodes are reached: no orphan reported
    assert http.delete(f"/admin/conversations/{conversations[1]}").status_code == 200
    _assert_gone(own_proxy, key, conversations, nodes)
    assert_invariants(fresh_database_url)


def _check(url: str) -> Any:
    from click.testing import CliRunner

    from proxy.cli import main

    return CliRunner().invoke(main, ["check"], env={"BRANCHPOINT_DATABASE_URL": url, "BRANCHPOINT_CONFIG": ""})


def test_check_reports_a_node_nothing_reaches(own_proxy, key, fresh_database_url):
    from proxy.invariants import check_invariants
    from storage import open_database

    conversations, nodes = _tree(own_proxy, key, f"orphan-{uuid.uuid4().hex[:10]}", forks=1)
    assert _check(fresh_database_url).exit_code == 0
    # the fork's own conversation row removed by hand, as a delete that raced used to leave it:
    # its node (the one turn of its own) is reached by nobody; the source's nodes still are
    own_proxy.db.fetch("DELETE FROM conversation_aliases WHERE id = $1", conversations[1])
    own_proxy.db.fetch("DELETE FROM conversations WHERE id = $1", conversations[1])

    async def violations() -> list[Any]:
        db = await open_database(fresh_database_url, min_size=1, max_size=2)
        try:
            return await check_invariants(db)
        finally:
            await db.close()

    found = run(violations())
    assert [(v.rule, nodes[-1] in v.detail) for v in found] == [("node_reached", True)], found
    result = _check(fresh_database_url)
    assert result.exit_code == 1 and "node_reached" in result.output, result.output


# -- a name made again where its deleted conversation's kept nodes are -------------------------


def _kept_for_a_fork(proxy: Any, key: str, database_url: str, how: str) -> tuple[str, str, list[str], str]:
    """Conversation A of three turns, a fork F of it at the second with a turn of its own, then A
    deleted (``how``: by the admin API, or by retention) -- its first two nodes kept for F.
    Returns (A, F, A's three nodes, F's node)."""
    client, http = proxy.openai(key), proxy.http(key)
    a = f"old-{uuid.uuid4().hex[:8]}"
    f = f"{a}-f"
    nodes = [say(client, a, user(q))[1]["x-node-id"] for q in ("q1 the opening", "q2 A-SECRET-TWO", "q3 A-SECRET-THREE")]
    assert http.post(f"/admin/conversations/{a}/fork", json={"conversation_id": f, "node_id": nodes[1]}).status_code == 200
    _, hy = say(client, f, user("the fork's own question"))
    if how == "admin":
        r = http.delete(f"/admin/conversations/{a}")
        assert r.status_code == 200 and r.json()["nodes_kept"] == 2, r.text
    else:
        from .test_retention import age, cli

        age(proxy.db, a, 40)
        done = cli(database_url, "--idle-days", "30")
        assert "deleted 1 conversation(s)" in done.output and "2 kept for forks" in done.output, done.output
    assert http.get(f"/admin/conversations/{a}").status_code == 404
    return a, f, nodes, hy["x-node-id"]


@pytest.mark.parametrize("how", ["admin", "retention"])
def test_a_name_made_again_as_a_fork_in_its_old_tree_owns_none_of_the_old_nodes(own_proxy, upstream, key,
                                                                                fresh_database_url, how):
    """A deleted conversation's nodes that a fork still reaches stay -- as nobody's own. A new
    conversation of the deleted one's name made as a fork of that fork lives in the old tree,
    where those nodes still carried the name: it took them for its own -- counted them and their
    usage, listed them in its tree and search hits, could move its head onto one and send the
    deleted question upstream, and kept them alive once the fork that reached them went."""
    http, client = own_proxy.http(key), own_proxy.openai(key)
    a, f, (x1, x2, x3), y1 = _kept_for_a_fork(own_proxy, key, fresh_database_url, how)
    r = http.post(f"/admin/conversations/{f}/fork", json={"conversation_id": a, "node_id": x1})
    assert r.status_code == 200, r.text
    conv = http.get(f"/admin/conversations/{a}").json()
    assert conv["node_count"] == 0 and not conv["usage"]["total_tokens"], conv  # it made no call
    assert [n["id"] for n in http.get(f"/admin/conversations/{a}/tree").json()["data"]] == [x1]  # what it reaches
    hits = http.get("/admin/conversations", params={"q": "A-SECRET-TWO"}).json()["data"]
    assert [h["id"] for h in hits] == [f]  # the kept node is in the context of F alone
    r = http.put(f"/admin/conversations/{a}/head", json={"node_id": x2})
    assert r.status_code == 404 and r.json()["error"]["code"] == "node_not_found", r.text
    # F goes: what only it reached goes with it; the new A still reaches its fork point
    assert http.delete(f"/admin/conversations/{f}").json()["nodes_deleted"] == 2
    left = own_proxy.db.fetch("SELECT id FROM nodes WHERE id = ANY($1::uuid[])", [uuid.UUID(n) for n in (x1, x2, x3, y1)])
    assert [str(row["id"]) for row in left] == [x1]
    upstream.requests.clear()
    say(client, a, user("next"))
    assert upstream.last.messages == [user("q1 the opening"), {"role": "assistant", "content": "echo: q1 the opening"},
                                      user("next")]
    assert http.get(f"/admin/conversations/{a}").json()["node_count"] == 1
    assert_invariants(fresh_database_url)


def test_a_session_continuing_the_fork_under_the_deleted_name_owns_only_its_own_call(own_proxy, upstream, key,
                                                                                    fresh_database_url):
    """The same name made again by a session that continues the fork (under /auto/v1, its session
    header naming the deleted conversation): a fork of F, in the old tree -- owning its one call,
    not the deleted conversation's kept nodes on its path."""
    import openai

    a, f, (x1, x2, _), y1 = _kept_for_a_fork(own_proxy, key, fresh_database_url, "admin")
    auto = openai.OpenAI(base_url=f"{own_proxy.url}/auto/v1", api_key=key, max_retries=0)
    history = [user("q1 the opening"), {"role": "assistant", "content": "echo: q1 the opening"},
               user("q2 A-SECRET-TWO"), {"role": "assistant", "content": "echo: q2 A-SECRET-TWO"},
               user("the fork's own question"), {"role": "assistant", "content": "echo: the fork's own question"},
               user("resumed")]
    raw = auto.chat.completions.with_raw_response.create(model=MODEL, messages=history, extra_headers={"session-id": a})
    assert raw.headers["x-conversation-id"] == a and raw.headers["x-parent-node-id"] == y1
    http = own_proxy.http(key)
    conv = http.get(f"/admin/conversations/{a}").json()
    assert conv["forked_from"] == f and conv["node_count"] == 1, conv
    assert [n["id"] for n in http.get(f"/admin/conversations/{a}/tree").json()["data"]] == \
        [x1, x2, y1, raw.headers["x-node-id"]]
    assert_invariants(fresh_database_url)


def test_the_migration_gives_kept_nodes_taken_over_before_back(own_proxy, upstream, key, fresh_database_url):
    """Migration 0026 on what the old deletes left: kept nodes still carrying their deleted
    conversation's id become no conversation's own, and those a fork made under that id had
    taken over are given back -- the fork owns its own calls again, and nothing else."""
    from storage import migrate

    db, http = own_proxy.db, own_proxy.http(key)
    a, f, (x1, x2, _), _ = _kept_for_a_fork(own_proxy, key, fresh_database_url, "admin")
    b, _, (z1, z2, _), _ = _kept_for_a_fork(own_proxy, key, fresh_database_url, "admin")
    for name in (a, b):  # as a delete before this version left them -- made a while before
        db.fetch("UPDATE nodes SET conversation_id = $1 WHERE conversation_id = $1 || ' (deleted)'", name)
        for row in db.fetch("SELECT id, created_at, finished_at FROM nodes WHERE conversation_id = $1", name):
            # (times computed here: Citus takes no timestamp minus an interval beside a column in an UPDATE)
            db.fetch("UPDATE nodes SET created_at = $2, finished_at = $3 WHERE id = $1", row["id"],
                     row["created_at"] - timedelta(minutes=1), row["finished_at"] - timedelta(minutes=1))
    assert http.post(f"/admin/conversations/{f}/fork", json={"conversation_id": a, "node_id": x1}).status_code == 200
    _, h = say(own_proxy.openai(key), a, user("its own"))
    assert http.get(f"/admin/conversations/{a}").json()["node_count"] == 3  # took X1 and X2 over
    # its own first call, stamped by a clock half a second behind the fork's (a Citus worker's):
    # still its own
    forked_at = db.fetchval("SELECT created_at FROM conversations WHERE id = $1", a)
    db.fetch("UPDATE nodes SET created_at = $2 WHERE id = $1", uuid.UUID(h["x-node-id"]),
             forked_at - timedelta(seconds=0.5))
    db.fetch("DELETE FROM schema_migrations WHERE version = 26")
    assert run(migrate(fresh_database_url)) == [26]
    assert http.get(f"/admin/conversations/{a}").json()["node_count"] == 1
    labels = {str(r["id"]): r["conversation_id"] for r in db.fetch(
        "SELECT id, conversation_id FROM nodes WHERE id = ANY($1::uuid[])",
        [uuid.UUID(n) for n in (x1, x2, z1, z2, h["x-node-id"])])}
    assert labels == {x1: f"{a} (deleted)", x2: f"{a} (deleted)", z1: f"{b} (deleted)", z2: f"{b} (deleted)",
                      h["x-node-id"]: a}
    assert_invariants(fresh_database_url)


# -- imports and usage: times and outcomes the tree can hold ------------------------------------


def _export(proxy: Any, key: str, cid: str) -> list[dict[str, Any]]:
    client = proxy.openai(key)
    say(client, cid, user("a question"))
    say(client, cid, user("another"))
    r = proxy.http(key).get(f"/admin/conversations/{cid}/export")
    assert r.status_code == 200, r.text
    return [json.loads(line) for line in r.text.splitlines()]


def _jsonl(lines: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def _refused(proxy: Any, key: str, target: str, lines: list[dict[str, Any]], *words: str) -> None:
    http = proxy.http(key)
    r = http.post(f"/admin/conversations/{target}/import", content=_jsonl(lines))
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "invalid_request" and error["param"] == "body", error
    assert all(w in error["message"] for w in words), error["message"]
    assert http.get(f"/admin/conversations/{target}").status_code == 404  # nothing written


@pytest.mark.parametrize(("field", "moment"), [
    ("created_at", "9999-12-31T23:59:59-14:00"),
    ("created_at", "0001-01-01T00:00:00+14:00"),
    ("finished_at", "9999-12-31T23:59:59.999999-00:01"),
])
def test_an_import_with_a_time_outside_the_years_1_to_9999_is_refused(proxy, key, cid, field, moment):
    lines = _export(proxy, key, cid)
    lines[1][field] = moment
    _refused(proxy, key, f"{cid}-late", lines, "line 2", lines[1]["id"], field)


def test_an_import_at_the_edges_of_the_range_reads_back(proxy, key, cid):
    lines = _export(proxy, key, cid)
    lines[0]["created_at"] = "0001-01-01T00:00:00+00:00"
    lines[1]["created_at"] = lines[1]["finished_at"] = "9999-12-31T23:59:59.999999-00:00"
    http = proxy.http(key)
    target = f"{cid}-edges"
    assert http.post(f"/admin/conversations/{target}/import", content=_jsonl(lines)).status_code == 201
    tree = http.get(f"/admin/conversations/{target}/tree")
    assert tree.status_code == 200 and len(tree.json()["data"]) == 2, tree.text
    exported = http.get(f"/admin/conversations/{target}/export")
    assert exported.status_code == 200 and len(exported.text.splitlines()) == 2
    assert http.get(f"/admin/conversations/{target}").status_code == 200
    assert http.get("/admin/usage", params={"since": "0001-01-01T00:00:00Z",
                                            "until": "9999-12-31T23:59:59.999999Z"}).status_code == 200


@pytest.mark.parametrize("received", ["null", "missing"])
def test_an_import_of_a_success_without_received_is_refused(proxy, key, cid, received):
    lines = _export(proxy, key, cid)
    assert lines[0]["outcome"] == "success"
    if received == "null":
        lines[0]["received"] = None
    else:
        del lines[0]["received"]
    _refused(proxy, key, f"{cid}-noreceived", lines, "line 1", lines[0]["id"], "received")


@pytest.mark.parametrize(("param", "value"), [
    ("until", "9999-12-31T23:59:59.999999-14:00"),
    ("since", "0001-01-01T00:00:00+01:00"),
])
def test_a_usage_range_outside_the_years_1_to_9999_is_refused(proxy, key, param, value):
    r = proxy.http(key).get("/admin/usage", params={param: value})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "invalid_request" and error["param"] == param, error


def test_a_conversation_list_cursor_outside_the_years_1_to_9999_is_refused(proxy, key):
    import base64

    for moment in ("9999-12-31T23:59:59-14:00", "0001-01-01T00:00:00+14:00"):
        cursor = base64.urlsafe_b64encode(json.dumps([moment, "conv-x"]).encode()).decode().rstrip("=")
        r = proxy.http(key).get("/admin/conversations", params={"cursor": cursor})
        assert r.status_code == 400 and r.json()["error"]["param"] == "cursor", r.text


def test_times_imported_out_of_range_before_are_brought_into_it(own_proxy, key, cid):
    """What an import took before it refused such times (migration 0016): the conversation reads again."""
    from storage.migrate import load_migrations

    _export(own_proxy, key, cid)
    http = own_proxy.http(key)
    own_proxy.db.fetch("UPDATE nodes SET created_at = '10000-01-01 13:59:59+00', finished_at = '10000-01-01 14:00:00+00' "
                       "WHERE conversation_id = $1", cid)
    (step,) = [m for m in load_migrations() if m.version == 16]
    own_proxy.db.fetch(step.source)
    tree = http.get(f"/admin/conversations/{cid}/tree")
    assert tree.status_code == 200, tree.text
    assert {n["created_at"][:4] for n in tree.json()["data"]} == {"9999"}
    assert http.get(f"/admin/conversations/{cid}/export").status_code == 200


def test_an_import_takes_its_lines_in_any_order_but_not_a_reference_to_no_line(proxy, key, cid):
    lines = _export(proxy, key, cid)
    http = proxy.http(key)
    r = http.post(f"/admin/conversations/{cid}-reversed/import", content=_jsonl(lines[::-1]))
    assert r.status_code == 201, r.text
    assert [n["parent_id"] is None for n in http.get(f"/admin/conversations/{cid}-reversed/path").json()["data"]] == \
        [True, False]
    orphan = {**lines[1], "parent_id": str(uuid.uuid4())}
    _refused(proxy, key, f"{cid}-orphan", [orphan, lines[0]], "line 1", orphan["id"], "on no line")
