"""The real clients' installation, from the registries: npm packages in ``tests/clients/node``
(``npm ci`` from its lock file: Codex CLI and opencode, whose binaries come inside the packages),
PyPI tools each in a venv of its own under ``$BRANCHPOINT_CLIENTS_CACHE`` (default
``~/.cache/branchpoint-clients``; a library's command is the venv's ``python``, which runs a test's
driver script) -- aider pins ``openai`` and ``pydantic``, so none of them goes into the project's
environment. Each step is skipped when already done.

``python -m tests.clients.install`` installs them all (``.ci/clients.sh``); the tests' fixtures
call the same functions (tests/clients/conftest.py)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
NODE = HERE / "node"
CACHE = Path(os.environ.get("BRANCHPOINT_CLIENTS_CACHE") or Path.home() / ".cache" / "branchpoint-clients")

NPM = ("codex", "opencode", "cn", "cline")  # binaries of tests/clients/node's packages
# the PyPI clients: tool -> (requirement, command), the versions the tests were written against
PYPI = {"aider": ("aider-chat==0.86.2", "aider"), "llm": ("llm==0.36", "llm"),
        "mini-swe-agent": ("mini-swe-agent==2.4.6", "mini"),
        "instructor": ("instructor[anthropic]==1.17.0", "python"),  # (a library: tests/clients run a driver in it)
        "open-webui": ("open-webui==0.12.4", "open-webui")}  # pulls torch: about a minute


class Unavailable(Exception):
    """A client could not be installed (no Node.js or uv, a registry unreachable)."""


@contextlib.contextmanager
def _alone() -> Iterator[None]:
    """One installation at a time, across processes (workers of pytest-xdist, two test runs)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def npm_bin(name: str) -> Path:
    """A binary of tests/clients/node's packages, installed (``npm ci``) when missing."""
    binary = NODE / "node_modules" / ".bin" / name
    if binary.exists():
        return binary
    with _alone():
        return _npm_installed(name, binary)


def _npm_installed(name: str, binary: Path) -> Path:
    if not binary.exists():
        if not (shutil.which("node") and shutil.which("npm")):
            raise Unavailable(f"{name}: Node.js (node and npm) is not installed")
        # (npm install from the lock, not npm ci: npm 11 locks only this platform's optional
        # packages -- opencode's binaries -- and npm ci then calls the lock out of sync)
        result = subprocess.run(["npm", "install", "--no-audit", "--no-fund"], cwd=NODE, capture_output=True, text=True,
                                timeout=900)
        if result.returncode != 0 or not binary.exists():
            raise Unavailable(f"{name}: npm ci in tests/clients/node failed (is the npm registry reachable?): "
                              f"{result.stderr[-1500:]}")
    return binary


def pypi_bin(tool: str) -> Path:
    """A PyPI client's command, from a venv of its own under CACHE (made with uv when missing)."""
    requirement, command = PYPI[tool]
    venv = CACHE / tool
    binary = venv / "bin" / command
    stamp = venv / ".installed"
    if binary.exists() and stamp.exists() and stamp.read_text() == requirement:
        return binary
    with _alone():
        if binary.exists() and stamp.exists() and stamp.read_text() == requirement:  # (another did meanwhile)
            return binary
        return _pypi_installed(tool, requirement, venv, binary, stamp)


def _pypi_installed(tool: str, requirement: str, venv: Path, binary: Path, stamp: Path) -> Path:
    command = binary.name
    uv = shutil.which("uv")
    if uv is None:
        raise Unavailable(f"{tool}: uv is not on PATH to install {requirement}")
    for step in ([uv, "venv", "-q", "--allow-existing", "--python", "3.11", str(venv)],
                 [uv, "pip", "install", "-q", "--python", str(venv / "bin" / "python"), requirement]):
        result = subprocess.run(step, capture_output=True, text=True, timeout=900)
        if result.returncode != 0:
            raise Unavailable(f"{tool}: could not install {requirement} from PyPI (is it reachable?): "
                              f"{result.stderr[-1500:]}")
    if not binary.exists():
        raise Unavailable(f"{tool}: {requirement} installed no {command} command")
    stamp.write_text(requirement)
    return binary


def main() -> int:
    failed = 0
    for name, find in [*((n, npm_bin) for n in NPM), *((t, pypi_bin) for t in PYPI)]:
        try:
            print(f"{name}: {find(name)}")
        except Unavailable as exc:
            print(f"not installed: {exc}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
