"""Messages answers in chat terms, both ways (docs/behaviour.md#the-messages-api): an Anthropic
message as a chat completion and its assistant message, a chat answer as Anthropic's content
blocks, usage and stop reasons. Pure functions; requests: proxy/dialects/messages/translate.py.

    stop_reason  end_turn / stop_sequence / pause_turn -> stop, max_tokens -> length,
                 tool_use -> tool_calls, refusal -> content_filter (and back; tool calls that
                 ended with stop or no reason: tool_use)
    usage        input_tokens (+ cache reads and writes) = prompt_tokens, output_tokens =
                 completion_tokens, cache_read_input_tokens = prompt_tokens_details.cached_tokens
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from .. import CACHE_WRITES, signed, usage_count
from ..chat.completion import call_id
from .blocks.from_chat import _input, _parts_to_blocks

__all__ = ["anthropic_usage", "chat_message", "chat_usage", "completion", "content_of", "finish_reason", "message_id",
           "message_object", "read_message", "stop_reason"]

_TO_CHAT_STOP = {"end_turn": "stop", "stop_sequence": "stop", "pause_turn": "stop", "max_tokens": "length",
                 "tool_use": "tool_calls", "refusal": "content_filter", "model_context_window_exceeded": "length"}
_FROM_CHAT_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "function_call": "tool_use",
                   "content_filter": "refusal"}


def message_id(node_id: uuid.UUID) -> str:
    return f"msg_{node_id.hex}"


def chat_usage(usage: Any) -> dict[str, Any] | None:
    """An Anthropic usage object in chat terms: prompt tokens count cache reads and writes, the
    reads are chat's cached tokens, and the writes -- chat has no word for them -- keep Anthropic's
    ``cache_creation_input_tokens`` beside them (as LiteLLM's chat usage does), so the count a
    node stores loses nothing the upstream reported (docs/behaviour.md, "Cached tokens")."""
    if not isinstance(usage, dict):
        return None
    cached = usage_count(usage.get("cache_read_input_tokens"))
    written = usage_count(usage.get("cache_creation_input_tokens"))
    prompt = usage_count(usage.get("input_tokens")) + cached + written
    completion = usage_count(usage.get("output_tokens"))
    out: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    if cached:
        out["prompt_tokens_details"] = {"cached_tokens": cached}
    if written:
        out[CACHE_WRITES] = written
    return out


def anthropic_usage(usage: Any) -> dict[str, Any]:
    """A chat usage object in Anthropic's terms (input tokens exclude the cached ones)."""
    if not isinstance(usage, dict):
        return {"input_tokens": 0, "output_tokens": 0}
    details = usage.get("prompt_tokens_details") if isinstance(usage.get("prompt_tokens_details"), dict) else {}
    cached = usage_count(details.get("cached_tokens"))
    written = usage_count(usage.get(CACHE_WRITES))
    prompt = usage_count(usage.get("prompt_tokens", usage.get("input_tokens")))
    out = {"input_tokens": max(0, prompt - cached - written), "output_tokens": usage_count(usage.get("completion_tokens",
                                                                                              usage.get("output_tokens")))}
    if cached:
        out["cache_read_input_tokens"] = cached
    if written:
        out[CACHE_WRITES] = written
    return out


def stop_reason(finish_reason: Any, calls: bool = False) -> str:
    """A chat finish reason as a Messages answer's stop reason; ``calls``: the answer holds tool
    calls -- then a turn said to end (``stop``, no reason or one chat has no word for; Gemini's
    OpenAI-compatible endpoint finishes its calls with ``stop``) is ``tool_use``, or the client's
    tool runner takes the turn as over and never runs them."""
    stop = _FROM_CHAT_STOP.get(finish_reason, "end_turn") if isinstance(finish_reason, str) else "end_turn"
    return "tool_use" if calls and stop == "end_turn" else stop


def finish_reason(stop: Any) -> str:
    return _TO_CHAT_STOP.get(stop, "stop") if isinstance(stop, str) else "stop"


def content_of(message: dict[str, Any], node_id: uuid.UUID, producer: str | None = None) -> list[dict[str, Any]]:
    """The content blocks of a chat assistant message, the answer of node ``node_id`` (reasoning as
    a thinking block signed by us, ``signed.thinking_signature``: no Anthropic upstream takes it
    back; a tool call without an id given one, ``call_id``)."""
    blocks: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        blocks.append({"type": "thinking", "thinking": reasoning, "signature": signed.thinking_signature(producer)})
    blocks.extend(_parts_to_blocks(message.get("content")))
    if message.get("refusal") and not any(b.get("type") == "text" for b in blocks):
        blocks.append({"type": "text", "text": str(message["refusal"])})
    for i, call in enumerate(message.get("tool_calls") or ()):
        if isinstance(call, dict):
            fn = call.get("function") or {}
            blocks.append({"type": "tool_use", "id": call_id(call, node_id, i), "name": fn.get("name"),
                           "input": _input(fn.get("arguments"))})
    carried = kept_block(message, node_id, producer)
    if carried is not None:
        blocks.append(carried)
    return blocks


def kept_block(message: dict[str, Any], node_id: uuid.UUID, producer: str | None) -> dict[str, Any] | None:
    """The ``redacted_thinking`` block keeping what of a chat answer no other block has a place
    for (a tool call's signature, opaque reasoning: ``signed``), after the others; None when there
    is nothing."""
    carried = signed.blob(message, node_id, producer)
    return None if carried is None else {"type": "redacted_thinking", "data": carried}


def message_object(*, node_id: uuid.UUID, model: Any, content: list[dict[str, Any]], stop: str | None,
                   usage: dict[str, Any], applied_edits: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A Messages answer; ``applied_edits``: the context edits its request asked for, as carried
    out (``context_management``, as Anthropic says them; None: it asked for none)."""
    out = {"id": message_id(node_id), "type": "message", "role": "assistant", "model": model, "content": content,
           "stop_reason": stop, "stop_sequence": None, "usage": usage}
    if applied_edits is not None:
        out["context_management"] = {"applied_edits": applied_edits}
    return out


def read_message(data: Any) -> bool:
    return isinstance(data, dict) and data.get("type") == "message" and isinstance(data.get("content"), list)


_READ = frozenset({"text", "tool_use", "thinking", "redacted_thinking"})  # (blocks a chat message says whole)


def chat_message(content: list[Any], provider: str | None) -> dict[str, Any]:
    """The chat assistant message an Anthropic answer's content stands for (its signed thinking
    kept as ``thinking_blocks``, which go back only to the provider that produced them). An answer
    with blocks a chat message cannot say -- a server tool's call and result (web search, code
    execution, MCP), a compaction -- keeps there every block but its tool uses, in order: Claude
    gets them back whole, in their place among its text (``blocks.from_chat``); another model
    reads the content, where a server tool is a line."""
    from .blocks.to_chat import _assistant

    blocks = [b for b in content if isinstance(b, dict)]
    message = _assistant(blocks)
    if any(type(b.get("type")) is not str or b["type"] not in _READ for b in blocks):
        message["thinking_blocks"] = [b for b in blocks if b.get("type") != "tool_use"]
        return message
    thinking = [b for b in blocks if b.get("type") in ("thinking", "redacted_thinking")]
    if thinking:
        message["thinking_blocks"] = thinking
    return message


def completion(data: dict[str, Any], node_id: uuid.UUID, provider: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the chat completion, the assistant message) for an Anthropic message."""
    message = chat_message(data["content"], provider)
    said = message  # (the client's: its thinking_blocks the signed thinking only, as a stream gives
    # none of the rest -- the other blocks kept there for Claude, text, fetched pages, encrypted
    # search results, are the stored message's, not a chat client's to render as reasoning)
    if "thinking_blocks" in message:
        said = {k: v for k, v in message.items() if k != "thinking_blocks"}
        thinking = [b for b in message["thinking_blocks"] if b.get("type") in ("thinking", "redacted_thinking")]
        if thinking:
            said["thinking_blocks"] = thinking
    body = {"id": f"chatcmpl-{node_id.hex}", "object": "chat.completion", "created": int(time.time()),
            "model": data.get("model"), "choices": [{"index": 0, "message": said,
                                                     "finish_reason": finish_reason(data.get("stop_reason")),
                                                     "logprobs": None}],
            "usage": chat_usage(data.get("usage")) or {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}}
    return body, message
