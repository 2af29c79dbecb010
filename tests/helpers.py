"""Helpers every test module uses: message builders and one chat call through the openai SDK."""

from __future__ import annotations

from typing import Any

MODEL = "gpt-4o-mini"


def user(text: Any) -> dict[str, Any]:
    return {"role": "user", "content": text}


def system(text: str) -> dict[str, Any]:
    return {"role": "system", "content": text}


def assistant(text: str | None, **kw: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": text, **kw}


def tool(id_: str, text: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": id_, "content": text}


def tool_call(id_: str, name: str = "run_sql", args: str = '{"sql": "select 1"}') -> dict[str, Any]:
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": args}}


def say(client: Any, cid: str | None, *messages: dict[str, Any], parent: str | None = None, kind: str | None = None,
        headers: dict[str, str] | None = None, model: str = MODEL, **kw: Any) -> tuple[Any, Any]:
    """One chat call in conversation ``cid`` (None: the base URL names it, or none); returns
    (the parsed completion -- or stream --, the response headers)."""
    extra = dict(headers or {})
    if cid is not None:
        extra["X-Conversation-Id"] = cid
    if parent is not None:
        extra["X-Parent-Node-Id"] = parent
    if kind is not None:
        extra["X-Node-Kind"] = kind
    raw = client.chat.completions.with_raw_response.create(model=model, messages=list(messages), extra_headers=extra, **kw)
    return raw.parse(), raw.headers
