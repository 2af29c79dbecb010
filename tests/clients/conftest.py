"""Real clients, unmodified, against Branchpoint: what they need installed, and how each is run.

The clients come from the registries (tests/clients/install.py: npm packages in
``tests/clients/node``, PyPI tools each in a venv of its own), installed by these fixtures on first
use. A client that cannot be installed is skipped, saying so -- unless
``BRANCHPOINT_CLIENTS_REQUIRED=1`` (``.ci/clients.sh`` sets it), which fails instead; nothing else
skips.

Every test here is marked ``clients`` and left out of the default ``uv run pytest`` (pyproject.toml's
addopts); ``uv run pytest -n 0 -m clients tests/clients`` runs them (in one process: the first test
installs the clients, which workers of pytest-xdist would do at once in one folder).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from storage.transcript import canonical

from ..conftest import Proxy, make_settings, serve_proxy
from ..fakes import FakeUpstream, ServerThread
from . import install


def _installed(name: str, find: Any) -> Path:
    try:
        return find(name)
    except install.Unavailable as exc:
        if os.environ.get("BRANCHPOINT_CLIENTS_REQUIRED") == "1":
            pytest.fail(str(exc))
        pytest.skip(str(exc))


def npm_bin(name: str) -> Path:
    """A binary of tests/clients/node's packages (Codex CLI, opencode)."""
    return _installed(name, install.npm_bin)


def pypi_bin(tool: str) -> Path:
    """A PyPI client's command (aider, llm), from its own venv."""
    return _installed(tool, install.pypi_bin)


def run(command: list[str | Path], *, cwd: Path, env: dict[str, str], stdin: str | None = None,
        timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """Run a client to its end; its output is shown when it fails."""
    result = subprocess.run([str(c) for c in command], cwd=cwd, env=env, input=stdin, capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, f"{command[0]} exited {result.returncode}\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    return result


def offline_env(home: Path, **extra: str) -> dict[str, str]:
    """A client's environment: a home of its own (its config, caches and sessions), the
    machine's PATH, no proxies, nothing of the developer's own configuration."""
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TERM", "SSL_CERT_FILE", "TMPDIR")}
    env = {**keep, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"), "XDG_DATA_HOME": str(home / ".local/share"),
           "XDG_CACHE_HOME": str(home / ".cache"), "XDG_STATE_HOME": str(home / ".local/state"), "NO_COLOR": "1",
           "no_proxy": "127.0.0.1,localhost", "NO_PROXY": "127.0.0.1,localhost"}
    env.update(extra)
    return env


def same(messages: list[dict[str, Any]], expected: list[dict[str, Any]]) -> bool:
    """Two message lists equal by meaning (storage.transcript.canonical: what matching compares)."""
    return [canonical(m) for m in messages] == [canonical(m) for m in expected]


@contextlib.contextmanager
def anthropic_proxy(database_url: str, fake: Any) -> Iterator[Proxy]:
    """A proxy whose every model goes to ``fake``, served here as an Anthropic upstream."""
    with ServerThread(fake) as server:
        settings = make_settings(database_url, server.url + "/v1", upstreams=[
            {"name": "anthropic", "base_url": server.url + "/v1", "models": ["*"], "api": "anthropic"}])
        with serve_proxy(settings) as proxy:
            yield proxy


def tool_round_then_a_question(calls: list[Any], key: str, call_id: str, question: str) -> None:
    """A client's three streamed chat requests -- its call ``call_id`` (answered with a result
    naming "pelican"), then ``question``: each history once, the result right after its call."""
    assert len(calls) == 3
    each_history_once(calls)
    assert all(c.body["stream"] is True and c.headers["authorization"] == f"Bearer {key}" for c in calls)
    assert [m["role"] for m in calls[2].messages] == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert calls[1].messages[2]["tool_calls"][0]["id"] == call_id
    assert calls[1].messages[-1]["tool_call_id"] == call_id and "pelican" in calls[1].messages[-1]["content"]
    assert calls[2].messages[-1]["content"] == question


def _conversation(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [m for m in messages if m.get("role") not in ("system", "developer")]


def each_history_once(requests: list[Any]) -> None:
    """Each request's messages are the previous request's, then what is new since -- none of
    those earlier messages again: the upstream got every history as the client sent it, once (a
    history appended to the stored path would repeat it). System/developer messages aside: a
    client may move them (aider's reminder goes last each time)."""
    for before, after in itertools.pairwise(requests):
        old, new = _conversation(before.messages), _conversation(after.messages)
        assert same(new[:len(old)], old), "a later call does not extend the earlier"
        earlier = {json.dumps(canonical(m), sort_keys=True) for m in old if m.get("role") == "user"}
        added = [json.dumps(canonical(m), sort_keys=True) for m in new[len(old):]]
        assert not earlier.intersection(added), f"an earlier question reached the upstream again: {added}"


def conversations_of(db: Any, tenant: str) -> list[Any]:
    return db.fetch("SELECT id, head_node_id, forked_from FROM conversations WHERE tenant = $1 ORDER BY created_at", tenant)


def nodes_of(db: Any, tenant: str, conversation: str | None = None) -> list[Any]:
    if conversation is None:
        return db.fetch("SELECT * FROM nodes WHERE tenant = $1 ORDER BY created_at", tenant)
    return db.fetch("SELECT * FROM nodes WHERE tenant = $1 AND conversation_id = $2 ORDER BY created_at", tenant,
                    conversation)


@pytest.fixture
def client_home(tmp_path: Path) -> Iterator[Path]:
    home = tmp_path / "home"
    home.mkdir()
    yield home


class SideCalls:
    """An upstream that answers a client's side calls -- requests offering no tools, such as
    opencode's title request -- from a fake of their own, and every other request from the main
    fake: what a test scripts (``main.enqueue``) goes to the agent's calls, whichever arrives first."""

    def __init__(self, main: FakeUpstream, side: FakeUpstream) -> None:
        self.main, self.side = main, side

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.main(scope, receive, send)
        chunks, more = [], True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        raw = b"".join(chunks)
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        target = self.side if isinstance(body, dict) and "messages" in body and not body.get("tools") else self.main
        sent = False

        async def replay() -> dict[str, Any]:
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": raw, "more_body": False}

        await target(scope, replay, send)


@pytest.fixture
def split_upstream(database_url: str) -> Iterator[tuple[Any, FakeUpstream, FakeUpstream]]:
    """A proxy (on the session's database) whose upstream sends side calls to ``side`` and the
    rest to ``main``: (proxy, main, side)."""
    main, side = FakeUpstream(), FakeUpstream()
    with ServerThread(SideCalls(main, side)) as server:
        with serve_proxy(make_settings(database_url, server.url + "/v1")) as proxy:
            yield proxy, main, side
