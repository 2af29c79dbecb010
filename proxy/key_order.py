"""The order of the properties of a client's JSON Schemas, kept through storage (``KEY_ORDER``).

A stored call's upstream body is a pure function of what PostgreSQL's ``jsonb`` gives back
(``assembly.build_body``, the Responses and Messages dialects' ``request_body``), and ``jsonb``
keeps no key order: the body's objects are written with their keys sorted. Where a schema lists
its ``properties`` the order means something, though: OpenAI's Structured Outputs write an
answer's keys in the order of the schema's properties (a ``reasoning`` property put before
``answer`` is thought out before the answer is given), and a tool's parameters reach the model in
the order of theirs. So a call's params record, for each ``properties`` object among its fields
(``response_format``, ``text``, ``output_format``, ``tools`` ..., at any depth) whose keys the
client did not send sorted, its path and its keys in the client's order; the body is written
with those objects in that order (``ordered``), every other object sorted as before -- the same
bytes for the call and for ``GET /admin/nodes/{id}/request``. (Paths are the client's dialect's;
a request translated for another API, whose fields are made anew, gets the orders by the names
each ``properties`` object holds -- ``carried``: a schema crosses whole.)"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import msgspec

__all__ = ["BY_NAMES", "KEY_ORDER", "carried", "encode_sorted", "key_order", "ordered", "with_key_order"]

KEY_ORDER = "_bp_key_order"
BY_NAMES = "_bp_key_order_by_names"  # (a translated request's fields: ``carried``)
# Objects deeper than this (keys and list indexes on the way: a schema's level takes two or three)
# keep sorted keys: a schema nests a few levels -- Structured Outputs take ten at most -- and a
# hostile body nested hundreds deep must cost no more than it did before.
MAX_DEPTH = 64

_encode_plain = msgspec.json.Encoder().encode
_encode_sorted = msgspec.json.Encoder(order="sorted").encode
_KEYS = object()  # (in a path tree: the keys of the object there, in the client's order)


def with_key_order(params: dict[str, Any]) -> dict[str, Any]:
    """A call's stored fields with the order of their schemas' properties recorded (the same dict
    when every one is sorted already, or there is none)."""
    order = key_order(params)
    return {**params, KEY_ORDER: order} if order else params


def carried(params: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """A translated request's fields (``fields``, made anew from the call's ``params``) with the
    orders the call recorded, by the names each ``properties`` object holds (``BY_NAMES``): its
    paths are the client's API's, but a schema crosses whole -- a tool's parameters become an
    input_schema, a response format an output format."""
    hints = params.get(KEY_ORDER)
    if not isinstance(hints, list) or not hints:
        return fields
    orders = [h[1] for h in hints if isinstance(h, list) and len(h) == 2 and isinstance(h[1], list)
              and h[1] and all(type(k) is str for k in h[1])]
    return {**fields, BY_NAMES: orders} if orders else fields


def encode_sorted(body: dict[str, Any]) -> bytes:
    """An upstream body's bytes: its objects' keys sorted, but for those its recorded key order
    names (``KEY_ORDER`` by path, ``BY_NAMES`` by the names a ``properties`` object holds: taken
    out of the body)."""
    if KEY_ORDER not in body and BY_NAMES not in body:
        return _encode_sorted(body)
    body = dict(body)
    hints = body.pop(KEY_ORDER, None)
    if hints:
        body = ordered(body, hints)
    orders = body.pop(BY_NAMES, None)
    if orders and isinstance(orders, list):
        table = {frozenset(keys): keys for keys in orders if isinstance(keys, list) and all(type(k) is str for k in keys)}
        body = {k: v if k in _HISTORY else _by_names(v, table, 0) for k, v in body.items()}
    return _encode_sorted(body)


_HISTORY = frozenset({"messages", "input", "system"})  # (a request's history: no schema of its fields)


def _by_names(value: Any, table: dict[frozenset[str], list[str]], depth: int) -> Any:
    """``value`` with every ``properties`` object whose names an order of ``table`` holds written
    in that order (the objects inside it sorted); the same object where there is none."""
    if depth > MAX_DEPTH:
        return value
    if type(value) is list:
        out = [_by_names(v, table, depth + 1) if type(v) is dict or type(v) is list else v for v in value]
        return value if all(a is b for a, b in zip(out, value, strict=True)) else out
    if type(value) is not dict:
        return value
    changed = {}
    for k, v in value.items():
        if type(v) is dict or type(v) is list:
            new = _by_names(v, table, depth + 1)
            if k == "properties" and type(v) is dict and len(v) > 1:
                keys = table.get(frozenset(v))
                if keys is not None:
                    children = new if type(new) is dict else v
                    new = msgspec.Raw(_encode_plain({name: _raw(children[name]) for name in keys}))
            if new is not v:
                changed[k] = new
    return {**value, **changed} if changed else value


def key_order(fields: dict[str, Any]) -> list[list[Any]]:
    """``[path, keys]`` for every ``properties`` object among the request's fields (``fields``:
    all but its ``messages``) whose keys are not in sorted order; ``path`` is the keys and list
    indexes that lead to it. A field is read once per process for each distinct value (a client
    sends the same tools with every call), and written in that order once too: the call's own
    value is remembered until its body is written (``_LIVE``)."""
    hints: list[list[Any]] = []
    for key, value in fields.items():
        if (type(value) is dict or type(value) is list) and not key.startswith("_bp_"):
            try:
                raw = _encode_plain(value)
                if b'"properties"' not in raw:
                    continue
                # (remembered only up to a size: a client's tools, not a hostile 30 MB field,
                # stay in this process)
                field = _field(raw) if len(raw) <= _CACHED_BYTES else _Field(_field_hints(raw))
            except RecursionError:  # (a field nested past what the encoder goes: sorted, as before)
                continue
            if field.hints:
                own = [[[key, *path], list(keys)] for path, keys in field.hints]
                hints.extend(own)
                _LIVE[id(value)] = (value, field, own)
                while len(_LIVE) > _LIVE_KEPT:
                    _LIVE.popitem(last=False)
    return hints


class _Field:
    """A field's value (by its JSON) as ``key_order`` read it: its hints, and once written, its
    bytes in that order."""

    __slots__ = ("hints", "written")

    def __init__(self, hints: tuple[tuple[tuple[Any, ...], tuple[str, ...]], ...]) -> None:
        self.hints = hints
        self.written: msgspec.Raw | None = None


# The values whose hints a call's params hold, by identity, until its body is written: the same
# value is then written from its field's bytes, not anew (a client's 40 tools: ~0.6 ms a call). A
# reference is kept, so no other object can take the id meanwhile; a value read back from the
# database (a replay) is not here and is written the long way -- to the same bytes.
_LIVE: OrderedDict[int, tuple[Any, _Field, list[list[Any]]]] = OrderedDict()  # -> (it, its field, its hints)
_LIVE_KEPT = 64


_CACHED_BYTES = 256 * 1024
_FIELDS: OrderedDict[bytes, _Field] = OrderedDict()  # a field's JSON -> what it holds
_FIELDS_KEPT = 64


def _field(raw: bytes) -> _Field:
    found = _FIELDS.get(raw)
    if found is None:
        found = _FIELDS[raw] = _Field(_field_hints(raw))
        if len(_FIELDS) > _FIELDS_KEPT:
            _FIELDS.popitem(last=False)
    else:
        _FIELDS.move_to_end(raw)
    return found


_NAMED = "named"
_MAPS = frozenset({"$defs", "definitions", "patternProperties", "dependentSchemas"})


def _field_hints(raw: bytes) -> tuple[tuple[tuple[Any, ...], tuple[str, ...]], ...]:
    found: list[tuple[tuple[Any, ...], tuple[str, ...]]] = []

    # what an object is: None (a schema, or any other object), "properties" (a schema's properties,
    # by name), _NAMED (another map of schemas by name: $defs ...). A key of a map is a name, not a
    # keyword: a property, or a definition, may be called "properties".
    def walk(value: Any, path: list[Any], kind: str | None) -> None:
        if len(path) > MAX_DEPTH:
            return
        if type(value) is dict:
            keys = list(value)
            if kind == "properties" and len(keys) > 1 and keys != sorted(keys):
                found.append((tuple(path), tuple(keys)))
            for k, v in value.items():
                if type(v) is dict or type(v) is list:
                    walk(v, [*path, k], None if kind is not None else "properties" if k == "properties"
                         else _NAMED if k in _MAPS else None)
        elif type(value) is list:
            for i, v in enumerate(value):
                if type(v) is dict or type(v) is list:
                    walk(v, [*path, i], None)

    walk(msgspec.json.decode(raw), [], None)
    return tuple(found)


def ordered(body: dict[str, Any], hints: Any) -> dict[str, Any]:
    """``body`` with each object ``hints`` names replaced by its encoding in the recorded key
    order (keys it does not list after them, sorted; the objects inside it sorted): a sorted
    encoder then writes the rest as before. A hint that names nothing there is passed over."""
    tree: dict[Any, Any] = {}
    valid = []
    for hint in hints if isinstance(hints, list) else ():
        if not (isinstance(hint, list) and len(hint) == 2 and isinstance(hint[0], list) and hint[0]
                and isinstance(hint[1], list) and all(type(step) is str or type(step) is int for step in hint[0])):
            continue  # (an import's line may hold anything here: what is no hint is passed over)
        valid.append(hint)
        node = tree
        for step in hint[0]:
            node = node.setdefault(step, {})
        node[_KEYS] = hint[1]
    return {k: _written(k, v, tree[k], valid) if k in tree else v for k, v in body.items()}


def _written(name: str, value: Any, node: dict[Any, Any], hints: list[Any]) -> Any:
    """A field's value as written: from its field's bytes when it is a call's own value and
    ``hints`` say of it what its field does, else anew."""
    live = _LIVE.pop(id(value), None)
    if live is None or live[0] is not value:
        return _apply(value, node)
    mine = [h for h in hints if h[0][0] == name]
    if len(mine) != len(live[2]) or any(a is not b for a, b in zip(mine, live[2], strict=True)):  # (not as read)
        return _apply(value, node)
    field = live[1]
    if field.written is None:
        field.written = msgspec.Raw(_encode_sorted(_apply(value, node)))
    return field.written


def _apply(value: Any, node: dict[Any, Any]) -> Any:
    if type(value) is list:
        return [_apply(v, node[i]) if i in node else v for i, v in enumerate(value)]
    if type(value) is not dict:
        return value
    children = {k: _apply(v, node[k]) if k in node else v for k, v in value.items()}
    keys = node.get(_KEYS)
    if keys is None:
        return children
    listed = [k for k in dict.fromkeys(k for k in keys if type(k) is str) if k in children]
    seen = set(listed)
    rest = sorted(k for k in children if k not in seen)
    return msgspec.Raw(_encode_plain({k: _raw(children[k]) for k in [*listed, *rest]}))


def _raw(value: Any) -> Any:
    return msgspec.Raw(_encode_sorted(value)) if type(value) is dict or type(value) is list else value
