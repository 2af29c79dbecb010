"""The web viewer at /ui (docs/viewer.md), driven in a real browser: Playwright with Debian's
chromium. Every scenario checks what the server then holds (admin API) or what the fake upstream
received -- the picture alone proves nothing.

Screenshots go to ``tests/artifacts/ui`` (``BRANCHPOINT_UI_ARTIFACTS`` elsewhere); the six in
``docs/img`` are refreshed with ``BRANCHPOINT_UI_DOCS=1 uv run pytest tests/test_ui.py``.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from proxy.routes.ui import UI_DIRECTORY
from storage import AdminStore, open_database, transcript

from .conftest import make_settings, serve_proxy, wait_for
from .fakes import Reply
from .helpers import MODEL, assistant, say, tool, tool_call, user

# (the page's own waits are 10 s; assertions wait as long: a loaded machine -- CI beside other work --
# once took over 5 s, Playwright's default, to draw a page of the list)
expect.set_options(timeout=10_000)

KEY = "sk-ui-viewer-0123456789"
ADMIN_KEY = "sk-ui-admin-0123456789"
ARTIFACTS = Path(os.environ.get("BRANCHPOINT_UI_ARTIFACTS") or Path(__file__).parent / "artifacts" / "ui")
CHROMIUM_FLAGS = ["--no-sandbox", "--headless=new", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]


def chromium() -> str:
    for candidate in (os.environ.get("BRANCHPOINT_CHROMIUM"), shutil.which("chromium"), shutil.which("chromium-browser")):
        if candidate:
            return candidate
    pytest.fail("no chromium to drive: `apt-get install chromium` (.ci/run does) or set BRANCHPOINT_CHROMIUM",
                pytrace=False)


@pytest.fixture(scope="module")
def tenant() -> str:
    return f"ui-{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="module")
def ui(database_url: str, upstream_url: str, tenant: str) -> Iterator[Any]:
    """Branchpoint with configured keys (so a wrong key is refused), one tenant of this module's own."""
    settings = make_settings(database_url, upstream_url, auth={"mode": "keys", "keys": [
                                 {"key": KEY, "tenant": tenant}, {"key": ADMIN_KEY, "tenant": f"{tenant}-ops", "admin": True}]},
                             compaction={"keep_recent": 2})
    with serve_proxy(settings) as proxy:
        yield proxy


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=chromium(), args=CHROMIUM_FLAGS)
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Browser, request: pytest.FixtureRequest) -> Iterator[Page]:
    """A fresh tab (its own sessionStorage); any script error in it, or error logged to its
    console, fails the test."""
    context = browser.new_context(viewport={"width": 1500, "height": 900})
    tab = context.new_page()
    errors: list[str] = []

    def logged(message: Any) -> None:
        url = message.location.get("url", "")
        # (the browser's own line for an API answer the page reads and shows -- a refused key, a
        # deleted conversation -- is no error of the page's)
        if message.type == "error" and not (message.text.startswith("Failed to load resource")
                                            and re.search(r"/(admin|c)/", url)):
            errors.append(f"console: {message.text} ({url})")

    tab.on("pageerror", lambda error: errors.append(str(error)))
    tab.on("console", logged)
    tab.set_default_timeout(10_000)
    yield tab
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    tab.screenshot(path=str(ARTIFACTS / f"{request.node.name}.png"))
    context.close()
    assert errors == [], errors


def shot(page: Page, name: str, *, docs: bool = False) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"))
    if docs and os.environ.get("BRANCHPOINT_UI_DOCS"):
        page.screenshot(path=str(Path(__file__).parent.parent / "docs" / "img" / f"viewer-{name}.png"))


def sign_in(page: Page, ui: Any, key: str = KEY) -> None:
    page.goto(f"{ui.url}/ui/")
    page.fill("#key", key)
    page.click("form.signin button[type=submit]")


def open_conversation(page: Page, ui: Any, cid: str) -> None:
    sign_in(page, ui)
    expect(page.locator("table")).to_be_visible()
    page.goto(f"{ui.url}/ui/#/c/{cid}")
    expect(page.locator(".graph svg")).to_be_visible()


def admin(ui: Any) -> httpx.Client:
    return ui.http(KEY)


def head_of(ui: Any, cid: str) -> str | None:
    return admin(ui).get(f"/admin/conversations/{cid}").json()["head_node_id"]


def node_el(page: Page, node_id: str) -> Any:
    return page.locator(f'.graph [data-id="{node_id}"]')


def centre(page: Page, node_id: str) -> tuple[float, float]:
    x, y = re.fullmatch(r"translate\((.+),(.+)\)", node_el(page, node_id).get_attribute("transform")).groups()
    return float(x), float(y)


def edited_conversation(ui: Any) -> tuple[str, dict[str, str]]:
    """q1 -> a1, q2 -> a2, then q2 edited (a sibling of the q2 node): head on the edit."""
    cid = f"edit-{uuid.uuid4().hex[:8]}"
    client = ui.openai(KEY)
    _, h1 = say(client, cid, user("What is the capital of France?"))
    _, h2 = say(client, cid, user("And of Italy?"))
    _, h3 = say(client, cid, user("And of Spain?"), parent=h1["x-node-id"])
    return cid, {"q1": h1["x-node-id"], "q2": h2["x-node-id"], "q2_edit": h3["x-node-id"]}


# -- serving ------------------------------------------------------------------------------------


