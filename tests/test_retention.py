"""Retention: conversations idle for ``[retention] idle_days`` are deleted with their nodes, by the
server's own loop and by ``branchpoint conversations prune`` -- never one with a recent call (a
side call included) or one a call holds, and never what a fork still reaches."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
from click.testing import CliRunner

from proxy.cli import main

from .conftest import Db, make_settings, run, serve_proxy, wait_for
from .helpers import MODEL, user


def age(db: Db, conversation_id: str, days: float) -> None:
    """Move a conversation and its nodes ``days`` into the past (to that moment: Citus computes no
    column's new value with a stable function, as ``updated_at - interval`` would)."""
    then = datetime.now(UTC) - timedelta(days=days)
    db.fetch("UPDATE conversations SET updated_at = $2 WHERE id = $1", conversation_id, then)
    db.fetch("UPDATE nodes SET created_at = $2::timestamptz,"
             " finished_at = CASE WHEN finished_at IS NULL THEN NULL ELSE $2::timestamptz END"
             " WHERE conversation_id = $1", conversation_id, then)


def exists(db: Db, conversation_id: str) -> bool:
    return db.fetchval("SELECT count(*) FROM conversations WHERE id = $1", conversation_id) == 1


def node_count(db: Db, conversation_id: str) -> int:
    return db.fetchval("SELECT count(*) FROM nodes WHERE conversation_id = $1", conversation_id)


def cli(database_url: str, *args: str):
    env = {"BRANCHPOINT_DATABASE_URL": database_url, "BRANCHPOINT_CONFIG": ""}
    return CliRunner().invoke(main, ["conversations", "prune", *args], env=env, catch_exceptions=False)


@pytest.fixture
def stocked(fresh_database_url, upstream_url, upstream):
    """Conversations of one tenant: ``old`` (two turns, 40 days ago), ``recent``, ``old-side`` (40
    days old but a side call today), and ``source`` (40 days old) with a fork ``source-fork`` that
    went on today."""
    db = Db(fresh_database_url)
    key = "sk-retention-owner"
    with serve_proxy(make_settings(fresh_database_url, upstream_url)) as p:
        client = p.openai(key)

        def turn(cid: str, text: str, **headers: str) -> None:
            client.chat.completions.create(model=MODEL, messages=[user(text)],
                                           extra_headers={"X-Conversation-Id": cid, **headers})

        for cid in ("old", "recent", "old-side", "source"):
            turn(cid, f"{cid}: first question")
            turn(cid, f"{cid}: second question")
        p.http(key).post("/admin/conversations/source/fork", json={"conversation_id": "source-fork"}).raise_for_status()
        for cid in ("old", "old-side", "source", "source-fork"):
            age(db, cid, 40)
        turn("old-side", "old-side: a side call", **{"X-Node-Kind": "transform"})
        turn("source-fork", "source-fork: a question of the fork's own")
    return fresh_database_url, db, key


def test_the_server_deletes_idle_conversations_and_keeps_what_a_fork_reaches(stocked, upstream_url, upstream):
    url, db, key = stocked
    source_nodes = node_count(db, "source")
    settings = make_settings(url, upstream_url, retention={"idle_days": 30, "interval_seconds": 0.2})
    with serve_proxy(settings) as p:
        wait_for(lambda: not exists(db, "old") and not exists(db, "source"), what="idle conversations pruned")
        assert node_count(db, "old") == 0
        assert exists(db, "recent") and node_count(db, "recent") == 2
        assert exists(db, "old-side") and node_count(db, "old-side") == 3  # a side call today: not idle
        assert exists(db, "source-fork")
        # the fork's context is intact: the source's two turns are still sent upstream (kept,
        # no conversation's own any more: relabelled)
        assert node_count(db, "source") == 0 and node_count(db, "source (deleted)") == source_nodes == 2
        p.openai(key).chat.completions.create(model=MODEL, messages=[user("and now?")],
                                              extra_headers={"X-Conversation-Id": "source-fork"})
        sent = [m["content"] for m in upstream.last.messages if m["role"] == "user"]
        assert sent == ["source: first question", "source: second question",
                        "source-fork: a question of the fork's own", "and now?"]
        metrics = p.http(key).get("/metrics").text
        assert 'branchpoint_pruned_total{what="conversations"} 2.0' in metrics
        # the name is free again: a call makes a new conversation of it
        p.openai(key).chat.completions.create(model=MODEL, messages=[user("hello again")],
                                              extra_headers={"X-Conversation-Id": "old"})
        assert [m["content"] for m in upstream.last.messages] == ["hello again"]
        assert db.fetchval("SELECT updated_at > now() - interval '1 minute' FROM conversations WHERE id = 'old'")


def test_the_command_prunes_after_a_dry_run(stocked):
    url, db, _ = stocked
    preview = cli(url, "--idle-days", "30", "--dry-run")
    assert preview.exit_code == 0, preview.output
    assert "2 conversation(s) idle for 30 day(s), 4 node(s); nothing deleted" in preview.output
    assert exists(db, "old") and exists(db, "source")

    assert cli(url, "--idle-days", "50").output.startswith("deleted 0 conversation(s)")  # none is that old
    done = cli(url, "--idle-days", "30")
    assert done.exit_code == 0, done.output
    assert "deleted 2 conversation(s) idle for 30 day(s): 2 node(s) deleted, 2 kept for forks" in done.output
    assert not exists(db, "old") and not exists(db, "source") and exists(db, "recent") and exists(db, "old-side")

    missing = cli(url)  # no --idle-days and none configured
    assert missing.exit_code == 2 and "--idle-days" in missing.output
    for days in ("nan", "inf", "1e300", "1e6"):  # (a traceback each: a date out of range, nan as a number)
        refused = cli(url, "--idle-days", days, "--dry-run")
        assert refused.exit_code == 2 and "--idle-days" in refused.output and "Traceback" not in refused.output, days


def test_a_conversation_a_call_holds_is_left_for_a_later_run(stocked):
    """A call starting now holds the conversation's row: pruning skips it rather than wait for it
    (or make the call wait), and a later pass takes it."""
    url, db, _ = stocked

    async def holding() -> tuple[int, str]:
        conn = await asyncpg.connect(url)
        try:
            tree = await conn.fetchval("SELECT tree_id FROM conversations WHERE id = 'old'")
            async with conn.transaction():  # (by its tree: Citus locks rows of one shard only)
                await conn.execute("SELECT 1 FROM conversations WHERE tree_id = $1 AND id = 'old' FOR UPDATE", tree)
                result = await asyncio.to_thread(cli, url, "--idle-days", "30")
            return result.exit_code, result.output
        finally:
            await conn.close()

    code, output = run(holding())
    assert code == 0 and "deleted 1 conversation(s)" in output  # source only
    assert exists(db, "old") and not exists(db, "source")
    assert "deleted 1 conversation(s)" in cli(url, "--idle-days", "30").output
    assert not exists(db, "old")


def test_a_pass_reads_its_candidates_in_slices(stocked, upstream_url):
    """Candidates are read a slice at a time in the order of their last update; a pass goes
    through every slice, and a conversation that is not idle (a side call) never stops it."""
    from proxy.retention import prune
    from storage import OpsStore, open_database

    url, db, _ = stocked
    for i in range(5):
        db.fetch("INSERT INTO conversations (tenant, id, tree_id, updated_at)"
                 " VALUES ('t-slices', $1, bp_tree_of('t-slices', $1), now() - interval '60 days')", f"empty-{i}")
    batches = []

    async def go():
        database = await open_database(url, min_size=1, max_size=2)
        try:
            return await prune(OpsStore(database), 30, 2, scan=2, on_batch=batches.append)
        finally:
            await database.close()

    done = run(go())
    # 7 idle (5 empty, old, source) + old-side (updated 40 days ago, a side call today): 8 candidates
    assert (done.conversations, done.deleted, done.kept) == (7, 2, 2)
    assert len(batches) == 4 and sum(b.conversations for b in batches) == 7
    assert exists(db, "old-side") and exists(db, "recent")
    assert db.fetchval("SELECT count(*) FROM conversations WHERE tenant = 't-slices'") == 0


def test_retention_settings_are_checked():
    from config import SettingsError, load_settings

    assert load_settings(env={}).retention.idle_days == 0  # off unless asked for
    for bad in ({"idle_days": -1}, {"interval_seconds": 0}, {"batch": 0}):
        with pytest.raises(SettingsError, match="retention"):
            load_settings(env={}, overrides={"retention": bad})


@pytest.mark.slow  # (seconds of its own: the slow CI step, .ci/slow.sh)
def test_pruning_beside_live_traffic_breaks_nothing(fresh_database_url, upstream_url, upstream):
    """Passes every 50 ms deleting conversations idle for a second, while four clients call into
    twelve conversations with pauses up to a second and a half (turns, side calls, streams): no call fails,
    every answer's node exists when the call returns, and the storage invariants hold."""
    import random
    import threading
    import time

    import openai

    from .conftest import assert_invariants

    settings = make_settings(fresh_database_url, upstream_url,
                             retention={"idle_days": 1 / 86400, "interval_seconds": 0.05, "batch": 3})
    db = Db(fresh_database_url)
    failures: list[str] = []
    calls = [0]
    with serve_proxy(settings) as p:
        deadline = time.monotonic() + 6

        def client(seed: int) -> None:
            rng = random.Random(seed)
            sdk = p.openai(f"sk-retention-live-{seed % 2}")
            while time.monotonic() < deadline:
                cid = f"live-{rng.randrange(12)}"
                kind = rng.choice(["turn", "turn", "transform"])
                try:
                    if rng.random() < 0.3:
                        stream = sdk.chat.completions.create(
                            model=MODEL, messages=[user("streamed")], stream=True,
                            extra_headers={"X-Conversation-Id": cid, "X-Node-Kind": kind})
                        for _ in stream:
                            pass
                    else:
                        raw = sdk.chat.completions.with_raw_response.create(
                            model=MODEL, messages=[user("hi")], extra_headers={"X-Conversation-Id": cid, "X-Node-Kind": kind})
                        if db.fetchval("SELECT count(*) FROM nodes WHERE id = $1", uuid.UUID(raw.headers["x-node-id"])) != 1:
                            failures.append(f"node {raw.headers['x-node-id']} missing right after its call")
                    calls[0] += 1
                except openai.APIStatusError as exc:
                    if exc.status_code != 409:  # two clients on one conversation: busy is fine
                        failures.append(f"{exc.status_code}: {exc.message}")
                time.sleep(rng.random() * 1.5)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        pruned = p.runtime.metrics.pruned.labels("conversations")._value.get()
    assert failures == []
    assert calls[0] >= 12 and pruned > 0, (calls, pruned)  # both really happened
    assert_invariants(fresh_database_url)


def test_a_metadata_update_is_activity(fresh_database_url, upstream_url):
    """Updating a conversation's metadata through the Conversations API is activity, as adding or
    deleting its items is: it left ``updated_at`` as it was, and retention deleted a conversation
    its client had just edited as idle."""
    db = Db(fresh_database_url)
    with serve_proxy(make_settings(fresh_database_url, upstream_url)) as p:
        http = p.http("sk-retention-metadata")
        ids = [http.post("/v1/conversations", json={"items": [user("keep me")], "metadata": {"n": str(i)}}).json()["id"]
               for i in range(2)]
        for cid in ids:
            age(db, cid, 40)
        r = http.post(f"/v1/conversations/{ids[0]}", json={"metadata": {"n": "edited"}})
        assert r.status_code == 200, r.text
    done = cli(fresh_database_url, "--idle-days", "30")
    assert "deleted 1 conversation(s)" in done.output, done.output
    assert exists(db, ids[0]) and not exists(db, ids[1])
