"""Finding a conversation by what was said: ``GET /admin/conversations?q=`` searches the text of
every node's messages -- questions, answers, tool calls and results, of any API -- in the caller's
tenant, best match first, each conversation once with its best node and a snippet
(docs/behaviour.md#admin-api)."""

from __future__ import annotations

import uuid

import httpx

from storage import queries
from tests.conftest import Proxy, new_key, run
from tests.fakes import FakeUpstream, Reply
from tests.helpers import say, tool, tool_call, user


def _search(proxy: Proxy, key: str, q: str, **params: object) -> httpx.Response:
    return httpx.get(f"{proxy.url}/admin/conversations", params={"q": q, **params},
                     headers={"Authorization": f"Bearer {key}"}, timeout=30)


def test_search_finds_conversations_by_what_was_said(own_proxy: Proxy, upstream: FakeUpstream) -> None:
    key, other = new_key(), new_key()
    client = own_proxy.openai(key)
    a, b, c = (f"s-{uuid.uuid4().hex[:8]}" for _ in range(3))
    _, ha = say(client, a, user("Which pelican species nests on the coast?"))
    upstream.enqueue(Reply(content="The brown pelican, mostly. Pelican colonies are large."))
    _, hb = say(client, b, user("tell me about birds"))
    tools = [{"type": "function", "function": {"name": "grep", "parameters": {"type": "object", "properties": {}}}}]
    upstream.enqueue(Reply(content=None, tool_calls=[tool_call("call_s1", name="grep", args='{"pattern": "flamingo"}')]))
    say(client, c, user("search the notes"), tools=tools)
    _, hc = say(client, c, tool("call_s1", "notes.txt: the flamingo stands on one leg"), tools=tools)
    say(own_proxy.openai(other), f"s-{uuid.uuid4().hex[:8]}", user("pelican pelican pelican"))  # another tenant's

    found = _search(own_proxy, key, "pelican").json()["data"]
    assert [f["id"] for f in found] == [b, a]  # the answer says it twice: ranked first
    assert found[0]["match"]["node_id"] == hb["x-node-id"] and "«pelican»" in found[0]["match"]["snippet"].lower()
    assert found[1]["match"]["node_id"] == ha["x-node-id"]
    assert found[0]["match"]["rank"] >= found[1]["match"]["rank"] > 0
    # tool arguments and results are searched too (the node holding the result)
    hits = _search(own_proxy, key, "flamingo").json()["data"]
    assert [h["id"] for h in hits] == [c]
    assert hits[0]["match"]["node_id"] in (hc["x-node-id"], hits[0]["head_node_id"])
    # several words: all of them; nothing: an empty list; the limit holds
    assert [h["id"] for h in _search(own_proxy, key, "brown colonies").json()["data"]] == [b]
    assert _search(own_proxy, key, "brown flamingo").json()["data"] == []
    assert len(_search(own_proxy, key, "pelican", limit=1).json()["data"]) == 1
    assert _search(own_proxy, key, "pel\x00ican").status_code == 400
    # a deleted conversation is found no more
    assert httpx.delete(f"{own_proxy.url}/admin/conversations/{b}", headers={"Authorization": f"Bearer {key}"}).status_code == 200
    assert [f["id"] for f in _search(own_proxy, key, "pelican").json()["data"]] == [a]


def test_the_search_uses_its_index(own_proxy: Proxy) -> None:
    """The query's expression is the one migration 0021 indexes (with sequential scans off, the
    plan reads the index: a change to either side that breaks the match fails here)."""

    async def plan() -> str:
        import asyncpg

        conn = await asyncpg.connect(own_proxy.settings.database.url)
        try:
            await conn.execute("SET enable_seqscan = off")
            rows = await conn.fetch("EXPLAIN " + queries.SEARCH, None, "pelican", 10)  # (every tenant: the words alone)
            return "\n".join(r[0] for r in rows)
        finally:
            await conn.close()

    assert "nodes_text_search" in run(plan())


def test_a_conversation_with_many_hits_leaves_room_for_the_others(own_proxy: Proxy, upstream: FakeUpstream) -> None:
    key = new_key()
    client = own_proxy.openai(key)
    many, few = (f"s-{uuid.uuid4().hex[:8]}" for _ in range(2))
    say(client, few, user("a kiwi"))
    for i in range(12):  # twelve nodes that match better than few's one
        say(client, many, user(f"kiwi kiwi kiwi kiwi {i}"))
    assert [f["id"] for f in _search(own_proxy, key, "kiwi", limit=2).json()["data"]] == [many, few]


def test_an_admin_key_finds_each_tenants_conversation_of_one_id(fresh_database_url: str, upstream_url: str,
                                                               upstream: FakeUpstream) -> None:
    from tests.conftest import make_settings, serve_proxy

    keys = [{"key": "sk-alice-search", "tenant": "alice"}, {"key": "sk-bob-search", "tenant": "bob"},
            {"key": "sk-admin-search", "tenant": "ops", "admin": True}]
    with serve_proxy(make_settings(fresh_database_url, upstream_url, auth={"mode": "keys", "keys": keys})) as p:
        for k in ("sk-alice-search", "sk-bob-search"):
            say(p.openai(k), "same", user("a zebra crossing"))
        found = _search(p, "sk-admin-search", "zebra").json()["data"]
        assert sorted((f["tenant"], f["id"]) for f in found) == [("alice", "same"), ("bob", "same")]


def test_a_fork_is_found_by_what_its_deleted_source_said(own_proxy: Proxy, upstream: FakeUpstream) -> None:
    """A conversation deleted while a fork reaches its nodes keeps those nodes (the fork's
    context): the words they hold are what the fork says too, so a search finds the fork -- and
    not a branch of the source the fork never reached, which the delete removed."""
    key = new_key()
    auth = {"Authorization": f"Bearer {key}"}
    client = own_proxy.openai(key)
    source, fork = (f"s-{uuid.uuid4().hex[:8]}" for _ in range(2))
    _, first = say(client, source, user("the axolotl regrows its limbs"))
    say(client, source, user("and the quokka smiles"))  # after the fork point: not the fork's
    assert httpx.post(f"{own_proxy.url}/admin/conversations/{source}/fork", headers=auth,
                      json={"conversation_id": fork, "node_id": first["x-node-id"]}).status_code == 200
    assert [f["id"] for f in _search(own_proxy, key, "axolotl").json()["data"]] == [source]
    assert httpx.delete(f"{own_proxy.url}/admin/conversations/{source}", headers=auth).status_code == 200
    found = _search(own_proxy, key, "axolotl").json()["data"]
    assert [f["id"] for f in found] == [fork] and found[0]["match"]["node_id"] == first["x-node-id"]
    assert _search(own_proxy, key, "quokka").json()["data"] == []
