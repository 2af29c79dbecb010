"""aider (PyPI ``aider-chat``, its own venv), unmodified, on its Anthropic side -- how its users
mostly run it: ``--model anthropic/<claude model>`` (litellm calls the Messages API),
``ANTHROPIC_API_BASE`` at ``<proxy>/auto`` (litellm adds ``/v1/messages``) and
``--anthropic-api-key``. Two turns piped into its prompt, with a file in the chat that the first
answer edits (aider applies the SEARCH/REPLACE block: its tool round) and the second turn reads
again; over an Anthropic upstream (native) and over a chat upstream (translated both ways).

What the upstream gets is what aider sent, once: each question, the edit, aider's "I updated the
files." after it, the file's new content. What is stored is not deduplicated, and cannot be by
matching: aider lays out each call anew -- the chat's files (their current content) after the
history, not where they were, and, for Claude models (aider's ``reminder: user``), its
SEARCH/REPLACE rules appended to the newest question and gone from it the next call. The second
call does not begin with the first call's transcript, so under ``/auto/v1`` it matches nothing and
is a conversation of its own holding all it sent (docs/behaviour.md#full-history-mode: a client
whose history does not extend what it sent before gets a new root). The same holds on aider's
OpenAI side once a file is in the chat."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ..anthropic_fake import AReply, FakeAnthropic
from ..conftest import make_settings, serve_proxy, tenant_of
from ..fakes import FakeUpstream, Reply, ServerThread
from .conftest import anthropic_proxy, conversations_of, nodes_of, offline_env, pypi_bin, run
from .test_aider import OFFLINE

pytestmark = pytest.mark.clients

MODEL = "claude-sonnet-4-20250514"  # (one aider has settings for, under anthropic/: diff edits, a weak model)
# aider downloads litellm's model prices unless its cache holds some
PRICES = {name: {"max_input_tokens": 200000, "max_output_tokens": 64000, "input_cost_per_token": 3e-06,
                 "output_cost_per_token": 1.5e-05, "litellm_provider": "anthropic", "mode": "chat",
                 "supports_function_calling": True, "supports_prompt_caching": True}
          for name in (MODEL, f"anthropic/{MODEL}")}
FIRST, SECOND = "Make it print hello world", "What does it print now?"
EDIT = """I will change it.

greeting.py
```python
<<<<<<< SEARCH
print("hi")
=======
print("hello world")
>>>>>>> REPLACE
```"""
ANSWER = "It prints hello world now."


def _session(proxy_url: str, key: str, home: Path) -> tuple[str, Path]:
    """aider's two turns, ``greeting.py`` in the chat; returns its output and the file."""
    aider = pypi_bin("aider")
    (home / ".aider" / "caches").mkdir(parents=True)
    (home / ".aider" / "caches" / "model_prices_and_context_window.json").write_text(json.dumps(PRICES))
    work = home / "project"
    work.mkdir()
    (work / "greeting.py").write_text('print("hi")\n')
    result = run([aider, "--model", f"anthropic/{MODEL}", "--anthropic-api-key", key, *OFFLINE, "greeting.py"],
                 cwd=work, env=offline_env(home, ANTHROPIC_API_BASE=f"{proxy_url}/auto"), stdin=f"{FIRST}\n{SECOND}\n")
    assert "Applied edit to greeting.py" in result.stdout and ANSWER in result.stdout
    assert "raw.githubusercontent.com" not in result.stdout + result.stderr  # offline: no price download tried
    assert (work / "greeting.py").read_text() == 'print("hello world")\n'
    return result.stdout, work / "greeting.py"


def _text(content: Any) -> str:
    return content if isinstance(content, str) else "".join(b.get("text", "") for b in content)


def _check_turns(texts: list[list[tuple[str, str]]]) -> None:
    """Both calls' conversations (role, text), system aside: each question once, the edit and
    aider's word on it after the first, the file's content as it was when each call was made."""
    first, second = texts
    assert first[-1][0] == "user" and first[-1][1].startswith(FIRST + "\n") and "SEARCH/REPLACE" in first[-1][1]
    files = [t for r, t in first if r == "user" and t.startswith("I have *added these files")]
    assert len(files) == 1 and 'print("hi")' in files[0]
    said = [t for _, t in second]
    assert sum(t.startswith(FIRST) for t in said) == 1 and sum(t.startswith(SECOND) for t in said) == 1
    at = said.index(FIRST)  # the first question, its rules gone
    assert second[at + 1] == ("assistant", EDIT) and second[at + 2] == ("user", "I updated the files.")
    files = [t for t in said if t.startswith("I have *added these files")]
    assert len(files) == 1 and said.index(files[0]) > at + 2  # after the history now
    assert 'print("hello world")' in files[0] and 'print("hi")' not in files[0]
    assert second[-1][0] == "user" and second[-1][1].startswith(SECOND + "\n")


def _check_stored(db: Any, key: str, calls: int) -> None:
    """Each call a conversation of one node, holding all that call sent -- its system prompt once."""
    tenant = tenant_of(key)
    conversations = conversations_of(db, tenant)
    assert len(conversations) == calls
    for conversation in conversations:
        nodes = nodes_of(db, tenant, conversation["id"])
        assert len(nodes) == 1 and nodes[0]["parent_id"] is None and nodes[0]["api"] == "messages"
        assert [m["role"] for m in nodes[0]["sent"]].count("system") == 1
    last = json.dumps(nodes_of(db, tenant, conversations[-1]["id"])[0]["sent"])
    assert FIRST in last and SECOND in last and "I updated the files." in last


def test_aider_anthropic_over_an_anthropic_upstream(database_url, db, key, client_home):
    fake = FakeAnthropic()
    with anthropic_proxy(database_url, fake) as proxy:
        fake.enqueue(AReply(content=[{"type": "text", "text": EDIT}]),
                     AReply(content=[{"type": "text", "text": ANSWER}]))
        _session(proxy.url, key, client_home)

    calls = fake.calls
    assert len(calls) == 2
    for call in calls:  # as aider sent it: path, key, its beta header; its prompt in `system`, once
        assert call.path == "/v1/messages" and call.headers["x-api-key"] == key
        assert "prompt-caching-2024-07-31" in call.headers["anthropic-beta"]
        assert call.body["model"] == MODEL and call.body["max_tokens"] == 64000
        assert _text(call.body["system"]).startswith("Act as an expert software developer.")
        assert json.dumps(call.body).count("Act as an expert software developer.") == 1
        assert {m["role"] for m in call.body["messages"]} == {"user", "assistant"}
    _check_turns([[(m["role"], _text(m["content"])) for m in c.body["messages"]] for c in calls])
    _check_stored(db, key, 2)


def test_aider_anthropic_over_a_chat_upstream(database_url, db, key, client_home):
    upstream = FakeUpstream()
    with ServerThread(upstream) as server:
        with serve_proxy(make_settings(database_url, server.url + "/v1")) as proxy:
            upstream.enqueue(Reply(content=EDIT), Reply(content=ANSWER))
            _session(proxy.url, key, client_home)

    calls = upstream.turn_requests
    assert len(calls) == 2
    for call in calls:  # aider's prompt, once and first; the model as named, max_tokens within [models."claude-*"]
        assert call.body["model"] == MODEL and call.body["max_tokens"] == 64000
        roles = [m["role"] for m in call.messages]
        assert roles[0] == "system" and roles.count("system") == 1
        assert _text(call.messages[0]["content"]).startswith("Act as an expert software developer.")
    _check_turns([[(m["role"], _text(m["content"])) for m in c.messages[1:]] for c in calls])
    _check_stored(db, key, 2)
