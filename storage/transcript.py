"""Transcript hashes: how a conversation so far is recognised by its meaning, in one indexed lookup
(docs/behaviour.md#full-history-mode).

A node's **transcript** is what a client that resends its history would send to continue after it:
the non-system items of its path root first -- ``sent``, then ``received`` when the node succeeded
-- read through compaction nodes as the conversation they replaced. Its hash is a chain over the
messages' *canonical forms*:

    h_0 = 32 zero bytes            h_i = sha256(h_{i-1} || sha256(canonical(message_i)))

Every node stores ``chain`` (the hash of its transcript) and the same fold is computed over a
client's messages, so "the deepest node whose transcript is a prefix of what the client sent" is
``chain = ANY(h_1..h_m)`` with the largest i. The fold is done in SQL too (``bp_fold``), from the
per-message digests this module computes.

Canonical form (what compares, and what does not):
- system/developer messages take no part (``None``);
- ``role`` compares; ``content``: a string equals a list of text parts with the same text joined;
  leading and trailing whitespace of a text does not count (of the string, of the joined parts, of
  each text part beside other parts: apps that restore a session re-add spaces and blank lines);
  null, ``""``, whitespace only and absent are equal; a ``thinking`` or ``refusal`` part takes no
  part (as the ``refusal`` field does not); other parts compare by their JSON, without
  a ``cache_control`` marker (clients move theirs to the newest message each call);
- ``tool_calls`` by id, function name and arguments as parsed JSON (key order, whitespace and a
  whole number's ``.0`` do not matter, nor a key whose value is ``false`` or ``null``, which a
  client filling in its tool's defaults adds; empty or null arguments are ``{}``, as clients that
  parse them send them back for a tool without parameters; arguments that are not JSON compare
  as strings); a missing ``type`` is ``function``;
  the legacy ``function_call`` the same way; ``tool`` messages by ``tool_call_id`` and content;
- ``name`` compares (an empty one is none); everything else -- null fields, ``refusal``, ``annotations``, ``audio``,
  reasoning fields, unknown extras -- is ignored (clients drop or add them).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any, NamedTuple

import msgspec

__all__ = [
    "EMPTY",
    "SYSTEM_ROLES",
    "HistoryKeys",
    "KnownHistories",
    "canonical",
    "chain",
    "digest",
    "digests",
    "fold",
    "history_keys",
    "is_system",
    "prefix_hashes",
    "system_hash",
    "tail",
]

EMPTY = bytes(32)  # the hash of an empty transcript
SYSTEM_ROLES = frozenset({"system", "developer"})
_TEXT_PARTS = frozenset({"text", "input_text", "output_text"})
_NO_ARGUMENTS = ["json", {}]

_encode = msgspec.json.Encoder(order="sorted").encode
_sha256 = hashlib.sha256
_decode = msgspec.json.Decoder().decode


def _system_role(role: Any) -> bool:
    return type(role) is str and role in SYSTEM_ROLES  # (a client's role may be anything: a list too)


def _text_part(part: Any) -> bool:
    if not isinstance(part, dict):
        return False
    kind = part.get("type", "text")
    return type(kind) is str and kind in _TEXT_PARTS and isinstance(part.get("text"), str)


def _thinking_part(part: Any) -> bool:
    """A part matching ignores: reasoning (Mistral's reasoning models answer with a ``thinking``
    part -- the answer is stored with it as ``reasoning_content``), or a refusal (a client echoing
    an answer's ``refusal`` field as a part of its content: the field takes no part either)."""
    return isinstance(part, dict) and (part.get("type") == "thinking" or part.get("type") == "refusal")


def is_system(item: Any) -> bool:
    return isinstance(item, dict) and _system_role(item.get("role"))


def _comparable(value: Any) -> Any:
    """A parsed JSON value as arguments compare: every whole number one way -- ``20.0`` and ``20``
    are one number in JSON, and a client that parses arguments and writes them again
    (JavaScript's JSON.stringify: the Vercel AI SDK, opencode) sends ``20`` back for a model's
    ``20.0`` -- and a key whose value is ``false`` or ``null`` left out, at any depth: a client
    that parses a call through its tool's schema sends it back with the defaults filled in (Claude
    Code resends each Edit with ``replace_all: false``), or drops what is null."""
    if type(value) is float:
        return int(value) if value.is_integer() else value
    if type(value) is list:
        return [_comparable(v) for v in value]
    if type(value) is dict:
        return {k: _comparable(v) for k, v in value.items() if v is not None and v is not False}
    return value


def _json_value(value: Any) -> Any:
    """Arguments as parsed JSON when they are JSON (whole numbers one way), else the string itself;
    none (``""``, null) is ``{}`` -- LangChain sends a model's ``""`` back as ``"{}"``."""
    if value is None or value == "":
        return _NO_ARGUMENTS
    if isinstance(value, str):
        try:
            return ["json", _comparable(_decode(value))]
        except (msgspec.DecodeError, RecursionError):
            return ["text", value]
    return ["json", _comparable(value)]


def _content(content: Any, *, strip: bool = False) -> Any:
    """The comparable form of a message's content; ``strip``: without the leading and trailing
    whitespace of its texts (matching; the system hash keeps them as they are)."""
    if content is None or content == "":
        return ""
    if isinstance(content, str):
        return content.strip() if strip else content
    if isinstance(content, list):
        if any(_thinking_part(part) for part in content):
            content = [part for part in content if not _thinking_part(part)]
        texts = []
        for part in content:
            if _text_part(part):
                texts.append(part["text"])
            else:
                break
        else:
            text = "".join(texts)
            return text.strip() if strip else text
        return [
            ["text", part["text"].strip() if strip else part["text"]]
            if _text_part(part)
            else ["part", {k: v for k, v in part.items() if k != "cache_control"} if isinstance(part, dict) else part]
            for part in content
        ]
    return ["other", content]


def _call(call: Any) -> Any:
    if not isinstance(call, dict):
        return ["other", call]
    fn = call.get("function") if isinstance(call.get("function"), dict) else {}
    return [call.get("id"), call.get("type") or "function", fn.get("name"), _json_value(fn.get("arguments"))]


def canonical(message: Any) -> Any | None:
    """The comparable meaning of a message; None for system/developer messages."""
    if not isinstance(message, dict):
        return ["other", message]
    role = message.get("role")
    if _system_role(role):
        return None
    out: dict[str, Any] = {"role": role, "content": _content(message.get("content"), strip=True)}
    if message.get("name"):  # ("" is no name: clients drop empty fields, or add them)
        out["name"] = message["name"]
    calls = message.get("tool_calls")
    if calls:
        out["tool_calls"] = [_call(c) for c in calls] if isinstance(calls, list) else ["other", calls]
    fc = message.get("function_call")
    if isinstance(fc, dict):
        out["function_call"] = [fc.get("name"), _json_value(fc.get("arguments"))]
    if message.get("tool_call_id"):
        out["tool_call_id"] = message["tool_call_id"]
    return out


def _plain(message: dict[str, Any]) -> bool:
    """Would ``canonical`` add nothing to the role and content (the fast path of ``digest``)?"""
    return not (message.get("name") or message.get("tool_calls") or message.get("tool_call_id")
                or isinstance(message.get("function_call"), dict))


def digest(message: Any) -> bytes:
    """sha256 of a (non-system) message's canonical form."""
    if type(message) is dict:
        content = message.get("content")
        if type(content) is str and _plain(message):
            # the common case, without building the general form: the same bytes as canonical()
            # ({"content": ..., "role": ...}, keys sorted) -- tests/test_matching.py checks it
            return _sha256(b'{"content":' + _encode(content.strip()) + b',"role":' + _encode(message.get("role")) + b"}").digest()
    return _sha256(_encode(canonical(message))).digest()


def digests(items: Iterable[Any]) -> list[bytes]:
    """The digests of the non-system items, in order."""
    return [digest(i) for i in items if not (type(i) is dict and _system_role(i.get("role")))]


def fold(start: bytes, message_digests: Iterable[bytes]) -> bytes:
    h = start
    for d in message_digests:
        h = hashlib.sha256(h + d).digest()
    return h


def chain(items: Iterable[Any], start: bytes = EMPTY) -> bytes:
    """The transcript hash after ``items`` (system messages skipped), from ``start``."""
    return fold(start, digests(items))


def prefix_hashes(message_digests: Iterable[bytes], start: bytes = EMPTY) -> list[bytes]:
    """h_1..h_m over the digests of the non-system items: h_i is the hash of the first i of them
    (``start``: of a node's transcript followed by them)."""
    out = []
    h = start
    for d in message_digests:
        h = _sha256(h + d).digest()
        out.append(h)
    return out


def tail(items: Sequence[Any], skip: int, *, with_system: bool) -> list[Any]:
    """The items after the first ``skip`` non-system ones, in order; system/developer messages
    kept only when ``with_system`` (the SQL twin: ``bp_tail``)."""
    out = []
    seen = 0
    for item in items:
        if is_system(item):
            if with_system:
                out.append(item)
            continue
        seen += 1
        if seen > skip:
            out.append(item)
    return out


def system_hash(items: Iterable[Any]) -> bytes | None:
    """The hash of the system/developer messages among ``items`` (None when there are none):
    two calls whose system prompts compare equal by role and content have the same hash."""
    system = [[i.get("role"), _content(i.get("content"))] for i in items if is_system(i)]
    return hashlib.sha256(_encode(system)).digest() if system else None


class NodeKeys(msgspec.Struct, frozen=True):
    """What a node is indexed and matched by: its transcript hash, whether that transcript holds an
    answer the proxy stored, and the hash of the system prompt in effect on its path."""

    chain: bytes
    answered: bool
    system_hash: bytes | None
    answer: bytes | None = None  # a turn that succeeded: the digest of the first message it received


def node_keys(nodes: Iterable[dict[str, Any]],
              as_messages: Callable[[dict[str, Any], list[Any]], list[Any]] | None = None) -> dict[Any, NodeKeys]:
    """The keys of stored nodes (dicts with id, parent_id, kind, outcome, sent, received,
    compacted_from), computed from their items -- for a migration or an import, where no parent's
    keys are stored yet. Parents and compaction origins must be among ``nodes``.
    ``as_messages(node, items)`` reads a node's items as chat messages (Responses nodes)."""
    by_id = {n["id"]: n for n in nodes}
    keys: dict[Any, NodeKeys] = {}

    def source(n: dict[str, Any]) -> Any:
        return n.get("compacted_from") if n["kind"] == "compaction" else n.get("parent_id")

    for start in by_id:
        stack = [start]
        while stack:  # iterative: paths can be thousands of nodes long
            n = by_id[stack[-1]]
            up = source(n)
            if up is not None and up not in keys:
                stack.append(up)
                continue
            stack.pop()
            if n["id"] in keys:
                continue
            base = keys.get(up) if up is not None else None
            sent = n.get("sent") or []
            received = n.get("received") or []
            if as_messages is not None:
                sent, received = as_messages(n, sent), as_messages(n, received)
            own_system = system_hash(sent)
            if n["kind"] == "compaction":
                assert base is not None, "a compaction node needs the node it replaced"
                keys[n["id"]] = NodeKeys(base.chain, base.answered, own_system)
                continue
            h = fold(base.chain if base else EMPTY, digests(sent))
            succeeded = n.get("outcome") == "success"
            answer = None
            if succeeded:
                received_digests = digests(received)
                h = fold(h, received_digests)
                answer = received_digests[0] if n["kind"] == "turn" and received_digests else None
            keys[n["id"]] = NodeKeys(h, bool(base and base.answered) or (succeeded and bool(received)),
                                     own_system or (base.system_hash if base else None), answer)
    return keys


class HistoryKeys(NamedTuple):
    """What full-history matching needs of a client's items (one message each: chat):
    ``prefixes`` h_1..h_m (``prefix_hashes``) and ``system``, the indexes of its system/developer
    items, in order."""

    prefixes: list[bytes]
    system: list[int]


def history_keys(items: Sequence[Any], start: int = 0, base: HistoryKeys | None = None) -> HistoryKeys:
    """The keys of ``items``; with ``base``, the keys of ``items[:start]``, only the rest is hashed."""
    prefixes = list(base.prefixes) if base is not None else []
    system = [i for i in base.system if i < start] if base is not None else []
    if base is not None:
        del prefixes[start - len(system):]
    h = prefixes[-1] if prefixes else EMPTY
    for i in range(start, len(items)):
        item = items[i]
        if type(item) is dict and _system_role(item.get("role")):
            system.append(i)
            continue
        h = _sha256(h + digest(item)).digest()
        prefixes.append(h)
    return HistoryKeys(prefixes, system)


class _Seen(NamedTuple):
    raws: list[bytes]
    keys: HistoryKeys
    size: int


REMEMBERED_FROM = 8  # items: a shorter history is not remembered (hashing it anew costs microseconds)
ENTRY_BYTES = 1024  # what an entry holds besides its items: its key, its tuples and lists, its slot
ITEM_BYTES = 140  # per item besides its bytes: its bytes object, its digest and prefix hash, list slots


class KnownHistories:
    """Per conversation, the history a process last saw from a client that resends it, as sent
    (each item's JSON bytes) with its keys: the next call hashes only the items after the longest
    run of byte-equal items at the start (docs/behaviour.md#full-history-mode). The keys are a
    function of the bytes alone -- never of what is stored -- so whatever the key of an entry
    (another conversation's, a stale one), a call gets exactly the keys it would hash itself. At
    most ``max_bytes`` are kept (counted as their bytes and what holds them), the least recently
    used dropped first; histories shorter than ``REMEMBERED_FROM`` items are not kept, nor one
    larger than an eighth of ``max_bytes``."""

    def __init__(self, max_bytes: int = 32 << 20, remember_from: int = REMEMBERED_FROM) -> None:
        self.max_bytes = max_bytes
        self.remember_from = remember_from
        self._seen: OrderedDict[Hashable, _Seen] = OrderedDict()
        self._size = 0
        self.hashed = 0  # items hashed so far (tests: what was hashed again)

    @staticmethod
    def _same(old: list[bytes], raws: list[bytes]) -> int:
        n = min(len(old), len(raws))
        if raws[:n] == old[:n]:  # (the common case: everything seen before still there)
            return n
        same = 0
        while raws[same] == old[same]:
            same += 1
        return same

    def seen(self, key: Hashable, raws: list[bytes]) -> int:
        """How many of ``raws``, from the first, are the items last seen under ``key``: items a call
        sent before, which passed the checks every call's items pass."""
        seen = self._seen.get(key)
        return self._same(seen.raws, raws) if seen is not None else 0

    def keys(self, key: Hashable, raws: list[bytes], items: Sequence[Any]) -> HistoryKeys:
        """The keys of ``items``, which were sent as ``raws`` (one each, in order)."""
        if len(raws) != len(items):
            raise ValueError("one raw item per item")
        seen = self._seen.pop(key, None)
        if seen is not None:
            self._size -= seen.size
            same = self._same(seen.raws, raws)
            keys = history_keys(items, same, seen.keys)
        else:
            same = 0
            keys = history_keys(items)
        self.hashed += len(items) - same
        # (the bytes, each item's keys and list slots, the entry itself -- ~15 % above tracemalloc's
        # count of what it holds; a short history is hashed in microseconds: not worth an entry;
        # one history never takes more than an eighth of the room, so no one caller flushes all)
        size = ENTRY_BYTES + sum(map(len, raws)) + ITEM_BYTES * len(raws)
        if len(raws) >= self.remember_from and size <= self.max_bytes // 8:
            self._seen[key] = _Seen(raws, keys, size)
            self._size += size
            while self._size > self.max_bytes:
                _, dropped = self._seen.popitem(last=False)
                self._size -= dropped.size
        return keys
