"""A chat client's ``cache_control`` markers (Anthropic prompt caching through OpenAI-compatible
gateways): the upstream gets the markers of the call being made, where the client put them, and
no marker an earlier call left on a stored message -- in full-history mode (the client resends its
history with only its newest message marked) and in delta mode alike; ``/request`` rebuilds the
same body. Unit tests of the positions first, then through the openai SDK against the fake
upstream (what it received is the assertion)."""

import json

from proxy.dialects.chat.markers import MESSAGE, apply_markers, markers

from .helpers import MODEL

EPHEMERAL = {"type": "ephemeral"}


def marked(text, marker=EPHEMERAL):
    return {"role": "user", "content": [{"type": "text", "text": text, "cache_control": marker}]}


def count_markers(messages):
    return json.dumps(messages).count('"cache_control"')


def test_markers_are_recorded_from_the_end_system_messages_among_themselves():
    messages = [{"role": "system", "content": [{"type": "text", "text": "s", "cache_control": EPHEMERAL}]},
                {"role": "developer", "content": "d", "cache_control": {"type": "ephemeral", "ttl": "1h"}},
                {"role": "user", "content": "old"},
                {"role": "system", "content": [{"type": "text", "text": "reminder", "cache_control": EPHEMERAL}]},
                marked("new")]
    assert markers(messages) == [[-3, 0, EPHEMERAL], [-2, MESSAGE, {"type": "ephemeral", "ttl": "1h"}],
                                 [-1, 0, EPHEMERAL], [0, 0, EPHEMERAL]]
    assert markers([{"role": "user", "content": "plain"}]) == []


def test_a_system_message_sent_after_the_question_keeps_its_marker_where_assembly_puts_it():
    """A delta call's system message goes first in the assembled request (the system rule): its
    marker goes with it, and the question's stays on the question -- not on the answer before it."""
    found = markers([marked("first"), {"role": "system", "content": [{"type": "text", "text": "sys",
                                                                      "cache_control": EPHEMERAL}]}])
    assembled = [{"role": "system", "content": "sys"}, {"role": "user", "content": "q"},
                 {"role": "assistant", "content": "echo: q"}, {"role": "user", "content": [{"type": "text", "text": "first"}]}]
    out = apply_markers(assembled, found)
    assert out[0]["content"] == [{"type": "text", "text": "sys", "cache_control": EPHEMERAL}]
    assert out[3]["content"] == [{"type": "text", "text": "first", "cache_control": EPHEMERAL}]
    assert count_markers(out) == 2


def test_applied_markers_replace_every_stored_one_and_leave_the_path_unchanged():
    path = [{"role": "system", "content": "be brief"},
            marked("one"), {"role": "assistant", "content": "a1", "cache_control": EPHEMERAL},
            marked("two"), {"role": "assistant", "content": "a2"}, {"role": "user", "content": "three"}]
    before = json.dumps(path)
    found = [[-1, 0, EPHEMERAL], [0, 0, {"type": "ephemeral", "ttl": "5m"}], [2, MESSAGE, EPHEMERAL]]
    out = apply_markers(path, found)
    assert json.dumps(path) == before  # (the path's messages are shared: never changed)
    assert out[0] == {"role": "system", "content": [{"type": "text", "text": "be brief", "cache_control": EPHEMERAL}]}
    assert out[1] == {"role": "user", "content": [{"type": "text", "text": "one"}]}
    assert out[2] == {"role": "assistant", "content": "a1"}
    assert out[3] == {"role": "user", "content": [{"type": "text", "text": "two"}], "cache_control": EPHEMERAL}
    assert out[5] == {"role": "user", "content": [{"type": "text", "text": "three",
                                                   "cache_control": {"type": "ephemeral", "ttl": "5m"}}]}
    assert count_markers(out) == 3
    # a position the assembled request does not have is left out, not forced elsewhere
    assert count_markers(apply_markers(path[1:], [[-1, 0, EPHEMERAL], [40, 0, EPHEMERAL]])) == 0


def test_full_history_with_the_newest_message_marked_sends_one_marker(proxy, upstream, key, cid):
    client, http = proxy.openai(key, conversation=cid), proxy.http(key)
    system = {"role": "system", "content": [{"type": "text", "text": "You are terse.", "cache_control": EPHEMERAL}]}
    history = []
    for i in range(6):
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[system, *history, marked(f"q{i}")], extra_headers={"X-Context-Mode": "full"})
        answer = raw.parse().choices[0].message.content
        assert raw.headers["x-context-matched"] == str(2 * i)
        sent = upstream.last.messages
        assert len(sent) == 2 * i + 2
        # the system prompt's marker and the newest question's: no earlier question's
        assert count_markers(sent) == 2, sent
        assert sent[0]["content"][0]["cache_control"] == EPHEMERAL
        assert sent[-1]["content"][0] == {"type": "text", "text": f"q{i}", "cache_control": EPHEMERAL}
        request = http.get(f"/admin/nodes/{raw.headers['x-node-id']}/request")
        assert request.json() == upstream.last.body and request.headers["x-request-verified"] == "true"
        history += [{"role": "user", "content": [{"type": "text", "text": f"q{i}"}]},
                    {"role": "assistant", "content": answer}]


def test_delta_calls_each_marking_their_message_send_the_last_marker_only(proxy, upstream, key, cid):
    client = proxy.openai(key, conversation=cid)
    for i in range(5):
        client.chat.completions.create(model=MODEL, messages=[marked(f"turn {i}")])
        sent = upstream.last.messages
        assert count_markers(sent) == 1, sent
        assert sent[-1]["content"][0]["cache_control"] == EPHEMERAL
    # a call without markers sends none: those earlier calls put on their messages stay stored,
    # not sent (the path cache's shortcut, which would splice them in, is not taken)
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=[{"role": "user", "content": "unmarked"}])
    assert count_markers(upstream.last.messages) == 0 and len(upstream.last.messages) == 11
    request = proxy.http(key).get(f"/admin/nodes/{raw.headers['x-node-id']}/request")
    assert request.json() == upstream.last.body and request.headers["x-request-verified"] == "true"
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "again"}])
    assert count_markers(upstream.last.messages) == 0


def test_another_apis_client_continuing_sends_no_stored_marker(proxy, upstream, key, cid):
    """A Responses client continuing a path a chat client marked, over a chat upstream: the
    markers those chat calls stored are theirs, not sent with this call."""
    chat = proxy.openai(key, conversation=cid)
    for i in range(5):
        chat.chat.completions.create(model=MODEL, messages=[marked(f"turn {i}")])
    raw = chat.responses.with_raw_response.create(model=MODEL, input="from the Responses API")
    assert count_markers(upstream.last.messages) == 0 and len(upstream.last.messages) == 11
    request = proxy.http(key).get(f"/admin/nodes/{raw.headers['x-node-id']}/request")
    assert request.json() == upstream.last.body and request.headers["x-request-verified"] == "true"
