"""Full-history calls reach the upstream in the client's order: system/developer messages stay
where the client put them (an agent's trailing reminder stays last), the stored nodes stay deltas,
and ``/request`` rebuilds the body byte for byte (docs/behaviour.md#full-history-mode)."""

from __future__ import annotations

import httpx

from proxy.assembly import Target, assemble, system_positions
from tests.conftest import Proxy
from tests.fakes import FakeUpstream, Reply


class _Node:
    def __init__(self, sent, received, status="success", provider="p"):
        self.sent, self.received, self.status, self.provider = sent, received, status, provider


def test_system_positions_and_placement() -> None:
    sys_a, sys_b = {"role": "system", "content": "A"}, {"role": "system", "content": "B"}
    u1, a1, u2 = {"role": "user", "content": "1"}, {"role": "assistant", "content": "x"}, {"role": "user", "content": "2"}
    assert system_positions([sys_a, u1, a1, u2]) is None  # first: the system rule's own layout
    assert system_positions([sys_a, u1, a1, u2, sys_b]) == [3, 0]
    path = [_Node([sys_a, u1], [a1])]
    # (a full-history node stores the call's system messages when they differ from those in effect)
    out = assemble(path, [sys_a, u2, sys_b], Target("p"), [3, 0]).messages
    assert out == [sys_a, u1, a1, u2, sys_b]
    # without positions (delta mode): the most recent system messages first, once
    assert assemble(path, [sys_a, u2, sys_b], Target("p")).messages == [sys_a, sys_b, u1, a1, u2]
    # positions that do not fit the system messages in effect: the system rule's layout
    assert assemble(path, [u2], Target("p"), [3, 0]).messages == [sys_a, u1, a1, u2]
    # a position inside what is no longer there (compaction summarised it) goes first
    assert assemble([_Node([u2], None, status="pending")], [sys_a], Target("p"), [5]).messages == [sys_a, u2]


def test_a_trailing_reminder_stays_last(proxy: Proxy, upstream: FakeUpstream, key: str) -> None:
    http = httpx.Client(base_url=f"{proxy.url}/auto/v1", headers={"Authorization": f"Bearer {key}"}, timeout=30)
    system = {"role": "system", "content": "You are aider."}
    reminder = {"role": "system", "content": "Reply in SEARCH/REPLACE blocks."}
    first = [system, {"role": "user", "content": "add a test"}, reminder]
    upstream.enqueue(Reply(content="Done."))
    r1 = http.post("/chat/completions", json={"model": "m", "messages": first})
    assert r1.status_code == 200, r1.text
    assert upstream.last.messages == first
    second = [system, {"role": "user", "content": "add a test"}, {"role": "assistant", "content": "Done."},
              {"role": "user", "content": "and run it"}, reminder]
    r2 = http.post("/chat/completions", json={"model": "m", "messages": second})
    assert r2.headers["x-context-matched"] == "2" and r2.headers["x-conversation-id"] == r1.headers["x-conversation-id"]
    assert upstream.last.messages == second  # exactly the client's layout
    node = http.get(f"{proxy.url}/admin/nodes/{r2.headers['x-node-id']}").json()
    assert node["sent"] == [{"role": "user", "content": "and run it"}]  # the system messages: unchanged, not stored again
    replay = http.get(f"{proxy.url}/admin/nodes/{r2.headers['x-node-id']}/request")
    assert replay.headers["x-request-verified"] == "true"
    assert replay.json()["messages"] == second
    http.close()
