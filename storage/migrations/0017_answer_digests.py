"""0017: every answered turn node keeps the digest of its answer -- `answer`, the transcript digest
(storage/transcript.py) of the first message it received -- indexed with its tree, so the safety
net (docs/behaviour.md) recognises a delta call that resends any answer stored in its
conversation's tree, not only one on the head path. bp_finish_call fills it; this fills it for the
nodes that succeeded before it.

Python, not SQL: a digest is taken over the message's canonical form. The hashing is frozen here (a
copy of storage.transcript's canonical form as it was when this migration was written, as 0007
keeps its own). Chat nodes only: a Responses node's answer is digested as the chat messages its
items stand for (the proxy's dialect), which a storage migration does not import -- those nodes
written before this one keep no digest, and the safety net still recognises a resent history of
theirs that begins with the head path's transcript, as before.

The index is partial (answered nodes only) and leads with the digest (0012: only the key leads with
tree_id). On a big table the backfill reads every answered chat node once: run `branchpoint
migrate` before rolling out (README)."""

import hashlib
import json

import msgspec

_SYSTEM_ROLES = frozenset({"system", "developer"})
_TEXT_PARTS = frozenset({"text", "input_text", "output_text"})
_encode = msgspec.json.Encoder(order="sorted").encode
_decode = msgspec.json.Decoder().decode
_BATCH = 5000


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


def _answer(received):
    """The digest of the first non-system message received (None: there is none)."""
    for item in received or ():
        if not (isinstance(item, dict) and item.get("role") in _SYSTEM_ROLES):
            return hashlib.sha256(_encode(_canonical(item))).digest()
    return None


async def upgrade(conn):
    await conn.execute("ALTER TABLE nodes ADD COLUMN answer bytea")
    after = None
    while True:
        rows = await conn.fetch(
            "SELECT tree_id, id, received::text AS received FROM nodes "
            "WHERE outcome = 'success' AND kind = 'turn' AND api = 'chat' AND received IS NOT NULL "
            "AND ($1::uuid IS NULL OR id > $1) ORDER BY id LIMIT $2", after, _BATCH)
        if not rows:
            break
        after = rows[-1]["id"]
        updates = [(r["tree_id"], r["id"], d) for r in rows if (d := _answer(json.loads(r["received"]))) is not None]
        if updates:
            await conn.executemany("UPDATE nodes SET answer = $3 WHERE tree_id = $1 AND id = $2", updates)
    await conn.execute("CREATE INDEX nodes_by_answer ON nodes (answer, tree_id) WHERE answer IS NOT NULL")