def test_the_viewer_is_served_offline_with_a_strict_policy(ui):
    with httpx.Client(base_url=ui.url) as http:
        r = http.get("/ui")
        assert r.status_code == 308 and r.headers["location"].endswith("/ui/")
        page = http.get("/ui/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        policy = page.headers["content-security-policy"]
        assert "default-src 'none'" in policy and "connect-src 'self'" in policy and "frame-ancestors 'none'" in policy
        assert page.headers["x-content-type-options"] == "nosniff"
        for asset in UI_DIRECTORY.iterdir():
            served = http.get(f"/ui/{asset.name}")
            assert served.status_code == 200 and served.content == asset.read_bytes(), asset.name
        assert http.get("/ui/../pyproject.toml").status_code == 404
        assert http.get("/ui/%2e%2e/app.py").status_code == 404
        for odd in ("/ui/%00", "/ui/a%00.js", "/ui/" + "a" * 5000, "/ui/%0a.js", "/ui/x/" + "b" * 300 + "/y"):
            assert http.get(odd).status_code == 404, odd  # (the file system is never asked)
    # nothing is fetched from elsewhere: no absolute URL in any asset but the SVG namespace
    for asset in UI_DIRECTORY.iterdir():
        urls = set(re.findall(r"https?://[^\s\"'`)]+", asset.read_text()))
        assert urls <= {"http://www.w3.org/2000/svg"}, (asset.name, urls)


def test_conversation_search(ui):
    client, http = ui.openai(KEY), admin(ui)
    marker = uuid.uuid4().hex[:6]
    for name in (f"Alpha-{marker}", f"beta-{marker}", f"alphabet-{marker}"):
        say(client, name, user("hi"))
    found = http.get("/admin/conversations", params={"search": "ALPHA"}).json()["data"]
    assert {c["id"] for c in found} >= {f"Alpha-{marker}", f"alphabet-{marker}"}
    assert f"beta-{marker}" not in {c["id"] for c in found}
    page1 = http.get("/admin/conversations", params={"search": marker, "limit": 2}).json()
    page2 = http.get("/admin/conversations", params={"search": marker, "limit": 2, "cursor": page1["next_cursor"]}).json()
    assert [c["id"] for c in page1["data"] + page2["data"]] == [f"alphabet-{marker}", f"beta-{marker}", f"Alpha-{marker}"]
    assert page2["next_cursor"] is None
    # another tenant's ids are not found by searching
    assert ui.http("sk-wrong").get("/admin/conversations", params={"search": marker}).status_code == 401


# -- in the browser -----------------------------------------------------------------------------


def test_sign_in_refuses_a_wrong_key_clearly_then_remembers_the_right_one(ui, page):
    sign_in(page, ui, "sk-not-a-key")
    expect(page.locator("#signin-error")).to_contain_text("This key was refused")
    assert page.evaluate("sessionStorage.length") == 0
    shot(page, "sign-in-refused")
    page.fill("#key", KEY)
    page.click("form.signin button[type=submit]")
    expect(page.locator("table")).to_be_visible()
    page.reload()  # the key stays for this tab
    expect(page.locator("table")).to_be_visible()
    page.click("#signout")
    expect(page.locator("#key")).to_be_visible()
    assert page.evaluate("sessionStorage.length") == 0


@pytest.mark.parametrize("key", ["sk-ключ", "sk-ui-viewer\u200b0123456789"])
def test_sign_in_names_a_character_a_key_cannot_hold(ui, page, key):
    """A key holding a character no request header carries (a Cyrillic letter, a zero-width space
    pasted with it) is refused on the form, the character named: the browser refused to send it
    and the form said "Could not reach Branchpoint: Failed to execute 'fetch'..."."""
    sign_in(page, ui, key)
    error = page.locator("#signin-error")
    expect(error).to_contain_text("This key cannot be sent as typed")
    expect(error).to_contain_text("U+200B" if "\u200b" in key else '"к" (U+043A)')
    assert page.evaluate("sessionStorage.length") == 0


def test_conversation_list_newest_first_search_and_paging(ui, page):
    marker = uuid.uuid4().hex[:6]
    client = ui.openai(KEY)
    ids = [f"list-{marker}-{i:02d}" for i in range(28)]
    for cid in ids:
        say(client, cid, user("hi"))
    say(client, f"other-{marker}", user("hi"))  # (the newest: the unfiltered list is not the search's)
    sign_in(page, ui)
    report = admin(ui).get("/admin/usage").json()
    expect(page.locator(".list .usage")).to_contain_text(
        f"Last 30 days: {report['calls']:,} calls, {report['total_tokens']:,} tokens ({MODEL} ")
    page.fill("input[type=search]", f"list-{marker}")
    rows = page.locator("tbody tr")
    # (the search's rows, newest first -- waited for: the unfiltered list begins with other-...;
    # "Load more" is hidden from the keystroke until the search has answered, so a page is never
    # added to a list the search then replaces)
    expect(rows.filter(has_not_text=f"list-{marker}")).to_have_count(0)
    expect(rows.first.locator("a")).to_have_text(ids[-1])
    expect(rows).to_have_count(25)
    page.click("text=Load more")
    expect(rows).to_have_count(28)
    expect(rows.last.locator("a")).to_have_text(ids[0])
    expect(page.locator("text=Load more")).to_be_hidden()
    page.fill("input[type=search]", f"list-{marker}-07")
    expect(rows).to_have_count(1)
    total = admin(ui).get(f"/admin/conversations/list-{marker}-07").json()["usage"]["total_tokens"]
    assert total > 0
    expect(rows.first.locator("td").nth(2)).to_have_text(f"{total:,}")  # the tokens column
    rows.first.locator("a").click()
    expect(page.locator(".toolbar .meta")).to_contain_text(f"list-{marker}-07")
    expect(page.locator(".toolbar .meta .tokens")).to_have_text(f" · {total:,} tokens")


def test_a_branched_conversation_and_its_arrows_move_the_head(ui, page):
    cid, n = edited_conversation(ui)
    open_conversation(page, ui, cid)
    graph = page.locator(".graph svg")
    expect(graph.locator(".node")).to_have_count(3)
    expect(node_el(page, n["q2_edit"])).to_have_class(re.compile(r"\bhead\b"))
    expect(graph.locator(".node.onpath")).to_have_count(2)
    # branches side by side: the edit sits in its own column on the row of the node it replaces
    at = {k: centre(page, v) for k, v in n.items()}
    assert at["q2"][1] == at["q2_edit"][1] and at["q2"][0] < at["q2_edit"][0]
    assert at["q1"] == (at["q2"][0], at["q2"][1] - 30)  # above its first child
    # the chat reads the head path with the position among the siblings
    chat = page.locator(".messages")
    expect(chat).to_contain_text("And of Spain?")
    expect(chat).not_to_contain_text("And of Italy?")
    expect(chat.locator(".arrows .position")).to_have_text("2/2")
    shot(page, "branched-conversation")

    chat.get_by_role("button", name="previous branch").click()
    wait_for(lambda: head_of(ui, cid) == n["q2"], what="the head on the first branch")
    expect(chat).to_contain_text("And of Italy?")
    expect(chat.locator(".arrows .position")).to_have_text("1/2")
    expect(node_el(page, n["q2"])).to_have_class(re.compile(r"\bhead\b"))
    # the same arrows by keyboard
    chat.get_by_role("button", name="next branch").focus()
    page.keyboard.press("Enter")
    wait_for(lambda: head_of(ui, cid) == n["q2_edit"], what="the head back on the edit")
    expect(chat.locator(".arrows .position")).to_have_text("2/2")


def test_keyboard_walks_the_tree_and_opens_nodes(ui, page):
    cid, n = edited_conversation(ui)
    open_conversation(page, ui, cid)
    node_el(page, n["q2"]).click()
    expect(page.locator(".detail")).to_contain_text(n["q2"])
    page.keyboard.press("ArrowRight")  # the next sibling
    expect(page.locator(".detail")).to_contain_text(n["q2_edit"])
    expect(node_el(page, n["q2_edit"])).to_be_focused()
    page.keyboard.press("ArrowUp")  # the parent
    expect(page.locator(".detail")).to_contain_text(n["q1"])
    page.keyboard.press("ArrowDown")  # down along the head path
    expect(page.locator(".detail")).to_contain_text(n["q2_edit"])
    page.keyboard.press("ArrowLeft")
    expect(page.locator(".detail")).to_contain_text(n["q2"])
    # Tab reaches the detail's actions: set the head from the keyboard
    page.locator(".detail button", has_text="Set head").focus()
    page.keyboard.press("Enter")
    wait_for(lambda: head_of(ui, cid) == n["q2"], what="the head on the selected node")


def test_node_detail_shows_tool_calls_usage_and_the_exact_request(ui, page, upstream):
    cid = f"tools-{uuid.uuid4().hex[:8]}"
    client = ui.openai(KEY)
    tools = [{"type": "function", "function": {"name": "run_sql", "parameters": {"type": "object", "properties": {}}}}]
    upstream.enqueue(Reply(content=None, tool_calls=[tool_call("call_1", args='{"sql": "select count(*) from sales"}')],
                           usage={"prompt_tokens": 31, "completion_tokens": 9, "total_tokens": 40}))
    _, first = say(client, cid, {"role": "system", "content": "You are a careful analyst."},
                   user("How many sales?"), tools=tools)
    upstream.enqueue(Reply(content="There were 42 sales."))
    _, second = say(client, cid, tool("call_1", '{"count": 42}'), tools=tools, temperature=0.2)
    sent_upstream = upstream.chat_requests[-1].body

    page.set_viewport_size({"width": 1500, "height": 1100})
    open_conversation(page, ui, cid)
    node_el(page, first["x-node-id"]).click()
    detail = page.locator(".detail")
    expect(detail).to_contain_text("tool call run_sql (call_1)")
    expect(detail).to_contain_text('"sql": "select count(*) from sales"')  # arguments as formatted JSON
    expect(detail).to_contain_text("31 in · 9 out · 40 total")
    expect(detail).to_contain_text("tool_calls")  # finish reason
    expect(detail).to_contain_text(MODEL)

    node_el(page, second["x-node-id"]).click()
    expect(detail).to_contain_text("result of call_1")
    expect(detail).to_contain_text('"count": 42')
    detail.get_by_role("button", name="Show the request the model saw").click()
    expect(detail.locator(".badge.ok", has_text="verified")).to_be_visible()
    shown = json.loads(detail.locator("pre.exact-request").inner_text())
    assert shown == sent_upstream  # exactly what the upstream received for this node
    assert shown["messages"][0] == {"role": "system", "content": "You are a careful analyst."}
    shot(page, "node-detail", docs=True)
    detail.locator("details summary", has_text="request parameters").click()
    expect(detail).to_contain_text('"temperature": 0.2')


def test_an_anthropic_session_reads_as_blocks(ui, page, upstream):
    """A Messages API session (Claude Code's shape: a tool round, then a rewind that edits the
    question): tool uses, tool results and thinking drawn from the stored blocks, the edit a branch."""
    cid = f"claude-{uuid.uuid4().hex[:8]}"
    http = httpx.Client(base_url=f"{ui.url}/c/{cid}/v1", headers={"x-api-key": KEY}, timeout=30)
    tools = [{"name": "Bash", "input_schema": {"type": "object"}}]
    upstream.enqueue(Reply(content="Listing.", reasoning="the user wants files", tool_calls=[
        tool_call("call_ls", name="Bash", args='{"command": "ls"}')]))
    first = http.post("/messages", json={"model": MODEL, "max_tokens": 50, "system": "You are a coding agent.",
                                          "tools": tools, "messages": [{"role": "user", "content": "list files"}]})
    assert first.status_code == 200, first.text
    upstream.enqueue(Reply(content="Two files: a.py and b.py."))
    second = http.post("/messages", json={"model": MODEL, "max_tokens": 50, "tools": tools, "messages": [
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_ls", "content": "a.py\nb.py"},
                                     {"type": "text", "text": "summarise"}]}]})
    assert second.status_code == 200, second.text
    edit = http.post("/messages", headers={"x-parent-node-id": "root"}, json={
        "model": MODEL, "max_tokens": 50, "messages": [{"role": "user", "content": "list only python files"}]})
    assert edit.status_code == 200, edit.text
    http.close()

    page.set_viewport_size({"width": 1500, "height": 1100})
    open_conversation(page, ui, cid)
    expect(page.locator(".graph [data-id]")).to_have_count(3)  # the rewind: a second root, a branch
    node_el(page, first.headers["x-node-id"]).click()
    detail = page.locator(".detail")
    expect(detail).to_contain_text("Messages API")
    expect(detail).to_contain_text("tool call Bash (call_ls)")
    expect(detail).to_contain_text("the user wants files")
    # (the node keeps its chat upstream's usage, in chat's terms: docs/behaviour.md)
    stored = admin(ui).get(f"/admin/nodes/{first.headers['x-node-id']}").json()["usage"]
    expect(detail).to_contain_text(f"{stored['prompt_tokens']} in · {stored['completion_tokens']} out · "
                                   f"{stored['prompt_tokens'] + stored['completion_tokens']} total")
    node_el(page, second.headers["x-node-id"]).click()
    expect(detail).to_contain_text("result of call_ls")
    expect(detail).to_contain_text("summarise")
    detail.get_by_role("button", name="Show the request the model saw").click()
    expect(detail.locator(".badge.ok", has_text="verified")).to_be_visible()
    shot(page, "messages-session", docs=True)


