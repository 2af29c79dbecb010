"""Full-history matching does not count the leading and trailing whitespace of a text: apps that
restore a session (aider's --restore-chat-history) resend it with spaces and blank lines added,
and must still match (docs/behaviour.md#full-history-mode). Only matching: what is stored and what
the upstream receives keep every byte. Conversations stored before the upgrade match too
(migration 0017 computes their chains again)."""

from __future__ import annotations

import json
import uuid

import asyncpg

from proxy.dialects import dialect
from storage import latest_version, migrate
from storage.migrate import load_migrations
from storage.transcript import canonical, digest, node_keys

from .conftest import make_settings, new_database, run, serve_proxy
from .helpers import MODEL, assistant, system, user
from .test_schema import _migrate_to

FULL = {"X-Context-Mode": "full"}


def chat(client, messages, headers=None):
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=messages, extra_headers=headers or {})
    return raw.parse(), raw.headers


def _meaning(messages):
    return [canonical(m) for m in messages if canonical(m) is not None]


def test_a_restored_session_with_whitespace_around_its_texts_matches(proxy, upstream, key, cid, db):
    client = proxy.openai(key, conversation=cid)
    first, h1 = chat(client, [system("Be brief."), user("one")], FULL)
    history = [system("Be brief."), user("one"), assistant(first.choices[0].message.content), user("two")]
    second, h2 = chat(client, history, FULL)
    assert h2["x-context-matched"] == "2"
    stored = history + [assistant(second.choices[0].message.content)]

    # the app restores its session: blank lines and spaces around every earlier text, one as parts
    restored = [system("Be brief."), user("\n\none  "), assistant(stored[2]["content"] + " \n\n"),
                user([{"type": "text", "text": "\ttw"}, {"type": "text", "text": "o\n"}]),
                assistant("\n" + stored[4]["content"] + "   ")]
    sent = restored + [user("three  \n")]
    _, h3 = chat(client, sent, FULL)
    assert h3["x-context-mode"] == "full" and h3["x-context-matched"] == "4"
    assert h3["x-parent-node-id"] == h2["x-node-id"]
    node = db.node(h3["x-node-id"])
    assert node["sent"] == [user("three  \n")]  # only the new message, as the client sent it
    assert db.fetchval("SELECT count(*) FROM nodes WHERE conversation_id = $1", cid) == 3
    # the upstream received the client's messages: the earlier ones as they were stored (matching
    # alone ignores the whitespace -- nothing sent is rewritten), the new one byte for byte
    got = upstream.last.messages
    assert got == [system("Be brief."), user("one"), stored[2], user("two"), stored[4], user("three  \n")]
    assert _meaning(got) == _meaning(sent)


def test_the_stored_texts_keep_their_whitespace_and_a_client_that_strips_it_matches(proxy, upstream, key, cid, db):
    client = proxy.openai(key, conversation=cid)
    first, h1 = chat(client, [user("  padded question\n\n")], FULL)
    assert db.node(h1["x-node-id"])["sent"] == [user("  padded question\n\n")]
    assert upstream.last.messages == [user("  padded question\n\n")]
    answer = first.choices[0].message.content
    _, h2 = chat(client, [user("padded question"), assistant(answer), user("next")], FULL)
    assert h2["x-context-matched"] == "2" and h2["x-parent-node-id"] == h1["x-node-id"]
    assert upstream.last.messages == [user("  padded question\n\n"), assistant(answer), user("next")]


def test_whitespace_inside_a_text_still_counts(proxy, upstream, key, cid, db):
    client = proxy.openai(key, conversation=cid)
    first, h1 = chat(client, [user("one two")], FULL)
    answer = first.choices[0].message.content
    for changed in ("one  two", "one\ntwo", "onetwo", "one two!"):
        _, h = chat(client, [user(changed), assistant(answer), user("next")], FULL)
        assert h["x-context-matched"] == "0", changed  # a different text: a new root
        assert db.node(h["x-node-id"])["parent_id"] is None
    _, h = chat(client, [user(" one two "), assistant(answer + "\n"), user("next")], FULL)
    assert h["x-context-matched"] == "2" and h["x-parent-node-id"] == h1["x-node-id"]


# -- conversations stored before the upgrade -------------------------------------------------------

def _node(n: str) -> uuid.UUID:
    return uuid.UUID(f"00000000-0000-7000-8000-0000000000{n}")


def _old_chains(nodes):
    """The chains the previous version stored: 0007's frozen hashing is that canonical form (texts
    kept whole); a Responses node's items read as messages first, as the previous version did."""
    namespace = {"__name__": "m0007"}
    source = next(m for m in load_migrations() if m.version == 7).source
    exec(compile(source, "0007", "exec"), namespace)
    as_chat = [{**n, "sent": dialect(n["api"]).to_messages(n["sent"], None),
                "received": dialect(n["api"]).to_messages(n["received"], None) if n["received"] else None}
               for n in nodes]
    return {k: v[0] for k, v in namespace["_node_keys"](as_chat).items()}


