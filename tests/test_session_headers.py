"""Session headers and sessions that continue another one (docs/behaviour.md#full-history-mode,
docs/behaviour.md#full-history-mode): under /auto/v1 an app's session header names the conversation, so one app session is
one conversation (an edit of its first question a second root of it); a full-history call to a
conversation that does not exist yet, continuing another conversation's node, makes it a fork
there. Driven through the openai SDK over HTTP; the assertions are on what the fake upstream
received and what was stored."""

import uuid

import openai

from proxy.sessions import Sessions

from .conftest import make_settings, serve_proxy, wait_for
from .fakes import Reply
from .helpers import MODEL, system, user


def chat(client, messages, headers=None):
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=messages, extra_headers=headers or {})
    return raw.parse(), raw.headers


def answer(completion):
    return {"role": "assistant", "content": completion.choices[0].message.content}


def auto(proxy, key):
    return openai.OpenAI(base_url=f"{proxy.url}/auto/v1", api_key=key, max_retries=0)


def sid():
    return f"{uuid.uuid4()}"


def conversation(proxy, key, cid):
    r = proxy.http(key).get(f"/admin/conversations/{cid}")
    assert r.status_code == 200, r.text
    return r.json()


def test_a_session_header_names_the_conversation_and_a_first_question_edit_is_a_second_root(proxy, upstream, key, db):
    client, session = auto(proxy, key), sid()
    on = {"session-id": session}
    first, h1 = chat(client, [system("Be brief."), user("first question")], on)
    assert h1["x-conversation-id"] == session and h1["x-parent-node-id"] == "root"
    second, h2 = chat(client, [system("Be brief."), user("first question"), answer(first), user("second")], on)
    assert h2["x-conversation-id"] == session and h2["x-parent-node-id"] == h1["x-node-id"]
    assert h2["x-context-matched"] == "2"
    # the app's edit of its very first question matches nothing: a second root of the same conversation
    _, h3 = chat(client, [system("Be brief."), user("first question, edited")], on)
    assert h3["x-conversation-id"] == session and h3["x-parent-node-id"] == "root"
    rows = db.fetch("SELECT parent_id, sent FROM nodes WHERE conversation_id = $1 ORDER BY created_at", session)
    assert [r["sent"] for r in rows] == [[system("Be brief."), user("first question")], [user("second")],
                                         [system("Be brief."), user("first question, edited")]]  # (a root: its system)
    assert rows[0]["parent_id"] is None and rows[2]["parent_id"] is None
    assert conversation(proxy, key, session)["node_count"] == 3
    # the upstream got each history as the client sent it, once
    assert [m["content"] for m in upstream.turn_requests[1].messages] == ["Be brief.", "first question",
                                                                       "echo: first question", "second"]
    # without the header the same edit would have been a conversation of its own: it is found by content
    _, h4 = chat(client, [user("no session here")])
    assert h4["x-conversation-id"].startswith("auto-")


def test_the_responses_api_and_every_default_header(proxy, upstream, key):
    client = auto(proxy, key)
    for name in ("X-Claude-Code-Session-Id", "session-id", "X-OpenWebUI-Chat-Id"):
        session = sid()
        raw = client.responses.with_raw_response.create(model=MODEL, input=f"hello via {name}",
                                                        extra_headers={name: session})
        assert raw.headers["x-conversation-id"] == session, name
        assert raw.headers["x-context-mode"] == "full"


def test_an_invalid_value_is_ignored_and_x_conversation_id_wins(proxy, upstream, key):
    client = auto(proxy, key)
    _, h = chat(client, [user("odd session")], {"session-id": "not a conversation id/.."})
    assert h["x-conversation-id"].startswith("auto-")
    _, h = chat(client, [user("too long")], {"session-id": "x" * 129})
    assert h["x-conversation-id"].startswith("auto-")
    named, session = f"named-{uuid.uuid4().hex[:8]}", sid()
    _, h = chat(client, [user("named")], {"session-id": session, "X-Conversation-Id": named})
    assert h["x-conversation-id"] == named
    # several session headers: the first of [server] session_headers wins, an invalid one is skipped
    webui, codex = sid(), sid()
    _, h = chat(client, [user("two headers")], {"X-OpenWebUI-Chat-Id": webui, "session-id": codex})
    assert h["x-conversation-id"] == codex
    _, h = chat(client, [user("first invalid")], {"X-Claude-Code-Session-Id": "bad value", "X-OpenWebUI-Chat-Id": webui})
    assert h["x-conversation-id"] == webui