def test_compare_two_answers_and_what_their_models_saw(ui, page, upstream):
    """Compare: the answer to q2 and the answer to its edit side by side, and the requests' diff --
    the first turn the same on both sides, each side's own question (and nothing else) its own."""
    cid, ids = edited_conversation(ui)
    page.set_viewport_size({"width": 1500, "height": 1000})
    open_conversation(page, ui, cid)
    node_el(page, ids["q2"]).click()
    page.locator(".detail button.compare").click()
    expect(page.locator(".status")).to_contain_text("Pick another node")
    node_el(page, ids["q2_edit"]).click()
    view = page.locator(".compare-view")
    expect(view).to_be_visible()
    expect(view.locator(".answer-a")).to_contain_text("echo: And of Italy?")
    expect(view.locator(".answer-b")).to_contain_text("echo: And of Spain?")
    diff = view.locator(".diff")
    same = diff.locator("details.same").first
    expect(same.locator("summary")).to_have_text("2 messages the same on both sides")  # q1 and its answer
    same.locator("summary").click()
    expect(same).to_contain_text("What is the capital of France?")
    expect(diff.locator(".only-a")).to_have_count(1)
    expect(diff.locator(".only-a")).to_contain_text("And of Italy?")
    expect(diff.locator(".only-b")).to_have_count(1)
    expect(diff.locator(".only-b")).to_contain_text("And of Spain?")
    shot(page, "compare", docs=True)
    page.keyboard.press("Escape")
    expect(view).to_have_count(0)


def test_long_tool_results_are_folded_and_shown_in_part(ui, page, upstream):
    """An agent session's tool calls and results are one folded line each (name, size); a 200 KB
    result shows its first part until "show all"."""
    cid = f"fold-{uuid.uuid4().hex[:8]}"
    client = ui.openai(KEY)
    tools = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object", "properties": {}}}}]
    upstream.enqueue(Reply(content=None, tool_calls=[tool_call("call_big", name="read_file", args='{"path": "big.log"}')]))
    _, first = say(client, cid, user("read big.log"), tools=tools)
    big = "".join(f"line {i:06d} of the log\n" for i in range(9000))  # ~200 KB
    upstream.enqueue(Reply(content="It is a log."))
    _, second = say(client, cid, tool("call_big", big), tools=tools)
    open_conversation(page, ui, cid)
    chat = page.locator(".messages")
    call = chat.locator("details.fold-item", has_text="tool call read_file (call_big)")
    expect(call).to_have_count(1)
    expect(call.locator("summary")).to_contain_text("B")  # its size
    result = chat.locator("details.fold-item", has_text="result of call_big (read_file)")
    expect(result.locator("summary")).to_contain_text("KB")
    assert result.get_attribute("open") is None  # folded
    result.locator("summary").click()
    pre = result.locator("pre")
    assert len(pre.inner_text()) < 5000  # its first part
    result.locator("button.show-all").click()
    expect(result.locator("pre")).to_contain_text("line 008999 of the log")