def test_a_conversation_stored_before_the_upgrade_still_matches_after_it(pg_server_url, upstream_url, upstream):
    url = new_database(pg_server_url)
    tenant = "t_" + "cd" * 16
    nodes = [  # a chat conversation whose stored texts carry whitespace, a Responses node under it, a compaction
        {"id": _node("a1"), "parent_id": None, "kind": "turn", "outcome": "success", "api": "chat",
         "sent": [system("sys"), user("hello\n")], "received": [assistant("  hi there  ")], "compacted_from": None},
        {"id": _node("a2"), "parent_id": _node("a1"), "kind": "turn", "outcome": "success", "api": "chat",
         "sent": [user([{"type": "text", "text": "more "}, {"type": "text", "text": "please\n\n"}])],
         "received": [assistant("\nmore\n")], "compacted_from": None},
        {"id": _node("a3"), "parent_id": _node("a2"), "kind": "turn", "outcome": "success", "api": "responses",
         "sent": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "and items \n"}]}],
         "received": [{"type": "message", "role": "assistant",
                       "content": [{"type": "output_text", "text": " items back", "annotations": []}]},
                      {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}],
         "compacted_from": None},
        {"id": _node("a4"), "parent_id": _node("a3"), "kind": "turn", "outcome": "transient", "api": "chat",
         "sent": [{"role": "tool", "tool_call_id": "c1", "content": "result "}], "received": None,
         "compacted_from": None},
        {"id": _node("a5"), "parent_id": None, "kind": "compaction", "outcome": "success", "api": "chat",
         "sent": [user("summary")], "received": None, "compacted_from": _node("a1")},
    ]
    old = _old_chains(nodes)

    def as_messages(n, items):
        return dialect(n["api"]).to_messages(items, None)

    new = {k: v.chain for k, v in node_keys(nodes, as_messages).items()}
    assert all(old[n["id"]] != new[n["id"]] for n in nodes)  # the upgrade changes every one of them

    async def setup():
        conn = await asyncpg.connect(url)
        try:
            await _migrate_to(conn, 16)
            tree = await conn.fetchval("SELECT bp_tree_of($1, 'c')", tenant)
            await conn.execute("INSERT INTO conversations (tree_id, tenant, id, head_node_id) VALUES ($1, $2, 'c', $3)",
                               tree, tenant, _node("a3"))
            for depth, n in enumerate(nodes):
                await conn.execute(
                    "INSERT INTO nodes (tree_id, id, tenant, conversation_id, parent_id, kind, outcome, sent, received, "
                    "depth, chain, answered, api, compacted_from, finished_at) VALUES ($1, $2, $3, 'c', $4, $5, $6, "
                    "$7::jsonb, $8::jsonb, $9, $10, true, $11, $12, now())",
                    tree, n["id"], tenant, n["parent_id"], n["kind"], n["outcome"], json.dumps(n["sent"]),
                    json.dumps(n["received"]) if n["received"] else None, 0 if n["parent_id"] is None else depth,
                    old[n["id"]], n["api"], n["compacted_from"])
            assert await migrate(url) == list(range(17, latest_version() + 1))
            chains = {r["id"]: bytes(r["chain"]) for r in await conn.fetch("SELECT id, chain FROM nodes")}
            answers = {}
            if await conn.fetchval("SELECT count(*) FROM information_schema.columns WHERE table_name = 'nodes' "
                                   "AND column_name = 'answer'"):  # (0017: the answer digests the safety net probes)
                answers = {r["id"]: bytes(r["answer"]) for r in await conn.fetch(
                    "SELECT id, answer FROM nodes WHERE answer IS NOT NULL")}
            return chains, answers
        finally:
            await conn.close()

    chains, answers = run(setup())
    assert chains == new  # the chains the live code computes from the items
    for node_id, answer in answers.items():  # and the answers' digests, as the live code takes them
        n = next(n for n in nodes if n["id"] == node_id)
        assert answer == digest(as_messages(n, n["received"])[0]), node_id
    # and a client resending that history -- whitespace its own again -- matches it
    with serve_proxy(make_settings(url, upstream_url, auth={"mode": "keys", "keys": [{"key": "sk-w", "tenant": tenant}]})) as p:
        client = p.openai("sk-w", conversation="c")
        history = [system("sys"), user("hello"), assistant("hi there"), user("more please"), assistant("more"),
                   user("and items"), {"role": "assistant", "content": "items back", "tool_calls": [
                       {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                   {"role": "tool", "tool_call_id": "c1", "content": "result"}]
        _, h = chat(client, history, FULL)
        assert h["x-context-matched"] == "7" and h["x-parent-node-id"] == str(_node("a3"))