def test_named_reads_the_configured_headers_in_their_order():
    sessions = Sessions(None, None, ["X-My-Session", "session-id"])  # type: ignore[arg-type]
    assert sessions.named([("Session-Id", " abc "), ("x-my-session", "mine")]) == "mine"
    assert sessions.named([("session-id", "abc")]) == "abc"
    assert sessions.named([("session-id", "a b")]) is None
    assert sessions.named([("other", "abc")]) is None
    assert Sessions(None, None, []).named([("session-id", "abc")]) is None  # type: ignore[arg-type]


def test_outside_auto_a_session_header_names_nothing(proxy, upstream, key, cid, db):
    session = sid()
    plain = proxy.openai(key)
    _, h = chat(plain, [user("plain pass-through")], {"session-id": session})
    assert "x-conversation-id" not in h  # /v1 without an id: passed through, nothing stored
    _, h = chat(proxy.openai(key, conversation=cid), [user("named by the path")], {"session-id": session})
    assert h["x-conversation-id"] == cid
    assert db.fetchval("SELECT count(*) FROM conversations WHERE id = $1", session) == 0


def test_the_setting_changes_which_headers_count(fresh_database_url, upstream_url, upstream):
    key = f"sk-test-{uuid.uuid4().hex}"
    settings = make_settings(fresh_database_url, upstream_url, server={"session_headers": ["X-My-App-Session"]})
    with serve_proxy(settings) as p:
        client = auto(p, key)
        mine = sid()
        _, h = chat(client, [user("custom header")], {"X-My-App-Session": mine})
        assert h["x-conversation-id"] == mine
        _, h = chat(client, [user("a default header no longer counts")], {"session-id": sid()})
        assert h["x-conversation-id"].startswith("auto-")
    settings = make_settings(fresh_database_url, upstream_url, server={"session_headers": []})
    with serve_proxy(settings) as p:
        _, h = chat(auto(p, key), [user("none at all")], {"session-id": sid()})
        assert h["x-conversation-id"].startswith("auto-")


def test_a_resumed_session_under_a_new_id_is_a_fork_of_the_one_it_continues(proxy, upstream, key, db):
    client, original, resumed = auto(proxy, key), sid(), sid()
    history = [system("You are an agent."), user("step one")]
    first, h1 = chat(client, history, {"session-id": original})
    history += [answer(first), user("step two")]
    second, h2 = chat(client, history, {"session-id": original})
    assert h2["x-conversation-id"] == original
    # the agent resumes the session under a new id and resends everything, plus a new question
    history += [answer(second), user("step three, resumed")]
    upstream.reset()
    _, h3 = chat(client, history, {"session-id": resumed})
    assert h3["x-conversation-id"] == resumed and h3["x-parent-node-id"] == h2["x-node-id"]
    assert h3["x-context-matched"] == "4"
    # the upstream got the history once, as the client sent it
    assert [m["content"] for m in upstream.last.messages] == [m["content"] for m in history]
    # the new conversation is a fork at the node it continues: nothing copied, only the new question stored
    fork = conversation(proxy, key, resumed)
    assert fork["forked_from"] == original and fork["fork_node_id"] == h2["x-node-id"]
    own = db.fetch("SELECT sent FROM nodes WHERE conversation_id = $1", resumed)
    assert [r["sent"] for r in own] == [[user("step three, resumed")]]
    assert conversation(proxy, key, original)["node_count"] == 2
    path = proxy.http(key).get(f"/admin/conversations/{resumed}/path").json()["data"]
    assert [n["id"] for n in path] == [h1["x-node-id"], h2["x-node-id"], h3["x-node-id"]]
    # its next call continues in the fork, and the original is untouched
    history += [{"role": "assistant", "content": "echo: step three, resumed"}, user("step four")]
    _, h4 = chat(client, history, {"session-id": resumed})
    assert h4["x-conversation-id"] == resumed and h4["x-parent-node-id"] == h3["x-node-id"]
    assert db.head(original) == h2["x-node-id"]