def test_cleared_tool_results_and_their_originals(ui, page, upstream):
    """Context editing in the viewer: a clearing node is drawn as one (not a summary), its
    placeholders say what was cleared, and each original is one click away."""
    cid = f"cleared-{uuid.uuid4().hex[:8]}"
    client = ui.openai(KEY)
    senders = []
    for i in range(5):
        upstream.enqueue(Reply(content=None, tool_calls=[tool_call(f"call_{i}", name="read_file", args=f'{{"path": "f{i}"}}')]))
        say(client, cid, user(f"read f{i}"))
        upstream.enqueue(Reply(content=f"read {i}"))
        _, h = say(client, cid, tool(f"call_{i}", f"contents of f{i}: " + "lorem ipsum " * 40))
        senders.append(h["x-node-id"])
    before = head_of(ui, cid)
    open_conversation(page, ui, cid)
    page.click(".toolbar >> text=Clear old tool results")
    expect(page.locator(".graph .node.compaction.cleared")).to_have_count(1)
    done = admin(ui).get(f"/admin/nodes/{head_of(ui, cid)}").json()
    assert done["method"] == "clear_tool_results" and done["compacted_from"] == before
    assert done["params"]["cleared_results"] == 2
    done["node_id"] = done["id"]
    chat = page.locator(".messages")
    line = chat.locator(".msg.compaction.cleared > summary")
    expect(line).to_contain_text("2 tool results cleared")
    line.click()
    cleared = chat.locator(".fold-item.cleared")
    expect(cleared).to_have_count(2)
    expect(cleared.first).to_contain_text("result of call_0 (read_file) · cleared")
    shot(page, "cleared-tool-results", docs=True)
    cleared.first.locator("button.original").click()  # the original, one click away
    detail = page.locator(".detail")
    expect(detail.locator("dd.mono")).to_have_text(senders[0])
    detail.locator("details.fold-item summary", has_text="result of call_0").click()
    expect(detail).to_contain_text("contents of f0: lorem ipsum")
    node_el(page, done["node_id"]).click()
    expect(detail.locator("dd.method")).to_contain_text("old tool results cleared (2")
    detail.locator("button.link", has_text=done["compacted_from"][-12:]).click()  # the path it replaces
    expect(detail.locator("dd.mono")).to_have_text(done["compacted_from"])


def test_spend_per_day_and_per_call(ui, page, upstream):
    """The list draws the key's tokens per day by model for 30 days (SVG, from /admin/usage); a
    conversation its tokens per call along its path -- the bars hold what the admin API reports."""
    cid, ids = edited_conversation(ui)
    sign_in(page, ui)
    chart = page.locator(".spend svg.spend-daily")
    expect(chart).to_be_visible()
    expect(chart.locator("g.bar")).to_have_count(30)
    today = datetime.now(UTC).date()
    since = datetime(today.year, today.month, today.day, tzinfo=UTC)
    report = admin(ui).get("/admin/usage", params={"since": since.isoformat(),
                                                   "until": (since + timedelta(days=1)).isoformat()}).json()
    drawn = chart.locator(f'g.bar[data-column="{today.isoformat()}"]')
    assert int(drawn.get_attribute("data-total")) == report["prompt_tokens"] + report["completion_tokens"] > 0
    expect(page.locator(".legend-models")).to_contain_text(MODEL)
    shot(page, "spend-daily", docs=True)

    page.goto(f"{ui.url}/ui/#/c/{cid}")
    expect(page.locator(".graph svg")).to_be_visible()
    page.locator("details.tokens-per-call summary").click()
    bars = page.locator("svg.spend-path g.bar")
    expect(bars).to_have_count(2)  # the head path: the first question and the edited second one
    for bar, node_id in zip(bars.all(), (ids["q1"], ids["q2_edit"]), strict=True):
        usage = admin(ui).get(f"/admin/nodes/{node_id}").json()["usage"]
        assert bar.get_attribute("data-column") == node_id
        assert int(bar.get_attribute("data-total")) == usage["prompt_tokens"] + usage["completion_tokens"]
    shot(page, "spend")


def test_the_viewer_counts_tokens_of_every_usage_shape_as_the_database_does(ui, page):
    """The viewer's token counts of a usage object (spend.js ``tokensOf``) agree with the
    database's (``bp_prompt_tokens``, ``bp_cached_tokens``) for each API's usage: Anthropic's
    input tokens leave its cache out, Responses' and chat's count it, and the cache writes a
    translated call carries beside chat's or Responses' fields are counted once."""
    shapes = [
        {"input_tokens": 10, "cache_read_input_tokens": 50, "cache_creation_input_tokens": 100, "output_tokens": 5},
        {"prompt_tokens": 160, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 50},
         "cache_creation_input_tokens": 100},
        {"input_tokens": 160, "output_tokens": 5, "input_tokens_details": {"cached_tokens": 50},
         "cache_creation_input_tokens": 100},
        {"input_tokens": 100, "output_tokens": 5, "input_tokens_details": {"cached_tokens": 80}},
    ]
    page.goto(f"{ui.url}/ui/")
    drawn = page.evaluate("shapes => import('/ui/spend.js').then(m => shapes.map(m.tokensOf))", shapes)
    def count(u: dict) -> dict:
        return dict(ui.db.fetchrow("SELECT bp_prompt_tokens($1::jsonb)::int AS prompt, 5 AS completion, "
                                   "bp_cached_tokens($1::jsonb)::int AS cached", u))

    with ThreadPoolExecutor(1) as thread:  # Playwright's loop runs in this one
        counted = list(thread.map(count, shapes))
    assert drawn == counted == [{"prompt": 160, "completion": 5, "cached": 150}] * 3 + [
        {"prompt": 100, "completion": 5, "cached": 80}]


def test_find_a_conversation_by_what_was_said(ui, page, upstream):
    """Search in messages: the list shows the conversations whose messages hold the words, with a
    snippet, and opens one on the node that matched."""
    word = f"zebra{uuid.uuid4().hex[:6]}"
    cid = f"find-{uuid.uuid4().hex[:8]}"
    client = ui.openai(KEY)
    say(client, cid, user("What is the capital of France?"))
    _, found = say(client, cid, user(f"Is the {word} striped?"))
    say(client, cid, user("And of Spain?"))
    sign_in(page, ui)
    page.locator("select[aria-label='search in']").select_option("text")
    page.fill("input[type=search]", word)
    row = page.locator("tr.row", has_text=cid)
    expect(row).to_have_count(1)
    expect(row.locator(".snippet")).to_contain_text(f"«{word}»")
    expect(page.locator("tr.row")).to_have_count(1)
    shot(page, "find", docs=True)
    row.click()
    expect(page.locator(".detail")).to_contain_text(found["x-node-id"])
    expect(node_el(page, found["x-node-id"])).to_have_class(re.compile(r"\bselected\b"))


