"""The viewer on a Conversations API conversation (docs/viewer.md): its metadata in the toolbar, its
items nodes drawn and labelled as items added without a model call. Chromium, as tests/test_ui.py."""

from __future__ import annotations

import re

from playwright.sync_api import expect

from .helpers import MODEL
from .test_ui import KEY, admin, browser, node_el, open_conversation, page, tenant, ui

__all__ = ["browser", "page", "tenant", "ui"]  # (the viewer's fixtures, shared with tests/test_ui.py)


def test_a_conversations_api_conversation_in_the_viewer(ui, page):
    client = ui.openai(KEY)
    conv = client.conversations.create(items=[{"type": "message", "role": "user", "content": "Remember the code 42."}],
                                       metadata={"topic": "codes"})
    client.responses.create(model=MODEL, conversation=conv.id, input="What is the code?")
    tree = admin(ui).get(f"/admin/conversations/{conv.id}/tree").json()["data"]
    items_node = next(n["id"] for n in tree if n["kind"] == "items")
    open_conversation(page, ui, conv.id)
    expect(page.locator(".toolbar .meta")).to_contain_text("topic: codes")
    expect(page.locator(".graph .node")).to_have_count(2)
    expect(node_el(page, items_node)).to_have_class(re.compile(r"\bitems\b"))
    expect(page.locator(".messages")).to_contain_text("items added (Conversations API, no model call)")
    expect(page.locator(".messages")).to_contain_text("Remember the code 42.")
    expect(page.locator(".messages")).to_contain_text("echo: What is the code?")
