"""Helpers every test module uses: message builders and one chat call through the openai SDK."""

from __future__ import annotations

import json
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


def responses_answer(output: list[dict[str, Any]], *, status: str = "completed", **extra: Any) -> dict[str, Any]:
    """A Responses upstream's response object holding ``output`` (for ``Reply(kind="raw")``)."""
    return {"id": "resp_upstream", "object": "response", "created_at": 1, "status": status, "model": "native-1",
            "output": output, "usage": {"input_tokens": 5, "output_tokens": 3, "total_tokens": 8}, **extra}


def responses_events(*events: dict[str, Any]) -> bytes:
    """A Responses upstream's event stream: each event (with its ``type``) under its name."""
    return b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)


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


def prefix_extends(previous: bytes, current: bytes, key: str = "messages") -> bool:
    """Whether the upstream request ``current`` continues ``previous`` byte for byte (what a
    provider's prompt cache needs, docs/behaviour.md#context-editing): every other field the same
    bytes, and the list under ``key`` (``messages``; ``input`` for Responses) the previous list's
    bytes followed by more items. Anthropic's ``cache_control`` markers move with each call and do
    not count (``without_markers``)."""
    import msgspec

    before = msgspec.json.decode(previous, type=dict[str, msgspec.Raw])
    after = msgspec.json.decode(current, type=dict[str, msgspec.Raw])
    if before.keys() != after.keys() or any(bytes(before[k]) != bytes(after[k]) for k in before if k != key):
        return False
    old, new = bytes(before.get(key, b"[]")), bytes(after.get(key, b"[]"))
    if old == b"[]":
        return True
    return new.startswith(old[:-1]) and new[len(old) - 1:len(old)] in (b",", b"]")


def unmarked(value: Any) -> Any:
    """``value`` (an Anthropic request's part) without its ``cache_control`` markers (they are
    placed by position from the end, so they move with every call by design)."""
    if isinstance(value, dict):
        return {k: unmarked(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [unmarked(v) for v in value]
    return value


def without_markers(raw: bytes) -> bytes:
    """An Anthropic request's bytes with its ``cache_control`` markers taken out (``unmarked``)."""
    import msgspec

    return msgspec.json.encode(unmarked(msgspec.json.decode(raw)))