def test_nodes_are_coloured_by_kind_and_status(ui, page, upstream):
    """A working session: a side call, an edit, a failure and a call still in flight."""
    cid = f"trip-{uuid.uuid4().hex[:6]}"
    client = ui.openai(KEY)
    upstream.enqueue(Reply(content="Day 1: Alfama and the castle. Day 2: Belém. Day 3: Sintra."))
    _, q1 = say(client, cid, {"role": "system", "content": "You are a travel planner."}, user("Plan 3 days in Lisbon."))
    upstream.enqueue(Reply(content="Morning at São Jorge castle, lunch in Alfama, fado in the evening."))
    say(client, cid, user("Day 1 in more detail?"))
    upstream.enqueue(Reply(content="Lisbon in 3 days: old town, river, hills."))
    _, side = say(client, cid, user("Give the plan a title."), kind="transform")
    upstream.enqueue(Reply(content="The Jerónimos monastery, the tower, pastéis de Belém."))
    say(client, cid, user("Day 2 in more detail?"), parent=q1["x-node-id"])
    upstream.enqueue(Reply(kind="error", status=400, error={"message": "bad tool schema", "type": "invalid_request_error",
                                                            "param": None, "code": "bad_schema"}))
    with pytest.raises(openai.BadRequestError):
        say(client, cid, user("Book the tickets."), tools=[{"type": "function", "function": {"name": "book"}}])
    release = threading.Event()
    upstream.enqueue(Reply(content="Sintra: Pena palace and the Moorish castle.", hold=release))
    in_flight = threading.Thread(target=say, args=(client, cid, user("And day 3?")))
    in_flight.start()
    try:
        wait_for(lambda: admin(ui).get(f"/admin/conversations/{cid}").json()["busy"], what="a call in flight")
        tree = admin(ui).get(f"/admin/conversations/{cid}/tree").json()["data"]
        failed = next(n["id"] for n in tree if n["status"] == "failed")
        pending = next(n["id"] for n in tree if n["status"] == "pending")
        open_conversation(page, ui, cid)
        expect(page.locator(".graph .node")).to_have_count(6)
        expect(node_el(page, side["x-node-id"])).to_have_class(re.compile(r"\btransform\b"))
        expect(node_el(page, failed)).to_have_class(re.compile(r"\bfailed\b"))
        expect(node_el(page, pending)).to_have_class(re.compile(r"\bpending\b"))
        expect(page.locator(".toolbar .meta")).to_contain_text("call in flight")
        node_el(page, failed).click()
        expect(page.locator(".detail")).to_contain_text("bad tool schema")
        expect(page.locator(".detail .badge.bad")).to_contain_text("failed (invalid)")
        shot(page, "branched", docs=True)
    finally:
        release.set()
        in_flight.join(10)
    # the answer lands: the node turns into a success and becomes the head, without a reload
    expect(node_el(page, pending)).to_have_class(re.compile(r"\bok\b"), timeout=10_000)
    expect(node_el(page, pending)).to_have_class(re.compile(r"\bhead\b"))
    expect(page.locator(".messages")).to_contain_text("Pena palace")


def test_sending_from_a_node_streams_in_and_branches(ui, page, upstream):
    cid, n = edited_conversation(ui)
    open_conversation(page, ui, cid)
    gate = threading.Event()
    upstream.enqueue(Reply(kind="stream", pieces=["Rome ", "is the ", "capital."], gate=gate, gate_after=2))
    node_el(page, n["q1"]).click()
    expect(page.locator(".detail")).to_contain_text(n["q1"])  # (its detail, not the last one's)
    page.locator(".detail button", has_text="Reply from here").click()
    expect(page.locator(".composer .mode")).to_contain_text("Reply under node")
    page.fill(".composer textarea", "What about Rome?")
    page.click(".composer button.primary")
    # the answer appears while the upstream is still sending it
    expect(page.locator(".msg.streaming")).to_contain_text("Rome")
    assert "capital" not in page.locator(".msg.streaming").inner_text()
    gate.set()
    expect(page.locator(".graph .node")).to_have_count(4)
    sent = upstream.chat_requests[-1].messages
    assert [m["content"] for m in sent] == ["What is the capital of France?", "echo: What is the capital of France?",
                                            "What about Rome?"]
    new = head_of(ui, cid)
    assert new not in n.values()
    assert admin(ui).get(f"/admin/nodes/{new}").json()["parent_id"] == n["q1"]
    expect(node_el(page, new)).to_have_class(re.compile(r"\bhead\b"))
    expect(page.locator(".messages")).to_contain_text("Rome is the capital.")
    expect(page.locator(".messages .arrows .position")).to_have_text("3/3")

    # edit a question: prefilled, sent beside the original with the same context before it
    node_el(page, n["q2"]).click()
    expect(page.locator(".detail")).to_contain_text(n["q2"])  # (its detail, not the last one's)
    page.locator(".detail button", has_text="Edit question").click()
    expect(page.locator(".composer textarea")).to_have_value("And of Italy?")
    page.fill(".composer textarea", "And of Portugal?")
    asked = len(upstream.chat_requests)
    page.keyboard.press("Control+Enter")
    wait_for(lambda: len(admin(ui).get(f"/admin/conversations/{cid}/tree").json()["data"]) == 5, what="the edit stored")
    # (a node is listed from its start on, before its request reaches the upstream)
    wait_for(lambda: len(upstream.chat_requests) > asked, what="the edit's request")
    wait_for(lambda: not admin(ui).get(f"/admin/conversations/{cid}").json()["busy"], what="the edit finished")
    assert [m["content"] for m in upstream.chat_requests[-1].messages][-1] == "And of Portugal?"
    assert len(upstream.chat_requests[-1].messages) == 3
    edit = head_of(ui, cid)
    assert admin(ui).get(f"/admin/nodes/{edit}").json()["parent_id"] == n["q1"]

    # regenerate an answer: the same messages again, a sibling of that node
    node_el(page, n["q1"]).click()
    expect(page.locator(".detail")).to_contain_text(n["q1"])  # (its detail, not the last one's)
    asked = len(upstream.chat_requests)
    page.locator(".detail button", has_text="Regenerate").click()
    wait_for(lambda: len(admin(ui).get(f"/admin/conversations/{cid}/tree").json()["data"]) == 6, what="the regeneration")
    wait_for(lambda: len(upstream.chat_requests) > asked, what="the regeneration's request")
    wait_for(lambda: not admin(ui).get(f"/admin/conversations/{cid}").json()["busy"], what="the regeneration finished")
    assert upstream.chat_requests[-1].messages == [user("What is the capital of France?")]
    regenerated = admin(ui).get(f"/admin/nodes/{head_of(ui, cid)}").json()
    assert regenerated["parent_id"] is None and regenerated["sent"] == [user("What is the capital of France?")]
    expect(page.locator(".graph .node")).to_have_count(6)


def test_set_head_fork_compact_and_delete(ui, page, upstream):
    cid, n = edited_conversation(ui)
    open_conversation(page, ui, cid)
    detail = page.locator(".detail")
    node_el(page, n["q1"]).click()
    detail.locator("button", has_text="Set head").click()
    wait_for(lambda: head_of(ui, cid) == n["q1"], what="head on q1")
    expect(node_el(page, n["q1"])).to_have_class(re.compile(r"\bhead\b"))

    detail.locator("button", has_text="Fork from here").click()
    expect(page).to_have_url(re.compile(rf"#/c/{re.escape(cid)}\.fork-"))
    fork_id = page.url.split("#/c/", 1)[1]
    fork = admin(ui).get(f"/admin/conversations/{fork_id}").json()
    assert fork["head_node_id"] == n["q1"] and fork["forked_from"] == cid
    expect(page.locator(".graph .node.inherited")).to_have_count(1)  # the source's node it sees

    page.goto(f"{ui.url}/ui/#/c/{cid}")
    node_el(page, n["q2"]).click()
    detail.locator("button", has_text="Switch here").click()
    wait_for(lambda: head_of(ui, cid) == n["q2"], what="head on q2")
    page.click(".toolbar >> text=Compact now")
    expect(page.locator(".graph .node.compaction")).to_have_count(1)
    expect(page.locator(".graph path.edge.compacted")).to_have_count(1)
    compaction = head_of(ui, cid)
    assert admin(ui).get(f"/admin/nodes/{compaction}").json()["compacted_from"] == n["q2"]
    expect(page.locator(".messages")).to_contain_text("compaction")

    page.click(".toolbar >> text=Delete…")
    page.locator("dialog button", has_text="Cancel").click()
    assert admin(ui).get(f"/admin/conversations/{cid}").status_code == 200
    page.click(".toolbar >> text=Delete…")
    page.locator("dialog button", has_text="Delete").click()
    expect(page).to_have_url(re.compile(r"#/$"))
    assert admin(ui).get(f"/admin/conversations/{cid}").status_code == 404
    assert admin(ui).get(f"/admin/conversations/{fork_id}").json()["head_node_id"] == n["q1"]  # the fork keeps its context


