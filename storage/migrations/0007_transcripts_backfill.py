"""0007: compute the transcript keys (chain, answered, system_hash) of the nodes that existed before
0006, tree by tree, then make `chain` required and drop `sent_hash` (retries are recognised by
transcript now). Python, not SQL: the keys come from the messages' canonical forms.

The hashing is frozen here: a copy of ``storage.transcript`` (canonical forms, digests, the fold,
the system hash, ``node_keys``) as it was when this migration was written, not an import of it --
a migration must do the same thing forever, whatever the live module later becomes. (Only chat
messages: Responses nodes came with 0009.)"""

import hashlib
import json

import msgspec

_EMPTY = bytes(32)
_SYSTEM_ROLES = frozenset({"system", "developer"})
_TEXT_PARTS = frozenset({"text", "input_text", "output_text"})
_encode = msgspec.json.Encoder(order="sorted").encode
_decode = msgspec.json.Decoder().decode


def _is_system(item):
    return isinstance(item, dict) and item.get("role") in _SYSTEM_ROLES


def _json_value(value):
    if isinstance(value, str):
        try:
            return ["json", _decode(value)]
        except (msgspec.DecodeError, RecursionError):
            return ["text", value]
    return ["json", value]


def _text_part(part):
    return isinstance(part, dict) and part.get("type", "text") in _TEXT_PARTS and isinstance(part.get("text"), str)


def _content(content):
    if content is None or content == "":
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        if all(_text_part(part) for part in content):
            return "".join(part["text"] for part in content)
        return [["text", part["text"]] if _text_part(part) else ["part", part] for part in content]
    return ["other", content]


def _call(call):
    if not isinstance(call, dict):
        return ["other", call]
    fn = call.get("function") if isinstance(call.get("function"), dict) else {}
    return [call.get("id"), call.get("type") or "function", fn.get("name"), _json_value(fn.get("arguments"))]


def _canonical(message):
    if not isinstance(message, dict):
        return ["other", message]
    out = {"role": message.get("role"), "content": _content(message.get("content"))}
    if message.get("name") is not None:
        out["name"] = message["name"]
    calls = message.get("tool_calls")
    if calls:
        out["tool_calls"] = [_call(c) for c in calls] if isinstance(calls, list) else ["other", calls]
    fc = message.get("function_call")
    if isinstance(fc, dict):
        out["function_call"] = [fc.get("name"), _json_value(fc.get("arguments"))]
    if message.get("tool_call_id") is not None:
        out["tool_call_id"] = message["tool_call_id"]
    return out


def _fold(start, items):
    """The chain after the non-system ``items``, from ``start``."""
    h = start
    for item in items:
        if not _is_system(item):
            h = hashlib.sha256(h + hashlib.sha256(_encode(_canonical(item))).digest()).digest()
    return h


def _system_hash(items):
    system = [[i.get("role"), _content(i.get("content"))] for i in items if _is_system(i)]
    return hashlib.sha256(_encode(system)).digest() if system else None


def _node_keys(nodes):
    """{id: (chain, answered, system_hash)} of nodes whose parents and compaction origins are among them."""
    by_id = {n["id"]: n for n in nodes}
    keys = {}

    def source(n):
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
            own_system = _system_hash(sent)
            if n["kind"] == "compaction":
                assert base is not None, "a compaction node needs the node it replaced"
                keys[n["id"]] = (base[0], base[1], own_system)
                continue
            h = _fold(base[0] if base else _EMPTY, sent)
            succeeded = n.get("outcome") == "success"
            if succeeded:
                h = _fold(h, received)
            keys[n["id"]] = (h, bool(base and base[1]) or (succeeded and bool(received)),
                             own_system or (base[2] if base else None))
    return keys


async def upgrade(conn):
    trees = [r["tree_id"] for r in await conn.fetch("SELECT DISTINCT tree_id FROM nodes WHERE chain IS NULL")]
    for tree in trees:
        rows = await conn.fetch(
            "SELECT id, parent_id, kind, outcome, sent::text AS sent, received::text AS received, compacted_from "
            "FROM nodes WHERE tree_id = $1", tree)
        nodes = [{**dict(r), "sent": json.loads(r["sent"]), "received": json.loads(r["received"]) if r["received"] else None}
                 for r in rows]
        keys = _node_keys(nodes)
        await conn.executemany(
            "UPDATE nodes SET chain = $3, answered = $4, system_hash = $5 WHERE tree_id = $1 AND id = $2",
            [(tree, node_id, *k) for node_id, k in keys.items()])
    await conn.execute("ALTER TABLE nodes ALTER COLUMN chain SET NOT NULL")
    await conn.execute("ALTER TABLE nodes DROP COLUMN sent_hash")
