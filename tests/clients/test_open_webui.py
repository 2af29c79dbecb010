"""Open WebUI (PyPI ``open-webui``), unmodified, in its own venv, served offline with no sign-in and
pointed at ``/auto/v1`` -- the README's "Use it with" environment -- and driven in Chromium like a
user: a first question, a second, an edit of the first question, a regenerate of the last answer.

With ``ENABLE_FORWARD_USER_INFO_HEADERS=true`` every call Open WebUI makes for a chat carries
``X-OpenWebUI-Chat-Id`` (one of ``[server] session_headers``), so the chat is one conversation
whose id is the chat's: the edit of the first question (which matches nothing) is a second root of
it, not a conversation of its own, and every node holds only the new message. Open WebUI's title /
tags / follow-up requests (its "### Task:" prompts) are answered by a fake of their own; they carry
the chat id too."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Page, expect, sync_playwright
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from ..conftest import make_settings, serve_proxy, tenant_of, wait_for
from ..fakes import FakeUpstream, Reply, ServerThread
from ..test_ui import CHROMIUM_FLAGS, chromium
from .conftest import conversations_of, nodes_of, offline_env, pypi_bin

pytestmark = pytest.mark.clients

# the README's environment for `open-webui serve`, with the proxy's address and the key filled in
OPEN_WEBUI_ENV = {
    "OPENAI_API_BASE_URL": "http://127.0.0.1:8080/auto/v1",
    "OPENAI_API_KEY": "sk-your-upstream-key",
    "ENABLE_OLLAMA_API": "False",
    "ENABLE_FORWARD_USER_INFO_HEADERS": "true",
    "OFFLINE_MODE": "true",
    "RAG_EMBEDDING_MODEL_AUTO_UPDATE": "False",
    "RAG_RERANKING_MODEL_AUTO_UPDATE": "False",
    "WHISPER_MODEL_AUTO_UPDATE": "False",
    "WEBUI_AUTH": "False",
}
OPEN_WEBUI_SERVE = ["serve", "--host", "127.0.0.1", "--port"]  # then its port (the README's: 3000)
TASK = "### Task:"  # how Open WebUI's title, tags and follow-up prompts begin


def _is_task(body: Any) -> bool:
    if not isinstance(body, dict) or "messages" not in body:
        return False
    return any(isinstance(m.get("content"), str) and m["content"].lstrip().startswith(TASK) for m in body["messages"])


class TaskCalls:
    """An upstream that answers Open WebUI's task requests (title, tags, follow-ups) from ``side``
    and the chat's own calls from ``main``."""

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
        sent = False

        async def replay() -> dict[str, Any]:
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": raw, "more_body": False}

        await (self.side if _is_task(body) else self.main)(scope, replay, send)


