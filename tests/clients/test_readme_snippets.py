"""The README's "Use it with" set-ups are the ones tests/clients/ drives: each snippet, word for
word, is what its client's test writes (with the proxy's address in place of 127.0.0.1:8080).
Not marked ``clients``: it installs nothing and runs with the default test command."""

import json
import re
from pathlib import Path

from .test_aider import AIDER_ARGS
from .test_codex import CODEX_CONFIG
from .test_llm import LLM_MODELS
from .test_open_webui import OPEN_WEBUI_ENV, OPEN_WEBUI_SERVE
from .test_opencode import OPENCODE_CONFIG

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def section() -> str:
    found = re.search(r"^## Use it with\n(.*?)^## ", README, re.S | re.M)
    assert found, "README.md has no 'Use it with' section"
    return found.group(1)


def block(language: str) -> str:
    found = re.findall(rf"```{language}\n(.*?)```", section(), re.S)
    assert len(found) == 1, (language, found)
    return found[0]


def test_each_client_snippet_is_the_one_its_test_uses():
    assert block("toml") == CODEX_CONFIG.format(base_url="http://127.0.0.1:8080/auto/v1")
    assert json.loads(block("json")) == OPENCODE_CONFIG
    assert block("yaml") == LLM_MODELS
    words = block("sh").split()
    assert words[0] == "aider" and words[1:1 + len(AIDER_ARGS)] == AIDER_ARGS
    assert words[1 + len(AIDER_ARGS):] == ["--openai-api-key", "sk-your-upstream-key"]  # the test passes its key so


def test_the_open_webui_environment_is_the_one_its_test_uses():
    words = block("shell").replace("\\\n", " ").split()
    settings = [w for w in words if "=" in w and not w.startswith("-")]
    assert dict(w.split("=", 1) for w in settings) == OPEN_WEBUI_ENV
    assert words[:len(settings)] == settings, "the environment comes first"
    assert words[len(settings):] == ["open-webui", *OPEN_WEBUI_SERVE, "3000"]
