"""Every command in the README runs: the Python example against a live proxy, the shell
commands against a database holding what the example made (docker build: by .ci/run)."""

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import httpx

from .conftest import Db, make_settings, serve_proxy, wait_ready
from .fakes import free_port

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def blocks(language):
    return re.findall(rf"```{language}\n(.*?)```", README, re.S)


def test_the_python_example_and_every_shell_command(fresh_database_url, upstream_url, upstream, key, tmp_path):
    example, responses_example = blocks("python")
    code = example.replace("http://127.0.0.1:8080", "{URL}").replace("sk-your-upstream-key", key)
    with serve_proxy(make_settings(fresh_database_url, upstream_url)) as p:
        scope: dict = {}
        exec(compile(code.replace("{URL}", p.url), "README.md", "exec"), scope)
        # the edit hung under the first turn and never saw the second
        edited = [r for r in upstream.turn_requests if r.messages[-1]["content"] == "And two months before?"][0]
        assert "And the month before?" not in edited.text()
        # the switch made the second turn the head again
        db = Db(fresh_database_url)
        assert db.head("my-chat") == scope["second"].headers["x-node-id"]
        # the Responses example: previous_response_id branches the same way
        responses_code = responses_example.replace("http://127.0.0.1:8080", p.url).replace("sk-your-upstream-key", key)
        exec(compile(responses_code, "README.md", "exec"), scope)
        edited = [r for r in upstream.turn_requests if r.messages[-1]["content"] == "And two months before?"][-1]
        assert "And the month before?" not in [m["content"] for m in edited.messages[-3:]]
        assert db.node(scope["edit"].id[5:])["parent_id"] == db.node(scope["first"].id[5:])["id"]

        env = {**os.environ, "BRANCHPOINT_DATABASE_URL": fresh_database_url, "BRANCHPOINT_UPSTREAM_URL": upstream_url,
               "BRANCHPOINT_CONFIG": ""}
        commands = [line.strip() for block in blocks("bash") for line in block.splitlines()
                    if line.strip() and not line.strip().startswith("#")]
        assert commands, "no shell commands found"
        ran = []
        for command in commands:
            words = command.split("#")[0].split()
            if words[:2] == ["uv", "run"] and words[2:3] == ["pytest"]:
                assert "uv run --frozen pytest" in (ROOT / ".ci" / "run").read_text()  # .ci/run runs it
            elif words[:3] == ["uv", "run", "branchpoint"] and words[3] == "serve":
                port = free_port()
                proc = subprocess.Popen([sys.executable, "-m", "proxy.cli", *words[3:], "--port", str(port)], env=env,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                try:
                    wait_ready(f"http://127.0.0.1:{port}", proc)
                finally:
                    proc.terminate()
                    proc.wait(20)
            elif words[:3] == ["uv", "run", "branchpoint"]:
                result = subprocess.run([sys.executable, "-m", "proxy.cli", *words[3:]], env=env, cwd=tmp_path,
                                        capture_output=True, text=True, timeout=120)
                assert result.returncode == 0, (command, result.stdout, result.stderr)
            elif words[0] == "curl":
                line = command.replace("http://127.0.0.1:8080", p.url).replace("sk-your-upstream-key", key)
                if shutil.which("curl"):
                    result = subprocess.run(line, shell=True, capture_output=True, text=True, timeout=30)
                    assert result.returncode == 0, (command, result.stderr)
                    output = result.stdout
                else:  # no curl on this machine: make the same request
                    parts = shlex.split(line)
                    headers = dict(h.split(": ", 1) for h in (parts[i + 1] for i, w in enumerate(parts) if w == "-H"))
                    output = httpx.get(parts[-1], headers=headers).text
                assert '"data"' in output, (command, output)
            elif words[:2] == ["docker", "build"]:
                assert command in (ROOT / ".ci" / "run").read_text()  # built there when a Docker engine runs
            else:
                raise AssertionError(f"README command not exercised by any test: {command}")
            ran.append(command)
        assert (tmp_path / "my-chat.jsonl").read_text().count("\n") == 6  # every node: 3 chat calls, 3 responses
        assert len(ran) == len(commands)
