"""The built-in upstream transport: keep-alive reuse, streaming bodies, errors in httpx's terms."""

import asyncio

import httpx
import pytest

from proxy.transport import UpstreamTransport

from .fakes import Reply, free_port


def test_upstream_connections_are_reused(proxy, upstream, key, cid):
    transport = proxy.services.upstream.transport
    assert isinstance(transport, UpstreamTransport)
    client = proxy.openai(key)
    for i in range(5):  # warm: at most one new connection for this test's sequential calls
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": str(i)}],
                                       extra_headers={"X-Conversation-Id": cid})
    before = transport.connects
    for i in range(20):
        result = client.chat.completions.create(model="m", messages=[{"role": "user", "content": str(i)}],
                                                extra_headers={"X-Conversation-Id": cid}, stream=i % 2 == 0)
        if i % 2 == 0:
            list(result)  # read the stream to its end
    # calls ride idle keep-alive connections (a connection per call would add 20 here; a stream's
    # connection returns to the pool just after its [DONE], so a racing next call may open one)
    assert transport.connects - before <= 2


def test_transport_directly(upstream_url, upstream):
    async def go():
        t = UpstreamTransport(keepalive_expiry=30)
        async with httpx.AsyncClient(transport=t, timeout=5) as c:
            r = await c.post(f"{upstream_url}/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "echo: x"
            upstream.enqueue(Reply(content="abcdefghij"))
            async with c.stream("POST", f"{upstream_url}/chat/completions",
                                json={"model": "m", "messages": [], "stream": True}) as s:
                chunks = [chunk async for chunk in s.aiter_bytes()]
            assert b"".join(chunks).endswith(b"data: [DONE]\n\n") and len(chunks) > 1
            r = await c.get(f"{upstream_url}/models")
            assert r.json()["data"][0]["id"] == "fake-model"
            assert t.connects == 1 and t.idle_connections() == 1
            # a response abandoned half-read closes its connection instead of reusing it
            upstream.enqueue(Reply(content="x" * 300, chunk_delay=0.01))
            async with c.stream("POST", f"{upstream_url}/chat/completions", json={"model": "m", "messages": [], "stream": True}) as s:
                async for _ in s.aiter_bytes():
                    break
            assert t.idle_connections() == 0
            with pytest.raises(httpx.ConnectError):
                await c.get(f"http://127.0.0.1:{free_port()}/v1/models")
            upstream.enqueue(Reply(delay=2))
            with pytest.raises(httpx.ReadTimeout):
                await c.post(f"{upstream_url}/chat/completions", json={"model": "m", "messages": []}, timeout=0.3)

    asyncio.run(go())
