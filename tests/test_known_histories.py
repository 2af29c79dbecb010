"""What a process remembers of the histories full-history clients resend (``KnownHistories``,
docs/behaviour.md#full-history-mode): only the items it has not seen sent before are hashed again,
and that never changes a match -- an edited old message, another conversation, a restart, another
process that moved the head all match as a fresh hash would."""

import json
import random
import uuid

import httpx
import msgspec
import pytest

from proxy.assembly import system_positions, system_positions_at
from proxy.call import _tail
from proxy.dialects.chat.request import raw_messages
from storage import transcript

from .conftest import make_settings, serve_proxy
from .helpers import MODEL, assistant, system, tool, tool_call, user

FULL = {"X-Context-Mode": "full"}


def _items(rng: random.Random, n: int) -> list[dict]:
    pool = [
        lambda i: user(f"question {i}"),
        lambda i: assistant(f"answer {i}"),
        lambda i: system(f"rules {i}"),
        lambda i: {"role": "developer", "content": [{"type": "text", "text": f"dev {i}"}]},
        lambda i: assistant(None, tool_calls=[tool_call(f"c{i}", args=json.dumps({"n": i}))]),
        lambda i: tool(f"c{i}", f"result {i}"),
        lambda i: user([{"type": "text", "text": f"  part {i} "}, {"type": "image_url", "image_url": {"url": "u"}}]),
    ]
    return [rng.choice(pool)(rng.randrange(4)) for _ in range(n)]


def _sent(items: list[dict], rng: random.Random) -> list[bytes]:
    """The items as a client might encode them: compact or spaced, keys in one order or another
    (different bytes, the same meaning) -- and decoded back, as the proxy reads them."""
    body = json.dumps({"model": "m", "messages": items},
                      separators=rng.choice([(",", ":"), (", ", ": ")]), sort_keys=rng.random() < 0.5).encode()
    return raw_messages(body)


def _fresh(items: list) -> transcript.HistoryKeys:
    return transcript.HistoryKeys(transcript.prefix_hashes(transcript.digests(items)),
                                  [i for i, m in enumerate(items) if transcript.is_system(m)])


def test_remembered_keys_are_always_the_keys_of_what_was_sent():
    """Histories resent, grown, edited anywhere, cut short, re-encoded, and other conversations'
    under the same key: every call gets exactly the keys a fresh hash gives."""
    rng = random.Random(34)
    known = transcript.KnownHistories(remember_from=0)  # (short histories too: the test's are)
    for _ in range(400):
        key = rng.choice(["a", "b"])
        seen = known._seen.get(key)
        items = [msgspec.json.decode(r) for r in seen.raws] if seen and rng.random() < 0.8 else _items(rng, rng.randrange(8))
        change = rng.random()
        if change < 0.4:
            items += _items(rng, rng.randrange(1, 4))  # the next turn
        elif change < 0.6 and items:
            at = rng.randrange(len(items))  # an edit of an old message (or a regenerate)
            items = items[:at] + _items(rng, 1) + items[at + 1:]
        elif change < 0.7:
            items = items[: rng.randrange(len(items) + 1)]  # trimmed
        raws = _sent(items, rng)
        decoded = [msgspec.json.decode(r) for r in raws]
        assert known.keys(key, raws, decoded) == _fresh(decoded)


def test_only_what_was_not_sent_before_is_hashed():
    known = transcript.KnownHistories()
    items = [system("rules")] + [user(f"q{i}") if i % 2 == 0 else assistant(f"a{i}") for i in range(1000)]
    body = lambda its: json.dumps({"model": "m", "messages": its}).encode()  # noqa: E731
    known.keys("c", raw_messages(body(items)), items)
    assert known.hashed == 1001
    longer = items + [assistant("a"), user("q")]
    assert known.keys("c", raw_messages(body(longer)), longer) == _fresh(longer)
    assert known.hashed == 1003
    # an old message edited: hashed again from there
    edited = longer[:500] + [user("changed")] + longer[501:]
    assert known.keys("c", raw_messages(body(edited)), edited) == _fresh(edited)
    assert known.hashed == 1003 + 503
    # another key: all of it
    assert known.keys("d", raw_messages(body(edited)), edited) == _fresh(edited)
    assert known.hashed == 1003 + 503 + 1003


def test_what_is_remembered_is_bounded():
    known = transcript.KnownHistories(max_bytes=40_000)
    items = [user(f"question {i}") for i in range(10)]
    raws = [json.dumps(i).encode() for i in items]
    for key in range(20):
        known.keys(key, raws, items)
    assert 0 < len(known._seen) < 20 and known._size <= 40_000
    assert list(known._seen)[-1] == 19  # the most recent kept
    # one history larger than an eighth of the room is not kept (no one caller flushes all)
    big = [user("x" * 6000)] * 8
    known.keys("big", [json.dumps(m).encode() for m in big], big)
    assert "big" not in known._seen and known._size <= 40_000
    # nor a short one: hashed anew in microseconds, and an entry costs more than its items
    short = items[:3]
    known.keys("short", raws[:3], short)
    known.keys("empty", [], [])
    assert "short" not in known._seen and "empty" not in known._seen
    with pytest.raises(ValueError):
        known.keys("c", raws[:3], items)


