"""JSON holding a lone UTF-16 surrogate escape (``"\\ud83d"``: half an emoji), docs/behaviour.md#limits-and-hostile-peers.

Valid by JSON's grammar, taken by Python's ``json`` and JavaScript's ``JSON.parse`` (the SDKs) --
and written by ``JSON.stringify`` for a string cut mid-emoji, or streamed by a server that slices
its text in UTF-16 units -- but refused by msgspec's decoder; and a string holding such a half
can be neither written as UTF-8 (msgspec's encoder refuses it) nor stored (PostgreSQL cannot).

msgspec stays the fast path: only JSON it refused, and only when it holds a surrogate escape, is
read again by the standard library. A whole document (``loads``) comes back valid -- a lone
surrogate replaced by U+FFFD, nothing being left to complete it; a stream's event (``loads_piece``)
keeps its halves, so an emoji cut across two deltas is whole again in the answer assembled from
them (``mend``, once the stream ended: every streamed answer is, a walk of a few microseconds).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any

import msgspec

from storage.walk import rebuilt

__all__ = ["encode", "loads", "loads_piece", "mend"]

_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode
# \ud800 to \udfff (a surrogate, lone or one of a pair) as an escape -- not the text "\\ud83d" (an
# escaped backslash before "ud83d": code, a path), which is no surrogate and needs no second reading
_ESCAPE = re.compile(rb"(?<!\\)(?:\\\\)*\\u[dD][89a-fA-F]")
_TEXT_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u[dD][89a-fA-F]")


def _refuse(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # (json.loads takes NaN and Infinity; msgspec does not)


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # (json.loads reads 1e999 as inf; msgspec refuses it as out of range)
        raise ValueError(f"{text} is out of range")
    return value


def _fallback(data: bytes | bytearray | memoryview | str, exc: Exception) -> Any:
    """``data``, which msgspec refused with ``exc``, read by the standard library -- if it holds a
    surrogate, as an escape (or, in a string, as itself); else ``exc`` raised, as it would have been."""
    if isinstance(data, str):
        if not (isinstance(exc, UnicodeEncodeError) or _TEXT_ESCAPE.search(data)):
            raise exc
        text = data
    else:
        raw = bytes(data)
        if not _ESCAPE.search(raw):
            raise exc
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise exc from None
    try:
        return json.loads(text, parse_constant=_refuse, parse_float=_finite)
    except ValueError:  # (broken otherwise too: msgspec's word stands)
        raise (exc if isinstance(exc, msgspec.DecodeError) else msgspec.DecodeError("JSON is malformed")) from None


def loads(data: bytes | bytearray | memoryview | str, decoder: Callable[[Any], Any] = _decode) -> Any:
    """A whole JSON document (a request, an answer, an error body) decoded by ``decoder`` (an
    untyped one); one holding a lone surrogate escape too, that surrogate read as U+FFFD. Anything
    else the decoder refuses raises its ``msgspec.DecodeError``, as it would have."""
    try:
        return decoder(data)
    except (msgspec.DecodeError, UnicodeEncodeError) as exc:  # (the latter: a string holding a surrogate itself)
        return mend(_fallback(data, exc))


def loads_piece(data: bytes | bytearray | memoryview | str) -> Any:
    """A stream event's JSON data, as ``loads`` -- but a lone surrogate is kept (its other half may
    come with the next event): whoever assembles an answer from such events ``mend``s it once
    whole, and writes the events it makes with ``encode``."""
    try:
        return _decode(data)
    except (msgspec.DecodeError, UnicodeEncodeError) as exc:
        return _fallback(data, exc)


def encode(value: Any, encoder: Callable[[Any], bytes] = _encode) -> bytes:
    """``encoder(value)``; a value holding a lone surrogate (a stream event's, ``loads_piece``) as
    ASCII JSON, the surrogate written as the escape it came as -- what a client reading the
    upstream itself would have got."""
    try:
        return encoder(value)
    except UnicodeEncodeError:
        return json.dumps(value, separators=(",", ":")).encode()


def _mended(text: str) -> str:
    if text.isascii():
        return text
    try:
        text.encode()
    except UnicodeEncodeError:  # (a surrogate: paired up where it can be, else U+FFFD)
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return text


def mend(value: Any) -> Any:
    """``value`` with every string (and key) holding a UTF-16 surrogate made valid: the two halves
    of a character, joined (a pair cut across a stream's deltas and assembled again), become it;
    a lone half becomes U+FFFD. Returns a new value (only strings, lists and dicts are walked)."""
    return rebuilt(value, _mended, keys=True)
