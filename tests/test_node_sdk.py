"""'Any existing OpenAI client' in a second language: the official openai Node package drives
Branchpoint -- a turn, a streamed turn and an edit via X-Parent-Node-Id."""

import json
import os
import shutil
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent / "node"


def _run_node(script: str, env: dict[str, str]) -> dict:
    """Run ``tests/node/<script>`` with its npm packages (installed on first use) and return the
    JSON it prints. Node.js is required, not optional: .ci/run installs it (Debian's nodejs and
    npm), and a machine without it fails here rather than skipping what the README claims."""
    assert shutil.which("node") and shutil.which("npm"), \
        "Node.js (node and npm) is needed for the Node SDK tests: apt-get install nodejs npm"
    if not all((HERE / "node_modules" / name).exists() for name in ("openai", "ai", "@ai-sdk/openai", "zod")):
        result = subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=HERE, capture_output=True, text=True,
                                timeout=300)
        assert result.returncode == 0, f"npm ci failed (the npm registry must be reachable): {result.stderr[-2000:]}"
    result = subprocess.run(["node", script], cwd=HERE, env={**os.environ, **env}, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_the_node_sdk_drives_branchpoint(proxy, upstream, key, cid):
    seen = _run_node("sdk.mjs", {"BASE_URL": proxy.url, "API_KEY": key, "CONVERSATION": cid})
    assert seen["first"]["text"] == "echo: node turn one"
    assert seen["second"]["text"] == "echo: node turn two" and seen["second"]["parent"] == seen["first"]["node"]
    assert seen["edit"]["parent"] == seen["first"]["node"]
    # what the upstream received for the edit: the first turn and the edited question, not turn two
    assert [m["content"] for m in upstream.last.messages] == ["node turn one", "echo: node turn one", "node turn two, edited"]
    assert upstream.chat_requests[1].body["stream"] is True


def test_the_vercel_ai_sdk_chat_provider_resending_its_history(proxy, upstream, key, db):
    """The Vercel AI SDK (npm ``ai`` + ``@ai-sdk/openai``, ``provider.chat()``) resends its whole
    history: a tool loop, then a follow-up. The upstream receives what the SDK sent, once."""
    from storage.transcript import canonical

    from .fakes import Reply
    from .helpers import tool_call

    upstream.enqueue(Reply(content=None, tool_calls=[tool_call("call_v1", "weather", '{"city": "Paris"}')]),
                     Reply(content="It is 21 C in Paris."), Reply(content="Tomorrow too."))
    seen = _run_node("vercel.mjs", {"BASE_URL": proxy.url, "API_KEY": key, "PROVIDER_API": "chat"})
    assert seen["first"]["text"] == "It is 21 C in Paris." and seen["second"]["text"] == "Tomorrow too."
    assert len(seen["sent"]) == 3
    received = upstream.turn_requests[-3:]
    assert [len(r.messages) for r in received] == [1, 3, 5]
    for sent, got in zip(seen["sent"], received, strict=True):
        assert [canonical(m) for m in got.messages] == [canonical(m) for m in sent["messages"]]
    assert seen["second"]["mode"] == "full" and seen["second"]["matched"] == "4"
    cid = seen["second"]["conversation"]
    assert cid.startswith("auto-") and seen["first"]["conversation"] == cid
    rows = db.fetch("SELECT sent FROM nodes WHERE conversation_id = $1 ORDER BY created_at", cid)
    assert [len(r["sent"]) for r in rows] == [1, 1, 1]


def test_the_vercel_ai_sdk_default_provider_speaks_responses(proxy, upstream, key, db):
    """The Vercel AI SDK's default provider (``provider(model)``) calls ``/v1/responses``: stored,
    translated over the chat upstream, the history matched by content."""
    from .fakes import Reply
    from .helpers import tool_call

    upstream.enqueue(Reply(content=None, tool_calls=[tool_call("call_r1", "weather", '{"city": "Paris"}')]),
                     Reply(content="It is 21 C in Paris."), Reply(content="Tomorrow too."))
    seen = _run_node("vercel.mjs", {"BASE_URL": proxy.url, "API_KEY": key, "PROVIDER_API": "responses"})
    assert seen["first"]["text"] == "It is 21 C in Paris." and seen["second"]["text"] == "Tomorrow too."
    assert len(seen["sent"]) == 3 and all("input" in body for body in seen["sent"])
    # the SDK takes store: true at its word and references the stored answer; the proxy resolves it
    assert any(i.get("type") == "item_reference" for i in seen["sent"][2]["input"])
    received = upstream.turn_requests[-3:]
    assert [len(r.messages) for r in received] == [1, 3, 5]
    assert received[2].messages[-1] == {"role": "user", "content": "And tomorrow?"}
    cid = seen["second"]["conversation"]
    assert seen["first"]["conversation"] == cid and seen["second"]["mode"] == "full"
    rows = db.fetch("SELECT api, sent FROM nodes WHERE conversation_id = $1 ORDER BY created_at", cid)
    assert [r["api"] for r in rows] == ["responses"] * 3
