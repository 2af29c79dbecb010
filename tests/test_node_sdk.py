"""The clients of a second language: the official openai and Anthropic Node packages drive
Branchpoint (a turn, a streamed turn, an edit via X-Parent-Node-Id; a tool round over the Messages
API, natively and translated), and the Vercel AI SDK's OpenAI and Anthropic providers and the
OpenAI Agents SDK for JS resend their whole history through /auto."""

import fcntl
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent / "node"
_PACKAGES = ("openai", "@anthropic-ai/sdk", "ai", "@ai-sdk/openai", "@ai-sdk/anthropic", "@openai/agents", "zod")


def _run_node(script: str, env: dict[str, str]) -> dict:
    """Run ``tests/node/<script>`` with its npm packages (installed on first use) and return the
    JSON it prints. Node.js is required, not optional: .ci/run installs it (Debian's nodejs and
    npm), and a machine without it fails here rather than skipping what the README claims."""
    assert shutil.which("node") and shutil.which("npm"), \
        "Node.js (node and npm) is needed for the Node SDK tests: apt-get install nodejs npm"
    with open(HERE / "node_modules.lock", "w") as lock:  # (pytest-xdist's workers: one installs, the others wait)
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not all((HERE / "node_modules" / name).exists() for name in _PACKAGES):
            result = subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=HERE, capture_output=True,
                                    text=True, timeout=300)
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


