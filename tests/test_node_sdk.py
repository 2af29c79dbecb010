"""'Any existing OpenAI client' in a second language: the official openai Node package drives
Branchpoint -- a turn, a streamed turn and an edit via X-Parent-Node-Id."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent / "node"


def _node_modules() -> None:
    if (HERE / "node_modules" / "openai").exists():
        return
    result = subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=HERE, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"npm ci failed (the npm registry must be reachable): {result.stderr[-2000:]}"


def test_the_node_sdk_drives_branchpoint(proxy, upstream, key, cid):
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("Node.js (node and npm) is not installed here; the Node SDK test needs it")
    _node_modules()
    env = {**os.environ, "BASE_URL": proxy.url, "API_KEY": key, "CONVERSATION": cid}
    result = subprocess.run(["node", "sdk.mjs"], cwd=HERE, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen["first"]["text"] == "echo: node turn one"
    assert seen["second"]["text"] == "echo: node turn two" and seen["second"]["parent"] == seen["first"]["node"]
    assert seen["edit"]["parent"] == seen["first"]["node"]
    # what the upstream received for the edit: the first turn and the edited question, not turn two
    assert [m["content"] for m in upstream.last.messages] == ["node turn one", "echo: node turn one", "node turn two, edited"]
    assert upstream.chat_requests[1].body["stream"] is True
