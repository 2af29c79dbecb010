"""Auth mode "none" has no key to stop a web page of another site, open in a browser on the same
machine, from *sending* the proxy requests (a form, a ``no-cors`` fetch: the browser only keeps
the answer from the page). Such a request that changes something is refused, 403
``cross_site_request``; the viewer's own requests, reads, and clients that are not browsers go on
(docs/behaviour.md#auth-and-tenancy). Driven in Debian's chromium, by a page served from another
local port -- another site, as far as the proxy is concerned."""

from __future__ import annotations

import http.server
import json
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from .conftest import make_settings, serve_proxy
from .helpers import say, user
from .test_ui import browser

__all__ = ["browser"]

ATTACK = """<!doctype html><html><body><script>
(async () => {
  const base = %(base)s, cid = %(cid)s, exported = %(exported)s;
  const out = [];
  const go = async (name, url, body) => {
    try {
      const r = await fetch(base + url, {method: "POST", mode: "no-cors", credentials: "omit", body});
      out.push(name + ":" + r.type);
    } catch (e) { out.push(name + ":blocked"); }
  };
  await go("chat", "/c/" + cid + "/v1/chat/completions",
           JSON.stringify({model: "gpt-4o-mini", messages: [{role: "user", content: "INJECTED BY ANOTHER SITE"}]}));
  await go("fork", "/admin/conversations/" + cid + "/fork", JSON.stringify({conversation_id: cid + "-evil"}));
  await go("import", "/admin/conversations/" + cid + "-imp/import", exported);
  document.title = "done " + out.join(" ");
})();
</script></body></html>"""


@pytest.fixture(scope="module")
def open_proxy(database_url: str, upstream_url: str) -> Iterator[Any]:
    with serve_proxy(make_settings(database_url, upstream_url, auth={"mode": "none"})) as proxy:
        yield proxy


@pytest.fixture
def other_site(open_proxy: Any) -> Iterator[Any]:
    """A page on another local port that sends the proxy a chat call, a fork and an import."""
    pages: dict[str, bytes] = {}

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = pages.get(self.path, b"")
            self.send_response(200 if body else 404)
            self.send_header("content-type", "text/html")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    def attack(cid: str, exported: str) -> str:
        pages["/"] = (ATTACK % {"base": json.dumps(open_proxy.url), "cid": json.dumps(cid),
                                "exported": json.dumps(exported)}).encode()
        return f"http://localhost:{server.server_address[1]}/"

    try:
        yield attack
    finally:
        server.shutdown()
        thread.join()


def test_a_page_of_another_site_cannot_change_a_no_key_proxy(open_proxy, other_site, browser, upstream):
    cid = f"xsite-{uuid.uuid4().hex[:8]}"
    client = open_proxy.openai("any")
    say(client, cid, user("my private question"))
    http = httpx.Client(base_url=open_proxy.url)
    exported = http.get(f"/admin/conversations/{cid}/export").text
    before = len(upstream.chat_requests)
    context = browser.new_context()
    try:
        page = context.new_page()
        refused: list[int] = []
        page.on("response", lambda r: refused.append(r.status) if r.request.method == "POST" else None)
        page.goto(other_site(cid, exported))
        page.wait_for_function("document.title.startsWith('done')", timeout=15_000)
    finally:
        context.close()
    assert refused == [403, 403, 403]  # (sent, and refused before anything was read)
    assert len(upstream.chat_requests) == before
    assert http.get(f"/admin/conversations/{cid}-evil").status_code == 404
    assert http.get(f"/admin/conversations/{cid}-imp").status_code == 404
    assert [n["kind"] for n in http.get(f"/admin/conversations/{cid}/tree").json()["data"]] == ["turn"]
    # the next call's context is the owner's alone
    say(client, cid, user("next"))
    assert "INJECTED" not in str(upstream.chat_requests[-1].messages)


def test_the_viewers_own_requests_reads_and_clients_that_are_not_browsers_go_on(open_proxy, browser, upstream):
    cid = f"xsite-own-{uuid.uuid4().hex[:8]}"
    client = open_proxy.openai("any")
    say(client, cid, user("q"))
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(f"{open_proxy.url}/ui/")
        # a change made from a page of the proxy's own origin (what the viewer's buttons send)
        status = page.evaluate("""async ([cid]) => (await fetch("/admin/conversations/" + cid + "/fork", {
            method: "POST", headers: {"content-type": "application/json"},
            body: JSON.stringify({conversation_id: cid + "-fork"})})).status""", [cid])
    finally:
        context.close()
    assert status == 200
    http = httpx.Client(base_url=open_proxy.url)
    assert http.get(f"/admin/conversations/{cid}-fork").status_code == 200
    # an SDK or curl sends neither Sec-Fetch-Site nor Origin: not a browser's, not refused
    say(client, cid, user("again"))
    # a browser too old for Sec-Fetch-Site: judged by its Origin against the host it asked for
    host = open_proxy.url.split("//", 1)[1]
    fork = {"conversation_id": f"{cid}-fork2"}
    assert http.post(f"/admin/conversations/{cid}/fork", json=fork,
                     headers={"origin": "http://localhost:1"}).status_code == 403
    assert http.post(f"/admin/conversations/{cid}/fork", json=fork, headers={"origin": "null"}).status_code == 403
    assert http.post(f"/admin/conversations/{cid}/fork", json=fork,
                     headers={"origin": f"http://{host}"}).status_code == 200
    # a default port written on one side only names the same place (a reverse proxy may keep it in Host)
    fork = {"conversation_id": f"{cid}-fork3"}
    assert http.post(f"/admin/conversations/{cid}/fork", json=fork,
                     headers={"origin": "http://localhost", "host": "localhost:80"}).status_code == 200
    assert http.post(f"/admin/conversations/{cid}/fork", json={"conversation_id": f"{cid}-fork4"},
                     headers={"origin": "http://localhost:8080", "host": "localhost:80"}).status_code == 403
    refused = http.post(f"/c/{cid}/v1/chat/completions", json={"model": "m", "messages": [user("x")]},
                        headers={"sec-fetch-site": "same-site"})
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "cross_site_request"
    # reads stay reads: a page of another site cannot see their answers anyway
    assert http.get(f"/admin/conversations/{cid}", headers={"sec-fetch-site": "cross-site"}).status_code == 200
