"""Cline's CLI (npm ``cline``, its binary inside ``@cline/cli-<platform>``), unmodified, headless in
its Agent Client Protocol mode (``cline --acp``: JSON-RPC over stdio, the way editors drive it --
``cline "…"`` runs one turn, and resuming a session, ``--id``, needs a terminal). Its provider is
``openai-compatible`` with ``baseUrl`` at ``/auto/v1`` (``~/.cline/data/settings/providers.json``,
as ``cline auth -p openai-compatible -b …`` writes it). One session of two prompts -- the first with a
tool round (its ``read_files`` tool really reads a file) -- is one conversation found by content,
three nodes in a line, each holding only what is new, and the upstream gets each history once.

Kept offline and to itself: ``telemetryOptOut`` in its global settings, ``CLINE_NO_AUTO_UPDATE``,
and its hub daemon (which ``--acp`` starts, detached) on a port of the test's own, stopped after
(``cline hub stop``)."""

from __future__ import annotations

import json
import queue
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

from ..conftest import make_settings, serve_proxy, tenant_of
from ..fakes import FakeUpstream, Reply, ServerThread, free_port
from ..helpers import tool_call
from .conftest import conversations_of, nodes_of, npm_bin, offline_env, tool_round_then_a_question

pytestmark = pytest.mark.clients


class Acp:
    """An ACP agent on stdio: requests answered in order; its permission requests allowed."""

    def __init__(self, command: list[str], *, cwd: Path, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(command, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.said: list[str] = []  # the agent's message chunks
        self.next_id = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def _send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"jsonrpc": "2.0", **message}) + "\n")
        self.proc.stdin.flush()

    def call(self, method: str, params: dict[str, Any], timeout: float = 120) -> dict[str, Any]:
        self.next_id += 1
        self._send({"id": self.next_id, "method": method, "params": params})
        while True:
            line = self.lines.get(timeout=timeout)
            assert line is not None, f"cline --acp ended before answering {method}"
            if not line.strip():
                continue
            message = json.loads(line)
            if message.get("id") == self.next_id and ("result" in message or "error" in message):
                assert "error" not in message, message
                return message["result"]
            if message.get("method") == "session/request_permission":
                allow = next(o for o in message["params"]["options"] if o["kind"].startswith("allow"))
                self._send({"id": message["id"], "result": {"outcome": {"outcome": "selected", "optionId": allow["optionId"]}}})
            elif message.get("method") == "session/update":
                update = message["params"]["update"]
                if update.get("sessionUpdate") == "agent_message_chunk":
                    self.said.append(update["content"].get("text", ""))
            elif "method" in message and "id" in message:  # (a request of the client's it does not offer)
                self._send({"id": message["id"], "error": {"code": -32601, "message": "not offered"}})

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def _session(proxy_url: str, key: str, home: Path) -> list[str]:
    """Cline's session of two prompts against the proxy; what it said after each."""
    cline = npm_bin("cline")
    settings = home / ".cline" / "data" / "settings"
    settings.mkdir(parents=True)
    (settings / "providers.json").write_text(json.dumps({
        "version": 1, "lastUsedProvider": "openai-compatible", "modes": {},
        "providers": {"openai-compatible": {"settings": {
            "provider": "openai-compatible", "apiKey": key, "model": "gpt-4o-mini", "baseUrl": f"{proxy_url}/auto/v1"},
            "updatedAt": "2026-01-01T00:00:00.000Z", "tokenSource": "manual"}}}))
    (settings / "global-settings.json").write_text(json.dumps({"telemetryOptOut": True}))
    work = home / "project"
    work.mkdir()
    (work / "notes.txt").write_text("the secret word is pelican\n")
    env = offline_env(home, CLINE_API_KEY=key, CLINE_PROVIDER="openai-compatible", CLINE_MODEL="gpt-4o-mini",
                      CLINE_NO_AUTO_UPDATE="1", CLINE_HUB_PORT=str(free_port()))
    agent = Acp([str(cline), "--acp"], cwd=work, env=env)
    said = []
    try:
        agent.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        session = agent.call("session/new", {"cwd": str(work), "mcpServers": []})["sessionId"]
        for text in ("What is the secret word in notes.txt?", "And the second question"):
            result = agent.call("session/prompt", {"sessionId": session, "prompt": [{"type": "text", "text": text}]})
            assert result["stopReason"] == "end_turn"
            said.append("".join(agent.said))
            agent.said.clear()
    finally:
        agent.close()
        subprocess.run([str(cline), "hub", "stop"], cwd=work, env=env, capture_output=True, timeout=60)
    return said


def test_cline_acp_session_of_two_prompts_and_a_tool_round_is_one_conversation(database_url, db, key, client_home):
    upstream = FakeUpstream()
    with ServerThread(upstream) as server, serve_proxy(make_settings(database_url, server.url + "/v1")) as proxy:
        upstream.enqueue(
            Reply(content="Let me look.", tool_calls=[tool_call("call_k1", "read_files",
                                                                 json.dumps({"file_paths": ["notes.txt"]}))]),
            Reply(content="The word is pelican."),
            Reply(content="Second answer."),
        )
        first, second = _session(proxy.url, key, client_home)
    assert "The word is pelican." in first
    assert second == "Second answer."

    calls = upstream.turn_requests
    assert len(upstream.requests) == 3
    tool_round_then_a_question(calls, key, "call_k1", "And the second question")
    assert "read_files" in {t["function"]["name"] for t in calls[0].body["tools"]}

    tenant = tenant_of(key)
    conversations = conversations_of(db, tenant)
    assert len(conversations) == 1
    nodes = nodes_of(db, tenant, conversations[0]["id"])
    assert len(nodes) == 3 and [n["finish_reason"] for n in nodes] == ["tool_calls", "stop", "stop"]
    assert nodes[0]["parent_id"] is None and nodes[1]["parent_id"] == nodes[0]["id"]
    assert nodes[2]["parent_id"] == nodes[1]["id"] and conversations[0]["head_node_id"] == nodes[2]["id"]
    sent = [json.dumps(n["sent"]) for n in nodes]
    assert "What is the secret word" in sent[0] and "pelican" not in sent[0]
    assert "pelican" in sent[1] and "What is the secret word" not in sent[1]
    assert "And the second question" in sent[2] and "pelican" not in sent[2] and "What is the secret" not in sent[2]
