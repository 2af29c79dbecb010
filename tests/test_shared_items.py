"""Large repeated items stored once per tenant (docs/architecture.md#shared-items): a system prompt
and tool definitions every session repeats are one row of ``shared_items`` each, nodes refer to
them, and everything that reads nodes -- the upstream's requests, the admin API, replay, export --
sees them whole. Asserted on the rows themselves and on what the fake upstream received."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import anthropic
import pytest

from storage import SharedItems, open_database

from .conftest import Db, make_settings, proxy_with, serve_proxy
from .fakes import Reply
from .helpers import say, system, tool, tool_call, user

SYSTEM = system("You are a careful coding agent. " + " ".join(f"Rule {i}: keep the tests green." for i in range(120)))
TOOLS = [{"type": "function", "function": {"name": f"tool_{i}", "description": "does a thing " * 30,
                                           "parameters": {"type": "object", "properties": {"x": {"type": "string"}}}}}
         for i in range(8)]


def shared_rows(db: Db, tenant_like: str = "%") -> list[Any]:
    return db.fetch("SELECT tenant, hash, item FROM shared_items WHERE tenant LIKE $1 ORDER BY hash", tenant_like)


def stored(db: Db, node_id: str) -> Any:
    return db.fetchrow("SELECT sent, params FROM nodes WHERE id = $1", uuid.UUID(node_id))


@pytest.fixture
def own(fresh_database_url: str, upstream_url: str) -> Any:
    yield from proxy_with(fresh_database_url, upstream_url)


def session(p: Any, key: str, cid: str, upstream: Any) -> list[str]:
    """An agent session: a system prompt, tools, a tool round, a follow-up. Returns its node ids."""
    client = p.openai(key)
    upstream.enqueue(Reply(content=None, tool_calls=[tool_call("call_1", "tool_0", '{"x": "a"}')]))
    _, h1 = say(client, cid, SYSTEM, user("fix the bug"), tools=TOOLS)
    _, h2 = say(client, cid, tool("call_1", "done"), tools=TOOLS)
    _, h3 = say(client, cid, user("and the docs"), tools=TOOLS)
    return [h1["x-node-id"], h2["x-node-id"], h3["x-node-id"]]


def test_a_sessions_system_prompt_and_tools_are_stored_once(own, upstream, key, cid):
    nodes = session(own, key, cid, upstream)
    first = stored(own.db, nodes[0])
    # the node holds references where the prompt and the tools were
    assert first["sent"][0] == {"_bp_shared": first["sent"][0]["_bp_shared"], "role": "system"}
    assert first["sent"][1] == user("fix the bug")
    assert set(first["params"]["tools"]) == {"_bp_shared"}
    for node in nodes[1:]:
        assert stored(own.db, node)["params"]["tools"] == first["params"]["tools"]
    rows = shared_rows(own.db)
    assert sorted(json.dumps(r["item"], sort_keys=True) for r in rows) == sorted(
        json.dumps(v, sort_keys=True) for v in (SYSTEM, TOOLS))
    # ... and the upstream got them whole, every time
    for request in upstream.chat_requests:
        assert request.body["messages"][0] == SYSTEM and request.body["tools"] == TOOLS
    # the admin API shows the node whole; its request replays byte for byte
    http = own.http(key)
    shown = http.get(f"/admin/nodes/{nodes[0]}").json()
    assert shown["sent"][0] == SYSTEM and shown["params"]["tools"] == TOOLS
    replay = http.get(f"/admin/nodes/{nodes[2]}/request")
    assert replay.headers["x-request-verified"] == "true" and replay.json()["tools"] == TOOLS
    path = http.get(f"/admin/conversations/{cid}/path").json()["data"]
    assert path[0]["sent"][0] == SYSTEM and all(n["params"]["tools"] == TOOLS for n in path)


def test_the_order_of_a_large_tool_sets_properties_is_stored_once_too(own, upstream, key, cid):
    """What keeps a schema's properties in the client's order (proxy/key_order.py) is as large and
    as repeated as the tools it describes: shared like them, resolved for every read."""
    tools = [{"type": "function", "function": {"name": f"tool_{i}", "description": "does a thing",
                                               "parameters": {"type": "object", "properties": {
                                                   f"zeta_{i}": {"type": "string"}, f"alpha_{i}": {"type": "string"},
                                                   f"mid_{i}": {"type": "string"}}}}} for i in range(40)]
    client = own.openai(key)
    nodes = [say(client, cid, user(text), tools=tools)[1]["x-node-id"] for text in ("one", "two")]
    for request in upstream.chat_requests[-2:]:
        assert [list(t["function"]["parameters"]["properties"]) for t in request.body["tools"]] == [
            [f"zeta_{i}", f"alpha_{i}", f"mid_{i}"] for i in range(40)]
    params = [stored(own.db, n)["params"] for n in nodes]
    assert set(params[0]["_bp_key_order"]) == {"_bp_shared"} and params[1]["_bp_key_order"] == params[0]["_bp_key_order"]
    assert len(shared_rows(own.db)) == 2  # the tools and their order, once each
    replay = own.http(key).get(f"/admin/nodes/{nodes[1]}/request")
    assert replay.headers["x-request-verified"] == "true" and replay.content == upstream.chat_requests[-1].raw


def test_many_sessions_of_a_tenant_share_one_copy_and_other_tenants_have_their_own(own, upstream, key):
    for i in range(5):
        session(own, key, f"s-{i}-{uuid.uuid4().hex[:6]}", upstream)
    assert len(shared_rows(own.db)) == 2  # the prompt and the tools, once for the five sessions
    other = f"sk-test-{uuid.uuid4().hex}"
    session(own, other, f"o-{uuid.uuid4().hex[:6]}", upstream)
    rows = shared_rows(own.db)
    assert len(rows) == 4 and len({r["tenant"] for r in rows}) == 2
    # a node's own bytes: a few hundred, where the prompt and tools were ~10 KB
    sizes = own.db.fetch("SELECT pg_column_size(sent) + pg_column_size(params) AS b FROM nodes")
    assert max(r["b"] for r in sizes) < 1500


def test_a_new_process_reads_the_shared_items_back(fresh_database_url, upstream_url, upstream, key, cid):
    settings = make_settings(fresh_database_url, upstream_url)
    with serve_proxy(settings) as p:
        session(p, key, cid, upstream)
    with serve_proxy(settings) as p:  # an empty path cache: the path is read, its references resolved
        say(p.openai(key), cid, user("one more"), tools=TOOLS)
        sent = upstream.last.body
        assert sent["messages"][0] == SYSTEM and sent["tools"] == TOOLS
        assert sent["messages"][-1] == user("one more")


def test_full_history_clients_are_matched_through_shared_items(own, upstream, key, cid):
    client = own.openai(key)
    full = {"X-Context-Mode": "full"}
    history = [SYSTEM, user("q1")]
    _, h1 = say(client, cid, *history, headers=full, tools=TOOLS)
    history += [{"role": "assistant", "content": "echo: q1"}, user("q2")]
    _, h = say(client, cid, *history, headers=full, tools=TOOLS)
    assert h["x-context-matched"] == "2" and h["x-parent-node-id"] == h1["x-node-id"]  # q1 and its answer
    assert stored(own.db, h["x-node-id"])["sent"] == [user("q2")]  # only what is new
    assert upstream.last.body["messages"] == history
    assert len(shared_rows(own.db)) == 2


def test_export_holds_whole_items_and_an_import_shares_them_again(own, upstream, key, cid):
    session(own, key, cid, upstream)
    http = own.http(key)
    export = http.get(f"/admin/conversations/{cid}/export").content
    lines = [json.loads(line) for line in export.splitlines()]
    assert lines[0]["sent"][0] == SYSTEM and lines[0]["params"]["tools"] == TOOLS
    assert "_bp_shared" not in export.decode()
    copy = f"{cid}-copy"
    assert http.post(f"/admin/conversations/{copy}/import", content=export).status_code == 201
    assert len(shared_rows(own.db)) == 2  # the copy refers to the same two
    head = http.get(f"/admin/conversations/{copy}").json()["head_node_id"]
    say(own.openai(key), copy, user("continue the copy"), tools=TOOLS)
    assert upstream.last.body["messages"][0] == SYSTEM
    assert http.get(f"/admin/nodes/{head}").json()["params"]["tools"] == TOOLS


async def _sweep(url: str) -> int:
    """A sweep as another process runs it (storage/shared.py's grace)."""
    db = await open_database(url)
    try:
        return await SharedItems(db, min_bytes=0).sweep()
    finally:
        await db.close()


def test_what_nothing_refers_to_is_swept(own, upstream, key, cid):
    keep = f"{cid}-keep"
    session(own, key, cid, upstream)
    client = own.openai(key)
    say(client, keep, SYSTEM, user("another session, same prompt, no tools"))
    http = own.http(key)
    url = own.settings.database.url
    assert len(shared_rows(own.db)) == 2
    assert http.delete(f"/admin/conversations/{cid}").status_code == 200
    assert asyncio.run(_sweep(url)) == 0  # seen a moment ago: kept for the grace
    own.db.fetch("UPDATE shared_items SET seen_at = now() - interval '1 hour'")  # (the grace has passed)
    assert asyncio.run(_sweep(url)) == 1  # the tools went; the prompt is still the other session's
    assert [r["item"] for r in shared_rows(own.db)] == [SYSTEM]
    # found still referred to: marked seen, so the next sweeps do not look at it again and again
    assert own.db.fetch("SELECT seen_at > now() - interval '1 minute' AS seen FROM shared_items")[0]["seen"]
    assert http.get(f"/admin/conversations/{keep}/path").json()["data"][0]["sent"][0] == SYSTEM
    assert http.delete(f"/admin/conversations/{keep}").status_code == 200
    own.db.fetch("UPDATE shared_items SET seen_at = now() - interval '1 hour'")
    assert asyncio.run(_sweep(url)) == 1 and shared_rows(own.db) == []


def test_an_item_swept_is_stored_again_when_it_comes_back(own, upstream, key, cid):
    """A process writes an item's row again once it has not for ``fresh`` seconds -- so it never
    counts on a row the sweep (which waits far longer) may have taken."""
    url = own.settings.database.url

    async def go() -> tuple[int, int]:
        db = await open_database(url)
        try:
            shared = SharedItems(db, min_bytes=2048, fresh=0)
            await shared.prepare("t-sweep", [SYSTEM], {"tools": TOOLS})
            await db.execute("UPDATE shared_items SET seen_at = now() - interval '1 hour' WHERE tenant = 't-sweep'")
            swept = await shared.sweep()
            await shared.prepare("t-sweep", [SYSTEM], {"tools": TOOLS})
            return swept, await db.fetchval("SELECT count(*) FROM shared_items WHERE tenant = 't-sweep'")
        finally:
            await db.close()

    assert asyncio.run(go()) == (2, 2)


def test_responses_instructions_and_anthropic_system_are_shared(fresh_database_url, upstream_url, upstream, key, cid):
    from tests.anthropic_fake import FakeAnthropic
    from tests.fakes import ServerThread

    instructions = "Follow the repository's conventions. " * 100
    fake = FakeAnthropic()
    with ServerThread(fake) as claude:
        settings = make_settings(fresh_database_url, upstream_url, upstreams=[
            {"name": "anthropic", "base_url": claude.url + "/v1", "models": ["claude-*"], "api": "anthropic"},
            {"name": "native", "base_url": upstream_url, "models": ["native-*"], "api": "responses"}])
        with serve_proxy(settings) as p:
            db = Db(fresh_database_url)
            client = p.openai(key)
            r = client.responses.with_raw_response.create(model="native-x", instructions=instructions, input="hi",
                                                          extra_headers={"X-Conversation-Id": cid})
            node = stored(db, r.headers["x-node-id"])
            assert set(node["params"]["instructions"]) == {"_bp_shared"}  # (kept for the response object)
            assert node["sent"][0] == {"_bp_shared": node["sent"][0]["_bp_shared"], "role": "system"}
            assert upstream.responses_requests[-1].body["input"][0]["content"] == instructions
            shown = client.responses.retrieve(f"resp_{uuid.UUID(r.headers['x-node-id']).hex}",
                                              extra_headers={"X-Conversation-Id": cid})
            assert shown.instructions == instructions
            c = anthropic.Anthropic(base_url=f"{p.url}/c/{cid}-a", api_key=key, max_retries=0)
            long_system = "You are Claude Code. " * 200
            m = c.messages.with_raw_response.create(model="claude-x", max_tokens=20, system=long_system,
                                                    messages=[{"role": "user", "content": "hello"}])
            node = stored(db, m.headers["x-node-id"])
            assert node["sent"][0] == {"_bp_shared": node["sent"][0]["_bp_shared"], "role": "system"}
            assert fake.last.body["system"] == long_system
            c.messages.create(model="claude-x", max_tokens=20, messages=[{"role": "user", "content": "again"}])
            assert fake.last.body["system"] == long_system


def test_sharing_can_be_turned_off(fresh_database_url, upstream_url, upstream, key, cid):
    with serve_proxy(make_settings(fresh_database_url, upstream_url, database={"share_items_above": 0})) as p:
        db = Db(fresh_database_url)
        nodes = session(p, key, cid, upstream)
        assert shared_rows(db) == []
        assert stored(db, nodes[0])["params"]["tools"] == TOOLS


def test_a_compaction_keeps_the_system_prompt_as_a_reference(own, upstream, key, cid):
    session(own, key, cid, upstream)
    for text in ("more", "and more", "and still more"):
        say(own.openai(key), cid, user(text), tools=TOOLS)
    r = own.http(key).post(f"/admin/conversations/{cid}/compact")
    assert r.json()["compacted"] is True, r.json()
    node = stored(own.db, r.json()["node_id"])
    assert node["sent"][0]["_bp_shared"] and len(shared_rows(own.db)) == 2
    say(own.openai(key), cid, user("after the compaction"), tools=TOOLS)
    assert upstream.last.body["messages"][0] == SYSTEM


def test_a_shared_value_may_hold_any_character(own, upstream, key, cid):
    odd = system("Rules with a NUL \x00 and more \u2028 characters. " * 80)
    _, h = say(own.openai(key), cid, odd, user("hi"), tools=TOOLS)
    assert upstream.last.body["messages"][0] == odd
    assert stored(own.db, h["x-node-id"])["sent"][0]["_bp_shared"]
    assert own.http(key).get(f"/admin/nodes/{h['x-node-id']}").json()["sent"][0] == odd


def test_a_serving_process_sweeps_and_counts_it(own, upstream, key, cid):
    """The retention side of a serving process: its sweep (run every SWEEP_SECONDS) removes what
    nothing refers to and says so on /metrics."""
    import httpx

    session(own, key, cid, upstream)
    assert own.http(key).delete(f"/admin/conversations/{cid}").status_code == 200
    own.db.fetch("UPDATE shared_items SET seen_at = now() - interval '1 hour'")
    assert own.in_loop(own.runtime.retention.sweep()) == 2
    assert shared_rows(own.db) == []
    assert 'branchpoint_pruned_total{what="shared_items"} 2.0' in httpx.get(f"{own.url}/metrics").text


@pytest.mark.parametrize("share", [2048, 0])
def test_a_clients_lookalike_reference_comes_back_as_sent(fresh_database_url, upstream_url, upstream, key, cid, share):
    """Nothing a client sends is taken for a reference: a ``metadata`` value, a Responses item or
    an imported node that looks like one is stored as it is (shared itself, behind a real
    reference) -- the conversation goes on, and every read gives back exactly what was sent."""
    forged = {"_bp_shared": "0" * 64}
    with serve_proxy(make_settings(fresh_database_url, upstream_url, database={"share_items_above": share})) as p:
        db = Db(fresh_database_url)
        client = p.openai(key)
        _, h = say(client, cid, user("hi"), metadata=forged, store=True)
        say(client, cid, user("again"), metadata=forged, store=True)
        assert upstream.last.body["metadata"] == forged
        assert p.http(key).get(f"/admin/nodes/{h['x-node-id']}").json()["params"]["metadata"] == forged
        rcid = f"{cid}-r"
        item = {"type": "message", "role": "user", "content": "look", "_bp_shared": "f" * 64}
        odd = {"type": "message", "role": ["user"], "content": "a role that is a list"}
        r = client.responses.with_raw_response.create(model="gpt-x", input=[item, odd],
                                                      extra_headers={"X-Conversation-Id": rcid})
        assert r.status_code == 200
        client.responses.create(model="gpt-x", input="and on", extra_headers={"X-Conversation-Id": rcid})
        texts = json.dumps(upstream.last.body)
        assert "look" in texts and "and on" in texts
        node = p.http(key).get(f"/admin/nodes/{r.headers['x-node-id']}").json()
        assert node["sent"][0] == item and node["sent"][1] == odd
        # an export and its import: the same conversation, readable again (less the list role: an
        # import holds its items to what the Conversations API stores, and refuses that one)
        exported = p.http(key).get(f"/admin/conversations/{rcid}/export")
        assert exported.status_code == 200
        copy = f"{rcid}-copy"
        refused = p.http(key).post(f"/admin/conversations/{copy}/import", content=exported.content)
        assert refused.status_code == 400 and ".role" in refused.json()["error"]["message"]
        lines = [json.loads(line) for line in exported.content.splitlines()]
        lines[0]["sent"].remove(odd)
        body = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
        assert p.http(key).post(f"/admin/conversations/{copy}/import", content=body).status_code == 201
        path = p.http(key).get(f"/admin/conversations/{copy}/path").json()["data"]
        assert path[0]["sent"][0] == item
        client.responses.create(model="gpt-x", input="the copy goes on", extra_headers={"X-Conversation-Id": copy})
        assert "look" in json.dumps(upstream.last.body)
        # in the database: a real reference in the forged value's place, to a row holding it
        ref = stored(db, h["x-node-id"])["params"]["metadata"]["_bp_shared"]
        assert ref != forged["_bp_shared"]
        assert {r["hash"]: r["item"] for r in shared_rows(db)}[ref] == forged



def test_a_lookalike_reference_under_one_of_the_proxys_own_params_reads_back_as_imported(own, upstream, key, cid):
    """A reference-shaped value under a param of the proxy's own (``_bp_...``: never shared, a
    client's request cannot carry one, an import's line can) is no reference: it reads back as
    it was imported. Every read of the node looked it up as one -- a shared item that is not
    there -- and failed with 500 (the path, the export mid-stream, the items, the node, its
    request, its response), and so did the conversation's next call."""
    forged = {"_bp_shared": "ab" * 32}
    http = own.http(key)
    say(own.openai(key), cid, user("hello"))
    lines = [json.loads(line) for line in http.get(f"/admin/conversations/{cid}/export").content.splitlines()]
    lines[-1]["params"]["_bp_note"] = forged
    copy = f"{cid}-copy"
    r = http.post(f"/admin/conversations/{copy}/import", content="\n".join(json.dumps(line) for line in lines).encode())
    assert r.status_code == 201, r.text
    head = http.get(f"/admin/conversations/{copy}").json()["head_node_id"]
    assert http.get(f"/admin/nodes/{head}").json()["params"]["_bp_note"] == forged
    assert http.get(f"/admin/conversations/{copy}/path").json()["data"][-1]["params"]["_bp_note"] == forged
    exported = http.get(f"/admin/conversations/{copy}/export")
    assert exported.status_code == 200 and json.loads(exported.content.splitlines()[-1])["params"]["_bp_note"] == forged
    for url in (f"/v1/conversations/{copy}/items", f"/admin/nodes/{head}/request", f"/v1/responses/resp_{uuid.UUID(head).hex}"):
        assert http.get(url).status_code == 200, url
    _, h = say(own.openai(key), copy, user("and on"))
    assert h["x-parent-node-id"] == head and "hello" in json.dumps(upstream.last.body)
    assert stored(own.db, head)["params"]["_bp_note"] == forged and not shared_rows(own.db)  # (kept as it is)

def test_a_started_call_whose_path_cannot_be_read_holds_nothing(fresh_database_url, upstream_url, upstream, key, cid):
    """A call starts (its pending node holds the conversation), then reading its path fails -- here
    a shared item taken from under it by hand, which no retry brings back. The call fails (500),
    nothing goes upstream, and its node is released at once: the conversation is not held for a
    lease."""
    from .conftest import wait_for

    settings = make_settings(fresh_database_url, upstream_url)
    db = Db(fresh_database_url)
    with serve_proxy(settings) as p:
        session(p, key, cid, upstream)
    saved = db.fetch("SELECT tenant, hash, item FROM shared_items")
    db.fetch("DELETE FROM shared_items")
    with serve_proxy(settings) as p:  # an empty cache: the path is read and must be resolved
        calls = len(upstream.turn_requests)
        r = p.http(key).post("/v1/chat/completions", headers={"X-Conversation-Id": cid},
                             json={"model": "gpt-x", "messages": [user("one more")]})
        assert r.status_code == 500, r.text
        assert len(upstream.turn_requests) == calls
        wait_for(lambda: not db.fetch("SELECT 1 FROM nodes WHERE conversation_id = $1 AND outcome IS NULL", cid),
                 what="the started call's node released")
        for row in saved:
            db.fetch("INSERT INTO shared_items (tenant, hash, item) VALUES ($1, $2, $3)", row["tenant"], row["hash"],
                     row["item"])
        say(p.openai(key), cid, user("one more"), tools=TOOLS)  # (not busy: goes on at once)
        assert upstream.last.body["messages"][0] == SYSTEM