def test_a_named_full_history_conversation_continuing_another_is_a_fork_too(proxy, upstream, key, db):
    """Not only session headers: any full-history call to a conversation with no nodes yet
    (X-Context-Mode: full under /c/<id>/v1 here) is matched tenant-wide first."""
    source = f"src-{uuid.uuid4().hex[:8]}"
    history = [user("shared start")]
    first, h1 = chat(auto(proxy, key), history, {"X-Conversation-Id": source})
    copy = f"copy-{uuid.uuid4().hex[:8]}"
    named = proxy.openai(key, conversation=copy)
    history += [answer(first), user("and then?")]
    _, h2 = chat(named, history, {"X-Context-Mode": "full"})
    assert h2["x-conversation-id"] == copy and h2["x-parent-node-id"] == h1["x-node-id"]
    assert conversation(proxy, key, copy)["forked_from"] == source
    assert [r["sent"] for r in db.fetch("SELECT sent FROM nodes WHERE conversation_id = $1", copy)] == [[user("and then?")]]


def test_what_continues_nothing_or_another_tenant_is_no_fork(proxy, upstream, key, db):
    client, original = auto(proxy, key), sid()
    first, _ = chat(client, [user("private start")], {"session-id": original})
    history = [user("private start"), answer(first), user("more")]
    # another tenant resending the same history: a root of its own conversation, nothing of the first
    stranger, theirs = auto(proxy, f"sk-test-{uuid.uuid4().hex}"), sid()
    _, h = chat(stranger, history, {"session-id": theirs})
    assert h["x-conversation-id"] == theirs and h["x-parent-node-id"] == "root" and h["x-context-matched"] == "0"
    assert db.fetchval("SELECT forked_from FROM conversations WHERE id = $1", theirs) is None
    # a new session of the same tenant that continues nothing: an ordinary first call, no fork
    fresh = sid()
    _, h = chat(client, [user("something else entirely")], {"session-id": fresh})
    assert h["x-parent-node-id"] == "root"
    assert db.fetchval("SELECT forked_from FROM conversations WHERE id = $1", fresh) is None
    # a session that exists already is never forked, even when its history continues another one
    _, h = chat(client, [user("something else entirely"), {"role": "assistant", "content": "echo: something else entirely"},
                         user("next")], {"session-id": fresh})
    _, h = chat(client, history, {"session-id": fresh})
    assert h["x-conversation-id"] == fresh and h["x-parent-node-id"] == "root"
    assert db.fetchval("SELECT forked_from FROM conversations WHERE id = $1", fresh) is None


def test_a_retried_failed_first_call_of_another_session_continues_nothing(proxy, upstream, key, db):
    client, original, other = auto(proxy, key), sid(), sid()
    upstream.enqueue(Reply(kind="error", status=500))
    try:
        chat(client, [user("fails first")], {"session-id": original})
    except openai.InternalServerError:
        pass
    _, h = chat(client, [user("fails first")], {"session-id": other})
    assert h["x-conversation-id"] == other and h["x-parent-node-id"] == "root"
    assert db.fetchval("SELECT forked_from FROM conversations WHERE id = $1", other) is None