@pytest.mark.parametrize("model", ["claude-x", "gpt-4o-mini"], ids=["anthropic-upstream", "chat-upstream"])
def test_the_anthropic_node_sdk_drives_a_tool_round(mproxy, claude, upstream, key, cid, model):
    """The official Anthropic Node package under /c/<id>: a tool_use answer, its tool_result sent
    back as the only new message and the answer streamed, an edit of the first question, and a
    parent that is not there -- natively over an Anthropic upstream and translated over a chat one.
    Each upstream request holds the path once; the edit holds nothing of the tool round."""
    from .anthropic_fake import AReply
    from .fakes import Reply
    from .helpers import tool_call

    native = model.startswith("claude")
    if native:
        claude.enqueue(AReply(content=[{"type": "text", "text": "Looking."},
                                       {"type": "tool_use", "id": "toolu_n1", "name": "Bash", "input": {"command": "ls"}}],
                              stop_reason="tool_use"),
                       AReply(content=[{"type": "text", "text": "Two text files."}]),
                       AReply(content=[{"type": "text", "text": "One folder up."}]))
    else:
        upstream.enqueue(Reply(content="Looking.", tool_calls=[tool_call("toolu_n1", "Bash", '{"command": "ls"}')]),
                         Reply(content="Two text files."), Reply(content="One folder up."))
    seen = _run_node("anthropic.mjs", {"BASE_URL": mproxy.url, "API_KEY": key, "CONVERSATION": cid, "MODEL": model})

    first, second, edit = seen["first"], seen["second"], seen["edit"]
    assert first["stop"] == "tool_use" and first["call"] == {"id": "toolu_n1", "name": "Bash", "input": {"command": "ls"}}
    assert first["conversation"] == cid and first["parent"] == "root"
    assert second["text"] == "Two text files." and second["stop"] == "end_turn"
    assert second["parent"] == first["node"]
    assert second["events"][0] == "message_start" and second["events"][-1] == "message_stop"
    assert edit["text"] == "One folder up." and edit["parent"] == "root"
    assert seen["error"] == {"name": "NotFoundError", "status": 404, "type": "not_found_error",
                             "body": seen["error"]["body"]}
    assert seen["error"]["body"]["type"] == "error"

    if native:
        got = [r.body for r in claude.calls[-3:]]
        assert [b["system"] for b in got[:2]] == ["You run commands."] * 2 and "system" not in got[2]
        assert got[1]["messages"] == [
            {"role": "user", "content": "What is in this folder?"},
            {"role": "assistant", "content": [{"type": "text", "text": "Looking."},
                                              {"type": "tool_use", "id": "toolu_n1", "name": "Bash",
                                               "input": {"command": "ls"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_n1", "content": "a.txt b.txt"}]}]
        assert got[1]["stream"] is True
        assert got[2]["messages"] == [{"role": "user", "content": "What is in the parent folder?"}]
    else:
        got = upstream.turn_requests[-3:]
        assert got[1].messages[0] == {"role": "system", "content": "You run commands."}
        assert [m["role"] for m in got[1].messages] == ["system", "user", "assistant", "tool"]
        assert got[1].messages[2]["tool_calls"][0]["id"] == "toolu_n1"
        assert got[1].messages[3]["tool_call_id"] == "toolu_n1" and "a.txt b.txt" in json.dumps(got[1].messages[3])
        assert got[1].body["stream"] is True
        assert [m["role"] for m in got[2].messages] == ["user"]
        assert got[2].messages[0]["content"] in ("What is in the parent folder?",
                                                 [{"type": "text", "text": "What is in the parent folder?"}])


@pytest.mark.parametrize("model", ["claude-x", "gpt-4o-mini"], ids=["anthropic-upstream", "chat-upstream"])
def test_the_vercel_ai_sdk_anthropic_provider_resending_its_history(mproxy, claude, upstream, key, db, model):
    """The Vercel AI SDK's Anthropic provider (``@ai-sdk/anthropic``) at /auto/v1: a tool loop,
    then a streamed follow-up, each call resending the whole history. Found by content; the
    upstream receives the history once, as the SDK sent it; each node stores only what was new."""
    from .anthropic_fake import AReply
    from .fakes import Reply
    from .helpers import tool_call

    native = model.startswith("claude")
    if native:
        claude.enqueue(AReply(content=[{"type": "tool_use", "id": "toolu_v1", "name": "weather", "input": {"city": "Paris"}}],
                              stop_reason="tool_use"),
                       AReply(content=[{"type": "text", "text": "It is 21 C in Paris."}]),
                       AReply(content=[{"type": "text", "text": "Tomorrow too."}]))
    else:
        upstream.enqueue(Reply(content=None, tool_calls=[tool_call("toolu_v1", "weather", '{"city": "Paris"}')]),
                         Reply(content="It is 21 C in Paris."), Reply(content="Tomorrow too."))
    seen = _run_node("vercel.mjs", {"BASE_URL": mproxy.url, "API_KEY": key, "PROVIDER_API": "anthropic", "MODEL": model})
    assert seen["first"]["text"] == "It is 21 C in Paris." and seen["second"]["text"] == "Tomorrow too."
    assert len(seen["sent"]) == 3 and all("messages" in body for body in seen["sent"])
    assert seen["sent"][2]["stream"] is True
    cid = seen["second"]["conversation"]
    assert cid.startswith("auto-") and seen["first"]["conversation"] == cid
    assert seen["second"]["mode"] == "full" and seen["second"]["matched"] == "4"

    if native:
        got = [r.body for r in claude.calls[-3:]]
        for sent, body in zip(seen["sent"], got, strict=True):
            assert body["messages"] == sent["messages"]  # the SDK's own history, once
    else:
        got = upstream.turn_requests[-3:]
        assert [[m["role"] for m in r.messages] for r in got] == [
            ["user"], ["user", "assistant", "tool"], ["user", "assistant", "tool", "assistant", "user"]]
        assert got[2].messages[2]["tool_call_id"] == got[2].messages[1]["tool_calls"][0]["id"] == "toolu_v1"
        assert got[2].messages[-1]["content"] in ("And tomorrow?", [{"type": "text", "text": "And tomorrow?"}])
    rows = db.fetch("SELECT api, sent FROM nodes WHERE conversation_id = $1 ORDER BY created_at", cid)
    assert [r["api"] for r in rows] == ["messages"] * 3
    assert [len(r["sent"]) for r in rows] == [1, 1, 1]


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_the_js_agents_sdk_runs_a_tool_round_at_auto(proxy, upstream, key, db, api):
    """The OpenAI Agents SDK for JS (``@openai/agents``) at /auto/v1, its default Responses model and
    its chat-completions one: a run with a tool round, then a streamed run resending the history.
    One conversation, a line of three nodes each storing only what was new; the upstream receives
    the history once."""
    from .fakes import Reply
    from .helpers import tool_call

    upstream.enqueue(Reply(content=None, tool_calls=[tool_call("call_a1", "weather", '{"city": "Paris"}')]),
                     Reply(content="It is 21 C in Paris."), Reply(content="Tomorrow too."))
    seen = _run_node("agents.mjs", {"BASE_URL": proxy.url, "API_KEY": key, "MODEL_API": api})
    assert seen["first"] == "It is 21 C in Paris." and seen["second"] == "Tomorrow too."
    assert "output_text_delta" in seen["events"] and all(seen["usage"])
    calls = seen["calls"]
    assert [c["matched"] for c in calls] == ["0", "2", "4"] and {c["mode"] for c in calls} == {"full"}
    assert [c["parent"] for c in calls] == ["root", calls[0]["node"], calls[1]["node"]]
    cid = calls[0]["conversation"]
    assert {c["conversation"] for c in calls} == {cid}
    got = upstream.turn_requests[-3:]
    assert [[m["role"] for m in r.messages] for r in got] == [
        ["system", "user"], ["system", "user", "assistant", "tool"],
        ["system", "user", "assistant", "tool", "assistant", "user"]]
    assert got[2].body["stream"] is True and got[2].messages[-1]["content"] == "And tomorrow?"
    rows = db.fetch("SELECT api, sent FROM nodes WHERE conversation_id = $1 ORDER BY created_at", cid)
    assert [r["api"] for r in rows] == [api] * 3
    assert [len(r["sent"]) for r in rows] == [2, 1, 1]  # (the instructions, then only what was new)


def test_the_js_agents_sdks_conversation_session_at_auto_holds_each_turn_once(proxy, upstream, key):
    """The Agents SDK for JS keeping its history in an ``OpenAIConversationsSession`` at /auto/v1:
    each run sends the listed items to ``responses.create`` (naming no conversation), then adds the
    question and the answer through the items API. The calls are a line of their own; the
    conversation lists each turn once, and the third run sends the upstream each item once."""
    seen = _run_node("agents.mjs", {"BASE_URL": proxy.url, "API_KEY": key, "SESSION": "conversations"})
    assert seen["answers"] == ["echo: Weather in Paris?", "echo: And tomorrow?", "echo: And the day after?"]
    assert seen["items"] == ["Weather in Paris?", "echo: Weather in Paris?", "And tomorrow?", "echo: And tomorrow?",
                             "And the day after?", "echo: And the day after?"]
    turns = [c for c in seen["calls"] if c["path"].endswith("/responses")]
    assert [c["matched"] for c in turns] == ["0", "2", "4"]
    assert len({c["conversation"] for c in turns}) == 1 and turns[0]["conversation"] != seen["conversation"]
    texts = [m["content"] if isinstance(m["content"], str) else "".join(p["text"] for p in m["content"])
             for m in upstream.turn_requests[-1].messages]
    assert texts == ["You answer weather questions.", "Weather in Paris?", "echo: Weather in Paris?", "And tomorrow?",
                     "echo: And tomorrow?", "And the day after?"]
