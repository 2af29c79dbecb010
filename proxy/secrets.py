"""Credentials never travel back: whatever key a client sent -- or the proxy added -- is masked
wherever an upstream echoes it (an error body, a stream's error event, a stored node, a log line).
Anything shaped like a provider's API key is masked too, whoever it belongs to."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Any, AnyStr

__all__ = ["MASK", "BytesMasker", "Masker", "TextMasker", "mask_headers", "redact", "redact_bytes"]

MASK = "[redacted]"

# API keys as providers spell them (OpenAI sk-/sk-proj-, Anthropic sk-ant-, Stripe-like pk-/rk-,
# and bearer tokens of OpenAI-compatible servers).
_KEY_LIKE = re.compile(r"\b(sk|pk|rk|ak|key)-[A-Za-z0-9_\-]{12,}")


def redact(text: str, secrets: Iterable[str | None] = ()) -> str:
    """``text`` with the given secrets (as they stand, or escaped in a JSON string) and anything
    shaped like an API key masked."""
    for secret in _longest_first(secrets):
        text = _json_form(secret, str).sub(text)
    return _KEY_LIKE.sub(lambda m: f"{m.group(1)}-{MASK}", text)


def redact_bytes(body: bytes, secrets: Iterable[str | None] = ()) -> bytes:
    text = body.decode("utf-8", "replace")
    clean = redact(text, secrets)
    return body if clean == text else clean.encode()


def _longest_first(secrets: Iterable[str | None]) -> list[str]:
    """The credentials worth masking (six characters or more), once each, the longest first: a
    key that begins another is masked only where the longer one is not."""
    return sorted({s for s in secrets if s and len(s) >= 6}, key=len, reverse=True)


# The escapes a JSON writer may use for a character (besides \uXXXX, which any character may take).
_SHORT_ESCAPES = {'"': '\\"', "\\": "\\\\", "/": "\\/", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r",
                  "\t": "\\t"}


def _u_escape(c: str) -> str:
    """``c`` as a JSON \\u escape, in lower-case hex (a pair of them beyond U+FFFF)."""
    code = ord(c)
    if code > 0xFFFF:
        code -= 0x10000
        return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"
    return f"\\u{code:04x}"


def _hex_any_case(escape: str) -> str:
    return "".join(f"[{ch}{ch.upper()}]" if ch in "abcdef" else re.escape(ch) for ch in escape)


class _JsonForm:
    """One credential as an upstream may write it in JSON: each of its characters but ASCII letters
    and digits as itself or escaped -- ``\\/``, ``\\u002f``, ``\\u002B``, as JSON writers differ in
    what they escape (PHP the solidus, .NET ``+``, Gson ``=``, Python anything beyond ASCII); the
    parser would decode any of them back into the credential. ``units``: what follows in turn, each
    as its possible spellings (a run of letters and digits: itself only). Found by its longest run
    of letters and digits first (``anchor``), which every spelling holds: a body without it costs
    one substring search, as the bare credential would -- and its pattern is compiled only once a
    body holds that run (compiling costs ~0.1 ms: a process serving many clients' keys, in
    passthrough, would pay it for every call its cache of forms misses)."""

    __slots__ = ("_pattern", "_rx", "anchor", "firsts", "literal", "longest", "units")

    def __init__(self, secret: str, kind: type) -> None:
        units: list[list[tuple[str, bool]]] = []
        run = ""
        for c in secret:
            if c.isascii() and c.isalnum():
                run += c
                continue
            if run:
                units.append([(run, False)])
                run = ""
            spellings = [(c, False)] + ([(_SHORT_ESCAPES[c], False)] if c in _SHORT_ESCAPES else [])
            units.append([*spellings, (_u_escape(c), True)])  # (True: its hex in either case)
        if run:
            units.append([(run, False)])
        conv: Any = str if kind is str else (lambda text: text.encode())
        self.literal = conv(secret)
        self.units = tuple(tuple((conv(a), fold) for a, fold in unit) for unit in units)
        self.longest = sum(max(len(a) for a, _ in unit) for unit in self.units)
        self.firsts = {a[:1] for a, _ in self.units[0]}
        self._rx: Any = None
        if all(len(unit) == 1 for unit in units):  # letters and digits only: as it is, or not at all
            self._pattern, self.anchor = None, self.literal
            return
        self.anchor = conv(max((unit[0][0] for unit in units if len(unit) == 1), key=len, default=""))
        self._pattern = conv("".join(
            re.escape(unit[0][0]) if len(unit) == 1 else
            "(?:" + "|".join(_hex_any_case(a) if fold else re.escape(a)
                             for a, fold in sorted(unit, key=lambda u: len(u[0]), reverse=True)) + ")"
            for unit in units))

    @property
    def rx(self) -> Any:
        """The pattern of every spelling (None: letters and digits only -- the credential itself)."""
        if self._rx is None and self._pattern is not None:
            self._rx = re.compile(self._pattern)
        return self._rx

    def sub(self, data: AnyStr) -> AnyStr:
        """``data`` with every spelling of the credential masked."""
        if self.anchor not in data:
            return data
        mask: Any = MASK if isinstance(data, str) else _MASK_BYTES
        if self.rx is None:
            return data.replace(self.literal, mask)  # type: ignore[arg-type]
        return self.rx.sub(mask, data)  # type: ignore[arg-type]

    def crossing(self, data: bytes, cut: int) -> int:
        """Where a spelling of the credential begins that ``cut`` would cut, or -1."""
        start = max(0, cut - self.longest + 1)
        if self.anchor not in data[start:cut + self.longest]:  # (every spelling holds it)
            return -1
        if self.rx is None:
            i = data.find(self.literal, start)
            return i if -1 < i < cut < i + len(self.literal) else -1
        for m in self.rx.finditer(data, start):
            if m.start() >= cut:
                break
            if m.end() > cut:
                return m.start()
        return -1

    def prefix_at_end(self, data: bytes) -> int:
        """How much of the end of ``data`` begins a spelling of the credential (the longest such end)."""
        end = len(data)
        lo = max(0, end - self.longest + 1)
        starts = []
        for first in self.firsts:
            i = data.find(first, lo)
            while i != -1:
                starts.append(i)
                i = data.find(first, i + 1)
        for i in sorted(starts):
            if self._begins(data[i:]):
                return end - i
        return 0

    def _begins(self, tail: bytes) -> bool:
        """Is ``tail`` the beginning of a spelling of the credential (or one whole)?"""
        units, n = self.units, len(tail)
        todo, seen = [(0, 0)], set()
        while todo:
            u, at = todo.pop()
            for spelling, fold in units[u]:
                piece = tail[at:at + len(spelling)]
                if not spelling.startswith(piece.lower() if fold else piece):
                    continue
                if at + len(spelling) >= n:
                    return True
                if u + 1 < len(units) and (u + 1, at + len(spelling)) not in seen:
                    seen.add((u + 1, at + len(spelling)))
                    todo.append((u + 1, at + len(spelling)))
        return False


@lru_cache(maxsize=256)
def _json_form(secret: str, kind: type) -> _JsonForm:
    return _JsonForm(secret, kind)


def mask_headers(headers: list[tuple[str, str]], secrets: Iterable[str | None]) -> list[tuple[str, str]]:
    """Response headers with the given credentials masked in their values (an upstream that echoes
    the Authorization it got, in a header of its own or a WWW-Authenticate)."""
    keys = _longest_first(secrets)
    if not keys or not any(key in value for _, value in headers for key in keys):
        return headers
    out = []
    for name, value in headers:
        for key in keys:
            if key in value:
                value = value.replace(key, MASK)
        out.append((name, value))
    return out


class Masker:
    """The credentials of one call masked in what its upstream answered with success -- the body
    the client gets and the answer stored. Only the exact credentials: an answer that merely
    mentions something shaped like a key (a model writing example code) is the model's to give.
    A credential is masked as it stands and however a JSON writer escaped it (``_JsonForm``)."""

    __slots__ = ("_forms",)

    def __init__(self, secrets: Iterable[str | None]) -> None:
        self._forms = tuple(_json_form(secret, bytes) for secret in _longest_first(secrets))

    def __bool__(self) -> bool:
        return bool(self._forms)

    def bytes(self, data: bytes) -> bytes:
        for form in self._forms:
            data = form.sub(data)
        return data


_MASK_BYTES = MASK.encode()


class BytesMasker:
    """``Masker`` over a body that arrives in chunks (a pass-through answer): what may be the
    start of a credential at the end of a chunk is held back until the next chunk says whether it
    is one; ``flush`` gives out what is held when the body ends. Nothing is held back unless a
    chunk ends in the first bytes of a credential (an SSE event ends in a blank line), so an
    answer goes out as it comes."""

    __slots__ = ("_held", "_masker")

    def __init__(self, secrets: Iterable[str | None]) -> None:
        self._masker = Masker(secrets)
        self._held = b""

    def __bool__(self) -> bool:
        return bool(self._masker)

    def feed(self, chunk: bytes) -> bytes:
        data = self._held + chunk if self._held else chunk
        cut = _cut_forms(data, self._masker._forms)
        self._held = data[cut:]
        return self._masker.bytes(data[:cut])

    def flush(self) -> bytes:
        held, self._held = self._held, b""
        return self._masker.bytes(held)


def _cut_forms(data: bytes, forms: Sequence[_JsonForm]) -> int:
    """``_cut`` over credentials in any of their JSON spellings."""
    cut = len(data) - max((form.prefix_at_end(data) for form in forms), default=0)
    moved = True
    while moved:
        moved = False
        for form in forms:
            i = form.crossing(data, cut)
            if i != -1:
                cut, moved = i, True
    return cut


def _cut(data: AnyStr, secrets: Sequence[AnyStr]) -> int:
    """Where ``data`` (what was held back, and what came) can be cut so that what is before the
    cut goes out masked as masking the whole text would mask it: before the longest end of it
    that begins a credential, and before any credential that would cross the cut (one credential
    may begin or hold another: the held part stays raw until the next piece says)."""
    cut = len(data) - _prefix_at_end(data, secrets)
    moved = True
    while moved:
        moved = False
        for secret in secrets:
            i = data.find(secret, max(0, cut - len(secret) + 1))
            if -1 < i < cut < i + len(secret):
                cut, moved = i, True
    return cut


def _prefix_at_end(data: AnyStr, secrets: Sequence[AnyStr]) -> int:
    """How much of the end of ``data`` begins one of ``secrets`` (the longest such end)."""
    best = 0
    end = len(data)
    for secret in secrets:
        first = secret[:1]
        i = data.find(first, max(0, end - len(secret) + 1))
        while i != -1 and end - i > best:
            if secret.startswith(data[i:]):
                best = end - i
                break
            i = data.find(first, i + 1)
    return best


class TextMasker:
    """Credentials masked in text that arrives in pieces (a stream's deltas): what may be the
    start of a credential is held back until the next piece says whether it is one -- then the
    whole credential is masked -- and given out otherwise; ``flush`` gives out what is held at
    the end of the text. Each ``key`` is one text (a choice's content, a tool call's arguments).
    What the client sees is the text as written, with every credential masked, however the
    upstream cut it."""

    __slots__ = ("_held", "_secrets")

    def __init__(self, secrets: Iterable[str | None]) -> None:
        self._secrets = tuple(_longest_first(secrets))
        self._held: dict[Any, str] = {}

    def __bool__(self) -> bool:
        return bool(self._secrets)

    @property
    def holding(self) -> bool:
        return bool(self._held)

    def feed(self, key: Any, piece: str) -> str:
        text = self._held.pop(key, "") + piece
        cut = _cut(text, self._secrets)
        if cut < len(text):
            self._held[key] = text[cut:]
            text = text[:cut]
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, MASK)
        return text

    def flush(self, key: Any) -> str:
        text = self._held.pop(key, "")
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, MASK)
        return text

    def held(self) -> list[Any]:
        """The texts something is held back of."""
        return list(self._held)