def test_the_access_log_says_how_a_call_was_matched(proxy, upstream, key, caplog):
    import json
    import logging

    from proxy.logs import JsonFormatter

    caplog.set_level(logging.INFO)
    client, session = auto(proxy, key), sid()
    first, _ = chat(client, [user("logged question")], {"session-id": session, "X-Request-Id": f"first-{session}"})
    chat(client, [user("logged question"), answer(first), user("logged follow-up")],
         {"session-id": session, "X-Request-Id": f"second-{session}"})

    def logged() -> tuple[list[dict], dict[str, dict]] | None:
        # (a request's line is written once its answer is sent: the client may read it first)
        lines = [json.loads(JsonFormatter().format(r)) for r in caplog.records if r.name == "branchpoint.access"]
        mine = {x["request_id"]: x for x in lines if x.get("request_id", "").endswith(session)}
        return (lines, mine) if len(mine) == 2 else None

    lines, mine = wait_for(logged, what="both requests' access-log lines")
    assert mine[f"first-{session}"]["context_mode"] == "full" and mine[f"first-{session}"]["context_matched"] == 0
    assert mine[f"second-{session}"]["context_matched"] == 2 and mine[f"second-{session}"]["conversation_id"] == session
    assert all("context_mode" not in x for x in lines if x.get("route") == "/healthz")


def test_a_conversation_made_empty_and_continuing_another_is_a_fork_too(proxy, upstream, key, db):
    """A conversation that exists with no node yet -- made by the Conversations API without items,
    with its metadata -- is still a conversation with no nodes: its first full-history call that
    continues another conversation makes it a fork there (it stored the whole history again as a
    root). Its metadata and its creation time stay. One that holds a node is no fork."""
    source = f"src-{uuid.uuid4().hex[:8]}"
    history = [user("shared opening")]
    first, h1 = chat(auto(proxy, key), history, {"X-Conversation-Id": source})
    http = proxy.http(key)
    made = http.post("/v1/conversations", json={"metadata": {"topic": "kept"}}).json()
    named = proxy.openai(key, conversation=made["id"])
    history += [answer(first), user("and then?")]
    _, h2 = chat(named, history, {"X-Context-Mode": "full"})
    assert h2["x-conversation-id"] == made["id"] and h2["x-parent-node-id"] == h1["x-node-id"]
    assert conversation(proxy, key, made["id"])["forked_from"] == source
    assert [r["sent"] for r in db.fetch("SELECT sent FROM nodes WHERE conversation_id = $1", made["id"])] == \
        [[user("and then?")]]
    again = http.get(f"/v1/conversations/{made['id']}").json()
    assert again["metadata"] == {"topic": "kept"} and again["created_at"] == made["created_at"]

    holding = http.post("/v1/conversations", json={"items": [{"type": "message", "role": "user",
                                                              "content": "its own"}]}).json()
    _, h3 = chat(proxy.openai(key, conversation=holding["id"]), history, {"X-Context-Mode": "full"})
    assert conversation(proxy, key, holding["id"]).get("forked_from") is None and h3["x-parent-node-id"] == "root"


def test_a_session_deleted_and_named_again_continues_another_conversation_as_a_new_one(proxy, upstream, key,
                                                                                        monkeypatch):
    """A process remembers a session it saw begun, so its next calls skip the look-up of its row
    -- for a while only (``_SEEN_FOR``, here made nothing): a conversation deleted meanwhile (by
    any process: another one's delete is never heard of) and named again is new again, so a
    history continuing another conversation is that one's fork, as a session never seen gets it.
    Remembered for good, it was a new root holding the whole history again, unlike in a process
    that had not seen it."""
    import proxy.sessions as sessions

    monkeypatch.setattr(sessions, "_SEEN_FOR", 0.0, raising=False)
    client, session = auto(proxy, key), sid()
    first, _ = chat(client, [user("S one")], {"session-id": session})
    chat(client, [user("S one"), answer(first), user("S two")], {"session-id": session})  # (seen begun)
    assert proxy.http(key).delete(f"/admin/conversations/{session}").status_code == 200
    other, history = sid(), [user("Y one")]
    reply, h = chat(client, history, {"session-id": other})
    history += [answer(reply), user("Y two, from the deleted session's id")]
    _, again = chat(client, history, {"session-id": session})
    assert again["x-parent-node-id"] == h["x-node-id"] and again["x-context-matched"] == "2"
    assert conversation(proxy, key, session)["forked_from"] == other
