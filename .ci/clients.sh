#!/usr/bin/env bash
# The real-client tests (tests/clients/, pytest marker "clients", left out of the README's test
# command): install Codex CLI, opencode, Continue's CLI and Cline's (npm, tests/clients/node's lock
# file), aider, llm, mini-swe-agent, instructor and Open WebUI (PyPI, a venv each under
# $BRANCHPOINT_CLIENTS_CACHE, default
# ~/.cache/branchpoint-clients) -- Claude Code installs itself from tests/clients/claude's lock --
# then run them. A client that cannot be installed fails this script (BRANCHPOINT_CLIENTS_REQUIRED=1),
# where a developer's run of the tests would skip it. Needs the npm registry and PyPI, nothing else.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v uv >/dev/null 2>&1; then
    python3 -m pip install --quiet --user uv 2>/dev/null || python3 -m pip install --quiet uv
    export PATH="$HOME/.local/bin:$PATH"
fi
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    as_root=""
    if [ "$(id -u)" != 0 ]; then as_root="sudo"; fi
    export DEBIAN_FRONTEND=noninteractive
    $as_root apt-get update -qq
    $as_root apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
fi

uv run --frozen python -m tests.clients.install
BRANCHPOINT_CLIENTS_REQUIRED=1 uv run --frozen pytest -n 0 -m clients tests/clients
