"""The summariser: turns the older part of a path into one summary text held to a token budget,
by upstream calls of the configured summariser model (a transcript too long for one request is
summarised in chunks first; a summary over budget is summarised again, then cut).

What it is given is bounded: a message whose text is longer than one summariser request can carry
(``room``: 90 % of the input limit less the prompt) is cut to that much -- its beginning (two
thirds) and its end kept, the middle replaced by a marker saying how many characters were left
out (``clip``). So a 30 MB message costs one request of the summariser's size, never a 30 MB
request (which the summariser would refuse, leaving the conversation uncompactable) nor a 30 MB
transcript in memory."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from storage import uuid7

from ..dialects import crossing, usage_count
from ..dialects.chat import NotACompletion
from ..errors import UpstreamFailure
from ..secrets import Masker, redact
from ..tokens import TokenCounter, off_loop
from ..upstream import UpstreamClient

__all__ = ["SUMMARY_PREFIX", "Summariser", "Summary", "clip", "is_summary", "render_transcript", "summariser_messages"]

SUMMARY_PREFIX = (
    "Summary of the earlier part of this conversation (older messages were compacted into it; "
    "the most recent messages follow verbatim):\n\n"
)

_SYSTEM = (
    "You compress the earlier part of a conversation between a user and an AI assistant into a "
    "summary that replaces it in the assistant's context. The most recent messages are kept "
    "verbatim and are not shown to you. Keep everything a later answer may need: facts, figures "
    "and numbers exactly as given, names and identifiers, decisions made and why, the user's "
    "goals, constraints and preferences, open tasks and unanswered questions, and the results of "
    "tool calls that still matter (with their key values). Drop greetings and repetition. Write "
    "compact notes in the language of the conversation. Stay under {budget} tokens."
)
_SHORTEN = (
    "This summary is about {tokens} tokens; the limit is {budget}. Rewrite it shorter, keeping "
    "facts, figures, names, decisions and open tasks:\n\n{summary}"
)


def _role(item: Any) -> Any:
    return item.get("role") if isinstance(item, dict) else None


def is_summary(item: Any) -> bool:
    """Is this item a summary message of an earlier compaction?"""
    return _role(item) == "user" and isinstance(item.get("content"), str) and item["content"].startswith(SUMMARY_PREFIX)


def _add_usage(total: dict[str, Any], usage: dict[str, Any]) -> None:
    """``usage`` (one summariser call's) added into ``total``: its counts, and those of its details
    (the cached prompt tokens, the reasoning ones), as the upstream named them."""
    for key, value in usage.items():
        if isinstance(value, dict):
            into = total.setdefault(key, {})
            if isinstance(into, dict):
                _add_usage(into, value)
        elif usage_count(value) and isinstance(total.get(key, 0), int):
            total[key] = total.get(key, 0) + value


_FILES = ("file", "input_file")


def _file_name(part: dict[str, Any]) -> str:
    file = part.get("file") if part.get("type") == "file" and isinstance(part.get("file"), dict) else part
    name = file.get("filename") or file.get("file_id") or file.get("file_url")
    return name if isinstance(name, str) else "attached"


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict):
                if isinstance(part.get("text"), str):
                    parts.append(part["text"])
                elif part.get("type") in ("image_url", "input_image"):
                    parts.append("[image]")
                elif part.get("type") in _FILES:  # (named: its base64 is nothing a summary can read)
                    parts.append(f"[file {_file_name(part)}]")
                elif part.get("type") == "input_audio":  # (nor an audio clip's)
                    parts.append("[audio]")
                else:
                    parts.append(msgspec.json.encode(part).decode())
        return "\n".join(parts)
    return "" if content is None else msgspec.json.encode(content).decode()


_CLIP_MARKER = "\n\n[... {n} characters of this message left out for the summary ...]\n\n"


def _clip_text(text: str, limit: int, tokens: TokenCounter) -> str:
    if 4 * len(text) <= limit:  # (the bound: nothing to count)
        return text
    n = tokens.text(text)
    if n <= limit:
        return text
    keep = max(0, int(len(text) * limit / n * 0.9) - 100)  # (a margin for the estimate and the marker)
    head = keep * 2 // 3
    tail = keep - head
    return text[:head] + _CLIP_MARKER.format(n=len(text) - keep) + (text[len(text) - tail:] if tail else "")


def clip(item: Any, limit: int, tokens: TokenCounter) -> Any:
    """``item`` with each of its texts (content, text parts, other parts' JSON, tool call
    arguments) cut to about ``limit`` tokens; the item itself when nothing needed cutting."""
    if not isinstance(item, dict):
        return item
    out = item
    content = item.get("content")
    if isinstance(content, str):
        cut = _clip_text(content, limit, tokens)
        if cut is not content:
            out = {**out, "content": cut}
    elif isinstance(content, list):
        parts, changed = [], False
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                cut = _clip_text(part["text"], limit, tokens)
                if cut is not part["text"]:
                    part, changed = {**part, "text": cut}, True
            elif isinstance(part, dict) and part.get("type") not in ("image_url", "input_image", *_FILES):
                raw = _text([part])
                cut = _clip_text(raw, limit, tokens)
                if cut is not raw:
                    part, changed = {"type": "text", "text": cut}, True
            parts.append(part)
        if changed:
            out = {**out, "content": parts}
    calls = item.get("tool_calls")
    if isinstance(calls, list):
        new_calls, changed = [], False
        for call in calls:
            fn = call.get("function") if isinstance(call, dict) else None
            args = fn.get("arguments") if isinstance(fn, dict) else None
            if isinstance(args, str):
                cut = _clip_text(args, limit, tokens)
                if cut is not args:
                    call, changed = {**call, "function": {**fn, "arguments": cut}}, True
            new_calls.append(call)
        if changed:
            out = {**out, "tool_calls": new_calls}
    if isinstance(item.get("refusal"), str):
        cut = _clip_text(item["refusal"], limit, tokens)
        if cut is not item["refusal"]:
            out = {**out, "refusal": cut}
    return out


def render_transcript(items: Sequence[dict[str, Any]]) -> str:
    """The items as a plain-text transcript for the summariser (any provider reads it)."""
    lines = []
    for item in items:
        role = _role(item) or "item"
        if role == "tool":
            lines.append(f"[tool result {item.get('tool_call_id', '')}]\n{_text(item.get('content'))}")
            continue
        text = _text(item.get("content"))
        if text:
            lines.append(f"[{role}]\n{text}")
        for call in item.get("tool_calls") or ():
            fn = call.get("function") or {}
            lines.append(f"[{role} calls tool {fn.get('name')} ({call.get('id')})]\n{fn.get('arguments', '')}")
        if item.get("refusal"):
            lines.append(f"[{role} refused]\n{item['refusal']}")
    return "\n\n".join(lines)


def summariser_messages(transcript: str, budget: int) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": _SYSTEM.format(budget=budget)},
        {"role": "user", "content": f"The conversation so far:\n\n{transcript}"},
    ]


@dataclass
class Summary:
    text: str
    tokens: int
    calls: int  # summariser calls it took
    usage: dict[str, int] = field(default_factory=dict)  # summed over those calls
    requests: list[bytes] = field(default_factory=list)  # their request bodies, in order


class Summariser:
    def __init__(self, upstream: UpstreamClient, tokens: TokenCounter) -> None:
        self.upstream = upstream
        self.tokens = tokens

    def provider(self, model: str) -> str:
        return self.upstream.route(model).name

    async def summarise(self, older: Sequence[dict[str, Any]], *, model: str, client_key: str | None,
                        budget: int, input_limit: int) -> Summary:
        """A summary of ``older`` of at most ``budget`` tokens. Raises ``UpstreamFailure``."""
        out = Summary("", 0, 0)
        # what one summariser request may carry: its input limit less the prompt and a margin for
        # estimate error (the summary itself counts against the model's reserved output)
        room = max(1000, int(input_limit * 0.9) - 300)
        # no message larger than one request: cut (see the module's docstring)
        older = await asyncio.to_thread(lambda: [clip(item, room, self.tokens) for item in older])  # (compaction is rare)
        transcript = render_transcript(older)
        if await off_loop(self.tokens.text, transcript, chars=len(transcript)) > room:
            # too long for one request: summarise it in chunks, then the summaries together
            chunks = await off_loop(self._chunks, older, room, chars=len(transcript))
            parts = [await self._call(summariser_messages(render_transcript(chunk), budget), model, client_key, out)
                     for chunk in chunks]
            transcript = "\n\n".join(f"[summary of part {i + 1}]\n{p}" for i, p in enumerate(parts))
        text = await self._call(summariser_messages(transcript, budget), model, client_key, out)
        tokens = self.tokens.text(text)
        if tokens > budget:
            shorten = [{"role": "user", "content": _SHORTEN.format(tokens=tokens, budget=budget, summary=text)}]
            text = await self._call(shorten, model, client_key, out)
            tokens = self.tokens.text(text)
        if tokens > budget:
            text = self._cut(text, budget)
            tokens = self.tokens.text(text)
        out.text, out.tokens = text, tokens
        return out

    def _chunks(self, items: Sequence[dict[str, Any]], room: int) -> list[list[dict[str, Any]]]:
        chunks: list[list[dict[str, Any]]] = []
        current: list[dict[str, Any]] = []
        size = 0
        for item in items:
            n = self.tokens.message(item)
            if current and size + n > room:
                chunks.append(current)
                current, size = [], 0
            current.append(item)
            size += n
        chunks.append(current)
        return chunks

    async def _call(self, messages: list[dict[str, Any]], model: str, client_key: str | None, out: Summary) -> str:
        """One summariser call; its usage and request body are added to ``out``."""
        upstream = self.upstream.route(model)
        way = crossing("chat", upstream.api)  # a chat request, to an upstream of any API
        endpoint = way.upstream.endpoint
        payload = way.upstream.request_body(way.fields({"model": model, "temperature": 0}), messages, upstream.name,
                                            stream=False)
        out.requests.append(payload)
        out.calls += 1
        headers = self.upstream.request_headers(upstream, (), client_key, own_body=True)
        request = self.upstream.build("POST", upstream, endpoint, headers=headers, content=payload)
        response, content = await self.upstream.fetch(request)
        if response.status_code != 200:
            raise UpstreamFailure(f"the summariser answered HTTP {response.status_code}")
        # the credential this request carried (the operator's key, or the client's), echoed in the
        # answer: masked, as in every answer -- a summary is stored, shown and sent on every later turn
        secrets = (upstream.api_key, client_key)
        try:
            answer = way.exchange(node_id=uuid7(), params={}, provider=upstream.name).answer(Masker(secrets).bytes(content))
            message, usage = answer.messages[0], answer.usage
        except NotACompletion as exc:
            raise UpstreamFailure(f"the summariser's answer is not a completion ({redact(str(exc), secrets)})") from None
        text = message.get("content")
        if not isinstance(text, str) or not text.strip():
            raise UpstreamFailure("the summariser returned no text")
        _add_usage(out.usage, usage or {})
        return text.strip()

    def _cut(self, text: str, budget: int) -> str:
        """Cut ``text`` to at most ``budget`` tokens (binary search on characters)."""
        marker = " [...]"
        lo, hi = 0, len(text)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.tokens.text(text[:mid] + marker) <= budget:
                lo = mid
            else:
                hi = mid - 1
        return text[:lo] + marker
