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


def ci_commands() -> list[tuple[int, list[str]]]:
    """.ci/run's commands, parsed: (indentation, words) for each line that is not a comment --
    indentation 0 is a command run unconditionally."""
    out = []
    for line in (ROOT / ".ci" / "run").read_text().splitlines():
        if line.strip() and not line.strip().startswith("#"):
            out.append((len(line) - len(line.lstrip()), shlex.split(line, comments=True)))
    return out


def check_ci_runs_the_test_command(words: list[str]) -> None:
    """The README's test command is the one .ci/run runs -- unconditionally, once, with the
    script stopping on its failure; CI adds only ``--frozen`` (uv: the lock file as it is)."""
    commands = ci_commands()
    assert commands[0] == (0, ["set", "-euo", "pipefail"]), commands[0]  # a failing run fails CI
    runs = [(indent, ci) for indent, ci in commands if "pytest" in ci]
    assert len(runs) == 1, runs
    indent, ci = runs[0]
    assert indent == 0 and ci == [*words[:2], "--frozen", *words[2:]], (ci, words)


def check_ci_builds_the_image(command: str) -> None:
    """The README's image build is .ci/run's, word for word, run when a Docker engine is there."""
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    at = [i for i, line in enumerate(lines) if line.strip() == command]
    assert len(at) == 1, (command, at)
    guard = next(line for line in reversed(lines[:at[0]]) if not line.startswith(" "))
    assert guard.startswith("if command -v docker") and "docker info" in guard, guard


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
                check_ci_runs_the_test_command(words)  # .ci/run runs it
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
                check_ci_builds_the_image(command)  # built there when a Docker engine runs
            else:
                raise AssertionError(f"README command not exercised by any test: {command}")
            ran.append(command)
        assert (tmp_path / "my-chat.jsonl").read_text().count("\n") == 6  # every node: 3 chat calls, 3 responses
        assert len(ran) == len(commands)