def test_export_downloads_the_whole_tree(ui, page):
    cid, n = edited_conversation(ui)
    open_conversation(page, ui, cid)
    with page.expect_download() as download:
        page.click(".toolbar >> text=Export")
    assert download.value.suggested_filename == f"{cid}.jsonl"
    lines = [json.loads(line) for line in Path(download.value.path()).read_text().splitlines()]
    tree = admin(ui).get(f"/admin/conversations/{cid}/tree").json()["data"]
    assert [line["id"] for line in lines] == [node["id"] for node in tree]  # every node, oldest first
    assert [line["id"] for line in lines if line["head"]] == [head_of(ui, cid)]
    assert all("sent" in line and "received" in line for line in lines)
    expect(page.locator(".toolbar .status")).to_have_text("exported")


def test_import_makes_a_new_conversation_of_an_export(ui, page, tmp_path):
    cid, n = edited_conversation(ui)
    exported = tmp_path / f"{cid}.jsonl"
    exported.write_bytes(admin(ui).get(f"/admin/conversations/{cid}/export").content)
    sign_in(page, ui)
    expect(page.locator("table")).to_be_visible()
    asked = []
    page.once("dialog", lambda dialog: (asked.append(dialog.default_value), dialog.accept(f"{cid}-again")))
    page.set_input_files("input[type=file]", str(exported))
    expect(page).to_have_url(re.compile(rf"#/c/{re.escape(cid)}-again$"))
    assert asked == [f"{cid}-imported"]  # the file's name is offered
    expect(page.locator(".graph .node")).to_have_count(3)
    expect(page.locator(".messages")).to_contain_text("And of Spain?")
    assert admin(ui).get(f"/admin/conversations/{cid}-again").json()["node_count"] == 3

    bad = tmp_path / "bad.jsonl"
    bad.write_text("this is no export\n")
    page.goto(f"{ui.url}/ui/#/")
    expect(page.locator("table")).to_be_visible()
    page.once("dialog", lambda dialog: dialog.accept(f"{cid}-bad"))
    page.set_input_files("input[type=file]", str(bad))
    expect(page.locator(".list .notice[role=status]")).to_contain_text("not an export this proxy can import")
    assert admin(ui).get(f"/admin/conversations/{cid}-bad").status_code == 404


def test_nodes_from_other_clients_appear_without_a_reload(ui, page):
    cid, n = edited_conversation(ui)
    open_conversation(page, ui, cid)
    expect(page.locator(".graph .node")).to_have_count(3)
    _, h = say(ui.openai(KEY), cid, user("Another client asks"))
    expect(page.locator(".graph .node")).to_have_count(4)
    expect(node_el(page, h["x-node-id"])).to_have_class(re.compile(r"\bhead\b"))
    expect(page.locator(".messages")).to_contain_text("Another client asks")


def test_a_side_call_that_lands_is_redrawn_without_a_reload(ui, page, upstream):
    """A side call (X-Node-Kind: transform) in flight when the page opened is drawn answered once
    it lands: its finish moves neither the node count, the head, updated_at nor the busy flag the
    poll watched, so it stayed amber until a reload."""
    cid = f"side-{uuid.uuid4().hex[:8]}"
    client = ui.openai(KEY)
    say(client, cid, user("main question"))
    release = threading.Event()
    upstream.enqueue(Reply(content="A title", hold=release))
    side: list[Any] = []
    in_flight = threading.Thread(target=lambda: side.append(say(client, cid, user("a title for this chat?"), kind="transform")))
    in_flight.start()
    try:
        wait_for(lambda: admin(ui).get(f"/admin/conversations/{cid}").json()["node_count"] == 2, what="the side call started")
        open_conversation(page, ui, cid)
        expect(page.locator(".graph .node.pending")).to_have_count(1)
    finally:
        release.set()
        in_flight.join(10)
    node = side[0][1]["x-node-id"]
    assert admin(ui).get(f"/admin/nodes/{node}").json()["status"] == "success"
    expect(node_el(page, node)).to_have_class(re.compile(r"\bok\b"))
    expect(page.locator(".graph .node.pending")).to_have_count(0)