@pytest.fixture
def task_upstream(database_url: str) -> Iterator[tuple[Any, FakeUpstream, FakeUpstream]]:
    main, side = FakeUpstream(), FakeUpstream()
    with ServerThread(TaskCalls(main, side)) as server:
        with serve_proxy(make_settings(database_url, server.url + "/v1")) as proxy:
            yield proxy, main, side


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def open_webui(task_upstream, key, client_home: Path) -> Iterator[str]:
    """Open WebUI serving on a free port of 127.0.0.1, its data under the test's tmp; stopped after."""
    binary = pypi_bin("open-webui")
    proxy, _, _ = task_upstream
    port = _free_port()
    env = offline_env(client_home, **{k: v.replace("http://127.0.0.1:8080", proxy.url) for k, v in OPEN_WEBUI_ENV.items()})
    env.update(OPENAI_API_KEY=key, DATA_DIR=str(client_home / "data"), WEBUI_SECRET_KEY="branchpoint-test-secret",
               DEFAULT_MODELS="fake-model", HF_HUB_DISABLE_TELEMETRY="1", DO_NOT_TRACK="true", SCARF_NO_ANALYTICS="true",
               ANONYMIZED_TELEMETRY="false")
    log = (client_home / "open-webui.log").open("w")
    server = subprocess.Popen([str(binary), *OPEN_WEBUI_SERVE, str(port)], cwd=client_home, env=env,
                              stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            assert server.poll() is None, f"open-webui exited {server.returncode}\n{_tail(client_home)}"
            assert time.monotonic() < deadline, f"open-webui did not answer in 300 s\n{_tail(client_home)}"
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


def _tail(home: Path) -> str:
    return (home / "open-webui.log").read_text(errors="replace")[-4000:]


def _send(page: Page, text: str) -> None:
    box = page.locator("#chat-input")
    box.click()
    page.keyboard.type(text)
    page.locator("#send-message-button").click()


def _answered(page: Page, text: str) -> None:
    expect(page.get_by_text(text, exact=False).last).to_be_visible(timeout=60_000)


def test_open_webui_chat_with_edit_and_regenerate_is_one_conversation(task_upstream, open_webui, key, db, client_home):
    proxy, upstream, side = task_upstream
    upstream.enqueue(Reply(content="Paris is the capital of France."), Reply(content="Rome is the capital of Italy."),
                     Reply(content="Madrid is the capital of Spain."), Reply(content="Madrid, once more."))
    side.enqueue(*[Reply(content='{"title": "Capitals", "tags": ["geography"], "follow_ups": []}') for _ in range(40)])
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium(), args=CHROMIUM_FLAGS)
        try:
            page = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
            page.set_default_timeout(30_000)
            try:
                _drive(page, open_webui)
            finally:
                page.screenshot(path=str(client_home / "open-webui.png"))
            chat_id = re.search(r"/c/([0-9a-f-]+)", page.url).group(1)
        finally:
            browser.close()

    # the upstream: four chat calls, each the history Open WebUI showed -- the edit and the
    # regenerate start again from the (edited) first question
    calls = upstream.turn_requests
    assert len(calls) == 4, [c.messages for c in calls]
    talk = [[(m["role"], m["content"]) for m in c.messages if m["role"] != "system"] for c in calls]
    assert talk == [
        [("user", "What is the capital of France?")],
        [("user", "What is the capital of France?"), ("assistant", "Paris is the capital of France."), ("user", "And of Italy?")],
        [("user", "What is the capital of Spain?")],
        [("user", "What is the capital of Spain?")],
    ]
    assert side.chat_requests, "no title/tags/follow-up request reached the upstream"
    assert {r.headers.get("x-openwebui-chat-id") for r in upstream.chat_requests + side.chat_requests} == {chat_id}

    # stored: the chat's calls are one conversation named by the chat id; the first question, its
    # edit and the regenerate are three roots of it, the second question a child of the first; each
    # node only its new message
    tenant = tenant_of(key)
    _settled(side)
    wait_for(lambda: len(nodes_of(db, tenant)) == len(calls) + len(side.chat_requests), 30, "every call stored")
    conversations = conversations_of(db, tenant)
    assert chat_id in [c["id"] for c in conversations], (chat_id, [c["id"] for c in conversations])
    assert [c["id"] for c in conversations] == [chat_id], "a call of the chat went elsewhere"
    turns = [n for n in nodes_of(db, tenant, chat_id) if not _is_task({"messages": n["sent"]})]
    tasks = [n for n in nodes_of(db, tenant, chat_id) if _is_task({"messages": n["sent"]})]
    assert len(turns) == 4
    first, second, edit, regenerate = turns
    assert first["parent_id"] is None and second["parent_id"] == first["id"]
    assert edit["parent_id"] is None and regenerate["parent_id"] is None
    sent = [[(m["role"], m["content"]) for m in n["sent"] if m["role"] != "system"] for n in turns]
    assert sent == [[("user", "What is the capital of France?")], [("user", "And of Italy?")],
                    [("user", "What is the capital of Spain?")], [("user", "What is the capital of Spain?")]]
    assert [n["received"][0]["content"] for n in turns] == ["Paris is the capital of France.", "Rome is the capital of Italy.",
                                                             "Madrid is the capital of Spain.", "Madrid, once more."]
    assert len(tasks) == len(side.chat_requests)
    assert all(n["parent_id"] is None and len(n["sent"]) == 1 for n in tasks)


def _settled(side: FakeUpstream, quiet: float = 3.0) -> None:
    """Until Open WebUI's background tasks (follow-ups of the last answer) stop arriving."""
    count, since = len(side.chat_requests), time.monotonic()
    while time.monotonic() - since < quiet:
        time.sleep(0.2)
        if len(side.chat_requests) != count:
            count, since = len(side.chat_requests), time.monotonic()


def _drive(page: Page, url: str) -> None:
    page.goto(url)
    expect(page.locator("#chat-input")).to_be_visible(timeout=60_000)
    # a first visit shows the changelog: dismiss it
    button = page.get_by_role("button", name="Okay, Let's Go")
    try:
        button.first.click(timeout=5_000)
    except PlaywrightTimeout:
        pass  # no changelog shown
    _send(page, "What is the capital of France?")
    _answered(page, "Paris is the capital of France.")
    wait_for(lambda: "/c/" in page.url, 30, "the chat's page")
    _send(page, "And of Italy?")
    _answered(page, "Rome is the capital of Italy.")

    # edit the first question
    page.get_by_text("What is the capital of France?").first.hover()
    page.locator(".edit-user-message-button").first.click()
    page.locator("textarea").first.fill("What is the capital of Spain?")
    page.locator("#confirm-edit-message-button").click()
    _answered(page, "Madrid is the capital of Spain.")

    # regenerate the last answer
    answer = page.get_by_text("Madrid is the capital of Spain.").last
    answer.hover()
    page.get_by_role("button", name="Regenerate", exact=True).last.click()
    page.get_by_role("button", name="Try Again").click()
    _answered(page, "Madrid, once more.")