def test_the_room_counts_what_the_entries_really_hold():
    """The bound is on memory, not only the items' bytes: many small histories (the most common
    traffic) stay within it as tracemalloc counts what they hold."""
    import tracemalloc

    known = transcript.KnownHistories(max_bytes=1 << 20)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for k in range(4000):
            items = [user(f"{k}:{i}") for i in range(8)]
            known.keys(("tenant", f"conversation-{k}-" + "c" * 100), [json.dumps(m).encode() for m in items], items)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(known._seen) < 4000 and known._size <= 1 << 20
    assert held <= 1.1 * (1 << 20), held


@pytest.mark.parametrize("system_at", [[], [0], [0, 1], [2], [0, 3, 5], [5], [1, 4]])
def test_the_tail_and_layout_from_the_system_indexes_are_the_scans(system_at):
    items = [system(f"s{i}") if i in system_at else user(f"u{i}") for i in range(6)]
    assert transcript.history_keys(items).system == system_at
    assert system_positions_at(system_at, len(items)) == system_positions(items)
    for skip in range(7):
        for with_system in (True, False):
            assert _tail(items, system_at, skip, with_system) == transcript.tail(items, skip, with_system=with_system)


def _turns(client, cid, count, headers=FULL):
    history = []
    for i in range(count):
        history.append(user(f"question {i}"))
        r = client.post("/v1/chat/completions", headers={**headers, "X-Conversation-Id": cid},
                        json={"model": MODEL, "messages": history})
        assert r.status_code == 200, r.text
        history.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]})
    return history


def _full(client, cid, messages, headers=None):
    r = client.post("/v1/chat/completions", headers={**FULL, "X-Conversation-Id": cid, **(headers or {})},
                    json={"model": MODEL, "messages": messages})
    assert r.status_code == 200, r.text
    return r.headers


def test_an_edited_old_message_after_a_resend_branches_where_it_was_edited(proxy, upstream, key, cid, db):
    http = proxy.http(key)
    history = _turns(http, cid, 4)
    path = [n["id"] for n in http.get(f"/admin/conversations/{cid}/path").json()["data"]]
    _full(http, cid, history + [user("next")])  # (what this process saw last: the whole history)
    edited = history[:2] + [user("question 1, edited")] + history[3:] + [user("next")]
    h = _full(http, cid, edited)
    assert h["x-context-matched"] == "2" and h["x-parent-node-id"] == path[0]
    assert db.node(h["x-node-id"])["sent"] == edited[2:]
    assert [m["content"] for m in upstream.last.messages] == [m["content"] for m in edited]
    # the same message edited again, differently: still not the first edit's branch
    again = history[:2] + [user("question 1, edited twice")] + history[3:] + [user("next")]
    h2 = _full(http, cid, again)
    assert h2["x-context-matched"] == "2" and h2["x-parent-node-id"] == path[0]
    # and the first edit resent, with its answer, goes on from the first edit's node
    h3 = _full(http, cid, edited + [assistant("echo: next"), user("more")])
    assert h3["x-context-matched"] == str(len(edited) + 1) and h3["x-parent-node-id"] == h["x-node-id"]


def test_conversations_sharing_a_first_message_never_take_each_others_keys(proxy, upstream):
    """/auto/v1 remembers a history by its tenant and first item: two chats that begin with the
    same system prompt share that entry, and each still continues its own conversation."""
    key = f"sk-auto-{uuid.uuid4().hex}"
    chats = {c: {"history": [system("same rules"), user(f"hello {c}")]} for c in "ab"}
    with httpx.Client(base_url=f"{proxy.url}/auto/v1", headers={"Authorization": f"Bearer {key}"}, timeout=30) as http:
        for turn in range(4):
            for chat in chats.values():
                history = chat["history"]
                r = http.post("/chat/completions", json={"model": MODEL, "messages": history})
                assert r.status_code == 200, r.text
                assert r.headers["x-context-matched"] == str(len(history) - 2)
                if turn:
                    assert r.headers["x-conversation-id"] == chat["id"]
                    assert r.headers["x-parent-node-id"] == chat["node"]
                chat["id"], chat["node"] = r.headers["x-conversation-id"], r.headers["x-node-id"]
                history += [assistant(r.json()["choices"][0]["message"]["content"]), user(f"more {turn}")]
    assert chats["a"]["id"] != chats["b"]["id"]


