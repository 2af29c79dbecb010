"""Finding a conversation by what was said: ``GET /admin/conversations?q=`` searches the text of
every node's messages -- questions, answers, tool calls and results, of any API -- in the caller's
tenant, best match first, each conversation once with its best node and a snippet
(docs/behaviour.md#admin-api)."""

from __future__ import annotations

import base64
import hashlib
import os
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from storage import queries
from tests.anthropic_fake import FakeAnthropic
from tests.conftest import Proxy, make_settings, new_key, run, serve_proxy, three_upstreams
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
    """The query's expression is the one migration 0027 indexes (with sequential scans off, the
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


@pytest.fixture
def big(fresh_database_url: str, upstream_url: str, claude_server: Any) -> Iterator[Proxy]:
    """A proxy of the test's own in front of the chat and the Anthropic fakes (``three_upstreams``);
    ``roomy-*`` models are never compacted (a paste is sent again as it is)."""
    with serve_proxy(make_settings(fresh_database_url, upstream_url,
                                   upstreams=three_upstreams(upstream_url, claude_server),
                                   models={"roomy*": {"context_window": 10**12, "max_output_tokens": 1000}})) as p:
        yield p


def _call(proxy: Proxy, key: str, cid: str, path: str, body: dict[str, Any]) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}", "X-Conversation-Id": cid, "anthropic-version": "2023-06-01"}
    return httpx.post(f"{proxy.url}{path}", json=body, headers=headers, timeout=120)


def _node(proxy: Proxy, key: str, node_id: str) -> dict[str, Any]:
    return httpx.get(f"{proxy.url}/admin/nodes/{node_id}", headers={"Authorization": f"Bearer {key}"}, timeout=30).json()


def _status(proxy: Proxy, key: str, node_id: str) -> str:
    return _node(proxy, key, node_id)["status"]


def _found(proxy: Proxy, key: str, q: str) -> list[str]:
    return [f["id"] for f in _search(proxy, key, q).json()["data"]]


def _lexemes(proxy: Proxy, node_id: str) -> int:
    """How many distinct words the text-search index holds for a node."""
    async def count() -> int:
        import asyncpg
        conn = await asyncpg.connect(proxy.settings.database.url)
        try:
            return await conn.fetchval("SELECT length(bp_search_vector(sent, received)) FROM nodes WHERE id = $1",
                                       uuid.UUID(node_id))
        finally:
            await conn.close()
    return run(count())


def test_attachments_and_pastes_of_unique_tokens_are_stored_and_sent_again_whole(
        big: Proxy, upstream: FakeUpstream, claude: FakeAnthropic) -> None:
    """A node's text-search vector is bounded whatever the node holds (bp_search_vector, migration
    0027). PostgreSQL refuses a vector of 1 MB of lexemes, and random base64 or unique hashes split
    into about as many lexemes as they have bytes: indexed whole, a photo, a PDF or a paste of
    hashes over ~700 KB failed the node's INSERT -- 500 before the upstream was called, on every
    retry. Each is stored now and sent again whole with the next turn; attachments are left out of
    the index (the words after a photo are still found), a paste is indexed up to a bound."""
    key = new_key()
    photo_conv, pdf_conv, paste_conv = (f"s-{uuid.uuid4().hex[:8]}" for _ in range(3))
    photo = {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,"
                                                       + base64.b64encode(os.urandom(1 << 20)).decode()}}
    asked = [{"type": "text", "text": "what does the okapi eat"}, photo, {"type": "text", "text": "and the zebu"}]
    r = _call(big, key, photo_conv, "/v1/chat/completions", {"model": "gpt-x", "messages": [user(asked)]})
    assert r.status_code == 200, r.text[:300]
    photo_node = r.headers["x-node-id"]
    assert _status(big, key, r.headers["x-node-id"]) == "success"
    assert _call(big, key, photo_conv, "/v1/chat/completions",
                 {"model": "gpt-x", "messages": [user("and?")]}).status_code == 200
    assert upstream.last.body["messages"][0]["content"] == asked

    pdf = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf",
                                          "data": base64.b64encode(b"%PDF-1.4\n" + os.urandom(1 << 20)).decode()}}
    blocks = [pdf, {"type": "text", "text": "summarize the walrus report"}]
    r = _call(big, key, pdf_conv, "/v1/messages",
              {"model": "claude-x", "max_tokens": 10, "messages": [{"role": "user", "content": blocks}]})
    assert r.status_code == 200, r.text[:300]
    pdf_node = r.headers["x-node-id"]
    assert _status(big, key, r.headers["x-node-id"]) == "success"
    assert _call(big, key, pdf_conv, "/v1/messages", {"model": "claude-x", "max_tokens": 10,
                                                       "messages": [{"role": "user", "content": "and?"}]}).status_code == 200
    assert claude.last.body["messages"][0]["content"] == blocks

    # 2 MB of distinct hex hashes (not repeated words, which would deduplicate)
    paste = "the quagga checksums: " + " ".join(hashlib.sha256(b"%d" % i).hexdigest() for i in range(31_000))
    r = _call(big, key, paste_conv, "/v1/chat/completions", {"model": "roomy-x", "messages": [user(paste)]})
    assert r.status_code == 200, r.text[:300]
    assert _status(big, key, r.headers["x-node-id"]) == "success"
    assert _call(big, key, paste_conv, "/v1/chat/completions",
                 {"model": "roomy-x", "messages": [user("and?")]}).status_code == 200
    assert upstream.last.body["messages"][0]["content"] == paste

    assert _found(big, key, "okapi") == _found(big, key, "zebu") == [photo_conv]
    # the photo and the PDF themselves are not words: their nodes' vectors hold the few words said
    assert _lexemes(big, photo_node) < 50 and _lexemes(big, pdf_node) < 50
    assert _found(big, key, "walrus") == [pdf_conv]
    assert _found(big, key, "quagga") == [paste_conv]


def test_a_big_audio_answer_is_stored_and_sent_again_whole(big: Proxy, upstream: FakeUpstream) -> None:
    """An upstream's audio answer carries the audio as base64 (message.audio.data, MBs for a
    minute): indexed whole, its lexemes passed PostgreSQL's limit and the node's finish was
    refused -- the client had its 200, the node was stored failed (storage_refused) and the next
    turn went without the answer. The answer is stored whole now, and the next turn sends it again
    (as OpenAI takes an earlier audio answer: by its id, docs/behaviour.md)."""
    key, cid = new_key(), f"s-{uuid.uuid4().hex[:8]}"
    audio = {"id": "audio_1", "data": base64.b64encode(os.urandom(3 << 19)).decode(),
             "expires_at": int(time.time()) + 3600, "transcript": "The narwhal sings."}
    upstream.enqueue(Reply(content=None, extra_message={"audio": audio}))
    r = _call(big, key, cid, "/v1/chat/completions", {"model": "gpt-x", "modalities": ["text", "audio"],
                                                      "audio": {"voice": "alloy", "format": "wav"},
                                                      "messages": [user("sing")]})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["audio"] == audio
    node = _node(big, key, r.headers["x-node-id"])
    assert node["status"] == "success" and node["received"][0]["audio"] == audio
    assert _call(big, key, cid, "/v1/chat/completions", {"model": "gpt-x", "messages": [user("again")]}).status_code == 200
    assert upstream.last.body["messages"][1] == {"role": "assistant", "content": None, "audio": {"id": "audio_1"}}
    assert _found(big, key, "narwhal") == [cid]  # the transcript is words


def test_words_after_a_backslash_and_at_the_end_of_a_huge_node_are_found(big: Proxy, upstream: FakeUpstream) -> None:
    """What bp_search_vector indexes of a node: the words after a backslash from their first
    letter (a Windows path's, LaTeX's: the JSON text writes the backslash as an escape, and
    reading "\\n" of "\\node_modules" as a line break lost the "n"), and of a node past its bound
    the end as well as the beginning -- the question after a long tool result or paste, the
    answer after a long thinking block -- where only the beginning was kept."""
    key = new_key()
    path_conv, long_conv = (f"s-{uuid.uuid4().hex[:8]}" for _ in range(2))
    asked = r"it fails in C:\Users\me\node_modules\react\index.js -- and what is \theta here?"
    assert _call(big, key, path_conv, "/v1/chat/completions",
                 {"model": "gpt-x", "messages": [user(asked)]}).status_code == 200
    for word in ("react", "node_modules", "theta", "users"):
        assert _found(big, key, word) == [path_conv], word

    filler = " ".join(f"word{i}" for i in range(20_000))  # ~190,000 characters
    upstream.enqueue(Reply(content=filler + " so the axolotl it is"))
    r = _call(big, key, long_conv, "/v1/chat/completions",
              {"model": "roomy-x", "messages": [user(filler), user("which is the ocelot?")]})
    assert r.status_code == 200, r.text[:300]
    assert _found(big, key, "ocelot") == _found(big, key, "axolotl") == [long_conv]
    assert _found(big, key, "word3") == [long_conv]  # (the beginning still)
    assert _found(big, key, "word10000") == []  # (the middle of a huge node: stored, sent, not found)
