def test_two_turns(proxy, upstream, client, cid, db):
    h = {"X-Conversation-Id": cid}
    r1 = client.chat.completions.with_raw_response.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "hello"}], extra_headers=h)
    c1 = r1.parse()
    assert c1.choices[0].message.content == "echo: hello"
    n1 = r1.headers["x-node-id"]
    assert r1.headers["x-parent-node-id"] == "root"
    r2 = client.chat.completions.with_raw_response.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "again"}], extra_headers=h)
    assert r2.headers["x-parent-node-id"] == n1
    sent = upstream.last.messages
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert sent[1]["content"] == "echo: hello"
    assert db.head(cid) == r2.headers["x-node-id"]