def test_a_restart_and_another_process_match_as_a_fresh_hash(fresh_database_url, upstream_url, upstream, key, cid):
    """Two processes on one database, each remembering what it saw: the other one moves the head,
    edits, and a process started afresh -- every call matches what is stored, not what was seen."""
    settings = make_settings(fresh_database_url, upstream_url)
    with serve_proxy(settings) as a, serve_proxy(settings) as b:
        ha, hb = a.http(key), b.http(key)
        history = _turns(ha, cid, 3)
        _full(ha, cid, history + [user("seen by a")])
        # b goes on: two more turns a never saw
        for q in ("b one", "b two"):
            history.append(user(q))
            _full(hb, cid, history)
            history.append(assistant(f"echo: {q}"))
        head = b.db.head(cid)
        h = _full(ha, cid, history + [user("a again")])
        assert h["x-context-matched"] == str(len(history)) and h["x-parent-node-id"] == head
        # b edits a message a saw: both processes put the next call on b's edit
        edited = history[:4] + [user("edited by b")]
        hb_edit = _full(hb, cid, edited)
        assert hb_edit["x-context-matched"] == "4"
        follow = edited + [assistant("echo: edited by b"), user("then")]
        h = _full(ha, cid, follow)
        assert h["x-context-matched"] == "6" and h["x-parent-node-id"] == hb_edit["x-node-id"]
    with serve_proxy(settings) as c:  # a restart: nothing remembered
        h = _full(c.http(key), cid, follow)
        assert h["x-context-matched"] == "6" and h["x-parent-node-id"] == hb_edit["x-node-id"]


def test_a_repeated_messages_key_is_read_as_the_body_reads_it(proxy, upstream, key, cid):
    """A body naming ``messages`` twice: the last one counts, for matching as for the rest."""
    http = proxy.http(key)
    history = _turns(http, cid, 2)
    real = json.dumps(history + [user("next")])
    body = f'{{"model": "{MODEL}", "messages": [{{"role": "user", "content": "decoy"}}], "messages": {real}}}'
    r = http.post("/v1/chat/completions", content=body,
                  headers={**FULL, "X-Conversation-Id": cid, "content-type": "application/json"})
    assert r.status_code == 200 and r.headers["x-context-matched"] == "4"
    assert upstream.last.messages[-1]["content"] == "next"


@pytest.mark.parametrize("name", ["_bp_x", "\\u005fbp_x", "_\\u0062p_x", "\\u005F\\u0062\\u0070_x"])
def test_a_message_with_the_proxys_own_key_is_refused_however_it_is_written(proxy, key, cid, name):
    http = proxy.http(key)
    body = f'{{"model": "{MODEL}", "messages": [{{"role": "user", "content": "hi", "{name}": 1}}]}}'
    r = http.post("/v1/chat/completions", content=body,
                  headers={**FULL, "X-Conversation-Id": cid, "content-type": "application/json"})
    assert r.status_code == 400 and "is not a message field" in r.text
    # the same bytes inside a text are a text
    body = f'{{"model": "{MODEL}", "messages": [{{"role": "user", "content": "{name}"}}]}}'
    assert http.post("/v1/chat/completions", content=body,
                     headers={**FULL, "X-Conversation-Id": cid, "content-type": "application/json"}).status_code == 200


def test_the_openai_sdk_resending_a_long_history_stores_only_what_is_new(proxy, upstream, key, cid, db):
    client = proxy.openai(key, conversation=cid)
    history = [system("Be brief.")]
    for i in range(20):
        history.append(user(f"q{i}"))
        raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=history, extra_headers=FULL)
        assert raw.headers["x-context-matched"] == str(2 * i)
        history.append({"role": "assistant", "content": raw.parse().choices[0].message.content})
        assert db.node(raw.headers["x-node-id"])["sent"] == ([system("Be brief.")] if i == 0 else []) + [user(f"q{i}")]


def test_what_was_seen_before_is_not_checked_again_but_everything_new_is(proxy, upstream, key, cid):
    """Messages sent before in this conversation passed the checks then; a new or changed one is
    checked as ever: a bad role or an own key anywhere among them is refused."""
    http = proxy.http(key)
    history = _turns(http, cid, 3)
    _full(http, cid, history + [user("next")])
    post = lambda messages: http.post("/v1/chat/completions", headers={**FULL, "X-Conversation-Id": cid},  # noqa: E731
                                      json={"model": MODEL, "messages": messages})
    bad_role = post(history + [{"role": "root", "content": "x"}])
    assert bad_role.status_code == 400 and "messages[6].role" in bad_role.text
    changed = post([history[0], {**history[1], "_bp_x": 1}, *history[2:], user("next")])
    assert changed.status_code == 400 and "messages[1]" in changed.text
    not_an_object = post([*history[:2], "text", *history[2:]])
    assert not_an_object.status_code == 400 and "messages[2] must be an object" in not_an_object.text
    assert post(history + [user("next")]).status_code == 200


def test_a_repeated_messages_key_whose_first_value_is_no_array(proxy, upstream, key, cid):
    http = proxy.http(key)
    history = _turns(http, cid, 1)
    body = f'{{"model": "{MODEL}", "messages": 5, "messages": {json.dumps(history + [user("next")])}}}'
    r = http.post("/v1/chat/completions", content=body,
                  headers={**FULL, "X-Conversation-Id": cid, "content-type": "application/json"})
    assert r.status_code == 200 and r.headers["x-context-matched"] == "2"
