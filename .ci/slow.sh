#!/usr/bin/env bash
# The slow tests (pytest marker "slow", left out of the README's test command so that it stays a few
# minutes on 2 cores): each takes seconds of its own -- several processes on one database, 30 MB
# bodies, the schema fuzzer, LiteLLM and the Node SDK as clients. Runs after .ci/run has installed
# uv, chromium and Node.js.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.local/bin:$PATH"
uv run --frozen pytest -m slow