def test_a_node_deleted_elsewhere_leaves_the_detail_pane(ui, page, upstream):
    """The selected node deleted by another client (DELETE /v1/responses/{id}) leaves the detail
    pane, its actions with it, and the composer aimed at it goes back to the head: the pane kept
    showing the node in full, with buttons acting on a node that no longer exists."""
    cid = f"delr-{uuid.uuid4().hex[:8]}"
    client = ui.openai(KEY)
    client.responses.create(model=MODEL, input="first question", extra_headers={"X-Conversation-Id": cid})
    gone = client.responses.create(model=MODEL, input="second question", extra_headers={"X-Conversation-Id": cid})
    node = head_of(ui, cid)
    # (another root holds the head: a head's response is only withdrawn, its node kept)
    client.responses.create(model=MODEL, input="another root", extra_headers={"X-Conversation-Id": cid, "X-Parent-Node-Id": "root"})
    open_conversation(page, ui, cid)
    node_el(page, node).click()
    detail = page.locator(".detail")
    expect(detail.locator("dd.mono")).to_have_text(node)
    detail.locator("button", has_text="Reply from here").click()
    expect(page.locator(".composer .mode")).to_contain_text("Reply under node")
    assert httpx.delete(f"{ui.url}/v1/responses/{gone.id}", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    expect(node_el(page, node)).to_have_count(0)
    expect(detail).to_have_text("Select a node to see it in full.")
    expect(page.locator(".composer .mode")).to_have_text("Send from the head")


def test_a_conversation_deleted_and_made_again_shows_the_new_one(ui, page, upstream):
    """A conversation deleted and made again under the same id while it is open shows the new
    one only: the old node's detail -- what it said, its actions -- stayed in the pane."""
    cid = f"again-{uuid.uuid4().hex[:8]}"
    client = ui.openai(KEY)
    _, old = say(client, cid, user("the old conversation's question"))
    open_conversation(page, ui, cid)
    node_el(page, old["x-node-id"]).click()
    expect(page.locator(".detail dd.mono")).to_have_text(old["x-node-id"])
    assert admin(ui).delete(f"/admin/conversations/{cid}").status_code == 200
    _, new = say(client, cid, user("the new conversation's question"))  # (before the next poll)
    expect(node_el(page, new["x-node-id"])).to_have_count(1)
    expect(node_el(page, old["x-node-id"])).to_have_count(0)
    expect(page.locator("main")).not_to_contain_text("the old conversation's question")
    expect(page.locator(".detail")).to_have_text("Select a node to see it in full.")


@pytest.mark.parametrize("fragment", ["#/c/%", "#/c/%E0%A4%A", "#/t/%/c/x", "#/c/x?node=%ZZ"])
def test_a_malformed_link_opens_the_list(ui, page, fragment):
    """A link whose escapes do not decode opens the list and says so -- followed, and loaded
    afresh: decoding it threw (`URI malformed`, a script error the fixture fails on) and a fresh
    load left the page blank."""
    sign_in(page, ui)
    expect(page.locator("table")).to_be_visible()
    page.goto(f"{ui.url}/ui/{fragment}")
    expect(page.locator(".list [role=alert]")).to_have_text(f"Not a conversation link: {fragment}")
    page.reload()
    expect(page.locator("table")).to_be_visible()
    expect(page.locator(".list [role=alert]")).to_have_text(f"Not a conversation link: {fragment}")


def test_a_long_unbroken_word_does_not_widen_the_page(ui, page, upstream):
    """A word as long as a line -- a URL in a conversation's metadata, a 400-character tool name
    and call id -- breaks where it must: the page stays as wide as the window and the detail pane
    within it (they widened the page and pushed the detail pane off screen)."""
    client = ui.openai(KEY)
    url = "https://example.com/" + "a1b2c3d4" * 20
    conv = client.conversations.create(items=[{"type": "message", "role": "user", "content": "hi"}], metadata={"source": url})
    upstream.enqueue(Reply(content=None, tool_calls=[tool_call("call_" + "C" * 400, name="W" * 400)]))
    client.responses.create(model=MODEL, conversation=conv.id, input="use the tool")
    open_conversation(page, ui, conv.id)
    expect(page.locator(".toolbar .meta")).to_contain_text(f"source: {url}")
    expect(page.locator(".messages")).to_contain_text("tool call " + "W" * 400)
    page.locator(".messages details.fold-item > summary").first.click()
    node_el(page, head_of(ui, conv.id)).click()
    expect(page.locator(".detail")).to_contain_text("tool call " + "W" * 400)
    width = page.evaluate("() => ({window: innerWidth, page: document.documentElement.scrollWidth, "
                          "detail: document.querySelector('.detail').getBoundingClientRect().right})")
    assert width["page"] <= width["window"] and width["detail"] <= width["window"], width


def test_an_admin_key_reads_and_steers_other_tenants(ui, page, tenant):
    cid, n = edited_conversation(ui)
    sign_in(page, ui, ADMIN_KEY)
    page.fill("input[type=search]", cid)
    row = page.locator("tbody tr")
    expect(row).to_have_count(1)
    expect(row).to_contain_text(f"tenant {tenant}")
    row.locator("a").click()
    expect(page).to_have_url(re.compile(rf"#/t/{tenant}/c/{cid}$"))
    expect(page.locator(".graph .node")).to_have_count(3)
    expect(page.locator(".composer")).to_contain_text("Read-only")
    page.locator(".messages").get_by_role("button", name="previous branch").click()
    wait_for(lambda: head_of(ui, cid) == n["q2"], what="the head moved by the admin")
    node_el(page, n["q1"]).click()
    expect(page.locator(".detail")).to_contain_text(n["q1"])
    expect(page.locator(".detail button", has_text="Regenerate")).to_have_count(0)


# -- a big tree ---------------------------------------------------------------------------------


def _big_tree(size: int) -> list[dict[str, Any]]:
    """A 1,000-node conversation: a long main line with edits, regenerations and failures off it,
    a compaction half way."""
    start = datetime(2026, 1, 1, tzinfo=UTC)
    nodes: list[dict[str, Any]] = []

    def add(parent: dict[str, Any] | None, *, kind: str = "turn", outcome: str = "success",
            compacted_from: dict[str, Any] | None = None) -> dict[str, Any]:
        i = len(nodes)
        question = f"question {i}"
        node = {"id": str(uuid.UUID(int=i + 1)), "parent_id": parent["id"] if parent else None, "kind": kind,
                "outcome": outcome, "sent": [user(question)], "received": [assistant(f"answer {i}")] if outcome == "success" else None,
                "compacted_from": compacted_from["id"] if compacted_from else None}
        if kind == "compaction":
            node["sent"] = [user("Summary of the earlier part of this conversation: many questions.")]
            node["received"] = None
        nodes.append(node)
        return node

    main = add(None)
    while len(nodes) < size:
        i = len(nodes)
        if i == size // 2:
            main = add(None, kind="compaction", compacted_from=main)
        elif i % 37 == 0:
            add(main)  # an edit beside the next main node
        elif i % 53 == 0:
            add(main, outcome="transient")
        elif i % 41 == 0:
            side = add(main)
            for _ in range(3):
                if len(nodes) < size - 1:
                    side = add(side)
        else:
            main = add(main)
    keys = transcript.node_keys(nodes)
    depth: dict[str, int] = {}
    for i, node in enumerate(nodes):
        up = node["parent_id"]
        depth[node["id"]] = depth[up] + 1 if up else 0
        node.update(depth=depth[node["id"]], created_at=(start + timedelta(seconds=i)).isoformat(),
                    finished_at=(start + timedelta(seconds=i, milliseconds=500)).isoformat(), model=MODEL,
                    provider="fake", params={}, usage={"prompt_tokens": i, "completion_tokens": 3, "total_tokens": i + 3},
                    finish_reason="stop" if node["outcome"] == "success" else None,
                    error=None if node["outcome"] == "success" else {"type": "server_error", "code": "upstream_error",
                                                                      "message": "fake", "kind": node["outcome"]},
                    chain=keys[node["id"]].chain.hex(), answered=keys[node["id"]].answered,
                    system_hash=None, api="chat")
    return nodes


def test_a_thousand_node_tree_renders_and_stays_usable(ui, page, database_url, tenant):
    cid = f"big-{uuid.uuid4().hex[:8]}"
    nodes = _big_tree(1000)
    head = nodes[-1]["id"]

    async def load() -> int | None:
        db = await open_database(database_url, min_size=1, max_size=1)
        try:
            return await AdminStore(db).import_tree(tenant, cid, nodes, uuid.UUID(head), 1)
        finally:
            await db.close()

    with ThreadPoolExecutor(1) as thread:  # Playwright's loop runs in this one
        assert thread.submit(asyncio.run, load()).result() == 1000
    open_conversation(page, ui, cid)
    svg = page.locator(".graph svg")
    expect(svg).to_have_attribute("data-nodes", "1000")
    # the page times itself (bench/viewer.py reads these; the speed goal lives there, not here)
    expect(svg).to_have_attribute("data-open-ms", re.compile(r"^\d+(\.\d+)?$"))
    expect(svg).to_have_attribute("data-render-ms", re.compile(r"^\d+(\.\d+)?$"))
    # long single-child runs are folded; what is drawn never overlaps
    folds = page.locator(".graph .fold")
    assert folds.count() >= 1
    positions = page.evaluate("""() => [...document.querySelectorAll('.graph .node, .graph .fold')]
                                         .map((g) => g.getAttribute('transform'))""")
    assert len(positions) == len(set(positions))
    drawn_nodes = page.locator(".graph .node").count()
    assert drawn_nodes < 1000
    folds.first.click()
    expect(page.locator(".graph .node")).not_to_have_count(drawn_nodes)  # unfolded
    # still usable: select, walk up by keyboard, the compaction link is drawn
    node_el(page, head).click()
    expect(page.locator(".detail")).to_contain_text(head)
    for _ in range(3):
        page.keyboard.press("ArrowUp")
    expect(page.locator(".detail")).not_to_contain_text(head)
    expect(page.locator(".graph path.edge.compacted")).to_have_count(1)
    shot(page, "thousand-nodes")


def test_regenerating_a_side_call_makes_a_side_call(ui, page, upstream):
    """Regenerate on a transform: another side call beside it, the head where it was (it made a
    turn, whose question then went into every later call's context)."""
    cid = f"regen-{uuid.uuid4().hex[:8]}"
    client = ui.openai(KEY)
    _, h1 = say(client, cid, user("main question"))
    _, t = say(client, cid, user("a title for this chat?"), kind="transform")
    open_conversation(page, ui, cid)
    node_el(page, t["x-node-id"]).click()
    expect(page.locator(".detail dd.mono")).to_have_text(t["x-node-id"])
    page.locator(".detail button", has_text="Regenerate").click()
    wait_for(lambda: admin(ui).get(f"/admin/conversations/{cid}").json()["node_count"] == 3, what="a third node")
    new = next(n for n in admin(ui).get(f"/admin/conversations/{cid}/tree").json()["data"]
               if n["id"] not in (h1["x-node-id"], t["x-node-id"]))
    assert new["kind"] == "transform" and new["parent_id"] == h1["x-node-id"]
    assert head_of(ui, cid) == h1["x-node-id"]


PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
PDF = "JVBERi0xLjQKJcOkw7zDtsOfCjEgMCBvYmoKPDwvVHlwZS9DYXRhbG9nPj4KZW5kb2JqCg=="


def ask_with_an_image(ui: Any, cid: str, api: str) -> str:
    """One question holding an image (and, in the Messages API, a PDF) and its text, asked in
    ``api``'s own shape; the node's id."""
    if api == "chat":
        _, h = say(ui.openai(KEY), cid, user([{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
                                              {"type": "text", "text": "What is in this picture?"}]))
        return h["x-node-id"]
    with httpx.Client(base_url=f"{ui.url}/c/{cid}/v1", headers={"Authorization": f"Bearer {KEY}"}, timeout=30) as http:
        if api.startswith("messages"):
            by_id = [{"type": "image", "source": {"type": "file", "file_id": "file_011CNha8iCJcU1wXNR6q4V8w"}}] \
                if api == "messages-file-id" else []
            r = http.post("/messages", json={"model": MODEL, "max_tokens": 50, "messages": [{"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}, *by_id,
                {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": PDF}},
                {"type": "text", "text": "What is in this picture?"}]}]})
        else:
            by_id = [{"type": "input_image", "file_id": "file-img123", "detail": "auto"}] \
                if api == "responses-file-id" else []
            r = http.post("/responses", json={"model": MODEL, "input": [{"role": "user", "content": [
                {"type": "input_image", "image_url": f"data:image/png;base64,{PNG}", "detail": "low"}, *by_id,
                {"type": "input_text", "text": "What is in this picture?"}]}]})
    assert r.status_code == 200, r.text
    return r.headers["x-node-id"]


@pytest.mark.parametrize("api", ["messages", "messages-file-id", "responses", "responses-file-id"])
def test_regenerate_sends_the_questions_images_again(ui, page, upstream, api):
    """Regenerate on a Messages or Responses node sends the model what the first call sent it:
    the image (and the PDF) as parts, beside the text -- the viewer rebuilt the request from what
    it draws, and the model got the literal text "[image]What is in this picture?". An image by
    Anthropic or OpenAI file id goes as the line naming it, as the proxy's translation writes it
    (not as a URL that is a file id, which chat upstreams refuse)."""
    cid = f"regimg-{api}-{uuid.uuid4().hex[:6]}"
    node = ask_with_an_image(ui, cid, api)
    first = upstream.chat_requests[-1].messages
    assert any(part["type"] == "image_url" for part in first[-1]["content"])
    open_conversation(page, ui, cid)
    node_el(page, node).click()
    expect(page.locator(".detail dd.mono")).to_have_text(node)
    asked = len(upstream.chat_requests)
    page.locator(".detail button", has_text="Regenerate").click()
    wait_for(lambda: len(upstream.chat_requests) > asked, what="the regeneration's request")
    assert upstream.chat_requests[-1].messages == first
    expect(page.locator(".graph .node")).to_have_count(2)


@pytest.mark.parametrize("api", ["chat", "messages", "responses"])
def test_edit_question_keeps_the_questions_images(ui, page, upstream, api):
    """Edit question offers the question's text alone and sends the edit with the question's
    image (and PDF) still in it: the composer held "[image]What is in this picture?" and the edit
    went out as text only."""
    cid = f"editimg-{api}-{uuid.uuid4().hex[:6]}"
    node = ask_with_an_image(ui, cid, api)
    first = upstream.chat_requests[-1].messages
    open_conversation(page, ui, cid)
    node_el(page, node).click()
    expect(page.locator(".detail dd.mono")).to_have_text(node)
    page.locator(".detail button", has_text="Edit question").click()
    expect(page.locator(".composer textarea")).to_have_value("What is in this picture?")
    expect(page.locator(".composer .mode")).to_contain_text("kept")
    page.fill(".composer textarea", "What colour is it?")
    asked = len(upstream.chat_requests)
    page.keyboard.press("Control+Enter")
    wait_for(lambda: len(upstream.chat_requests) > asked, what="the edit's request")
    edited = upstream.chat_requests[-1].messages
    assert edited[:-1] == first[:-1]
    assert edited[-1]["content"] == [part if part["type"] != "text" else {"type": "text", "text": "What colour is it?"}
                                     for part in first[-1]["content"]]
    expect(page.locator(".graph .node")).to_have_count(2)


def test_an_odd_stored_shape_does_not_keep_a_conversation_from_opening(ui, page, upstream):
    """An upstream's answer whose tool_calls is an object is stored as it came; the conversation
    still opens, its text drawn (the page threw on every load before; the `page` fixture fails
    on any script error)."""
    cid = f"odd-{uuid.uuid4().hex[:8]}"
    upstream.enqueue(Reply(content="hello there", extra_message={"tool_calls": {"0": {"id": "x"}},
                                                                 "reasoning_content": 7}))
    say(ui.openai(KEY), cid, user("hi"))
    open_conversation(page, ui, cid)
    expect(page.locator(".messages")).to_contain_text("hello there")


def test_the_branch_arrows_skip_a_question_the_upstream_refused(ui, page, upstream):
    """An edit the upstream refused (400) never held the head: the arrows do not offer it (the
    switch left the head on it, and the next message repeated the refused question)."""
    cid = f"arr-{uuid.uuid4().hex[:8]}"
    client = ui.openai(KEY)
    _, h1 = say(client, cid, user("first question"))
    _, h2 = say(client, cid, user("first, again"), parent="root")
    upstream.enqueue(Reply(kind="error", status=400, error={"message": "bad request", "type": "invalid_request_error",
                                                          "param": None, "code": None}))
    with pytest.raises(openai.BadRequestError):
        say(client, cid, user("edited question"), parent="root")
    open_conversation(page, ui, cid)
    arrows = page.locator(".messages .arrows")
    expect(arrows.locator(".position")).to_have_text("2/2")  # (two roots hold answers; the refused one is left out)
    arrows.get_by_role("button", name="previous branch").click()
    wait_for(lambda: head_of(ui, cid) == h1["x-node-id"], what="the head on the first root")
