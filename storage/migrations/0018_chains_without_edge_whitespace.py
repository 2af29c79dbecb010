"""0018: every node's transcript hash (`chain`) and answer digest (`answer`, 0017) computed again with the canonical form of now, in
which the leading and trailing whitespace of a text does not count.

Why: full-history matching compares messages by their canonical forms (storage/transcript.py). Apps
that restore a session (aider's --restore-chat-history) resend it with spaces and blank lines added
around the texts, matched nothing and stored the whole history again; the canonical form strips a
text's edges now. Every chain stored before was folded over the old form, so a conversation stored
before the upgrade would match nothing after it, and the safety net would not recognise its
answers -- hence this. `answered` does not depend on texts and the system hash keeps its texts as
they are: those stay. An `answer` left null (a Responses node from before 0017) stays null.

Frozen, like 0007: a copy of the hashing as it is when this was written -- canonical forms,
digests, the fold, and of a Responses node's items read as messages what the canonical form sees
(proxy/dialects/responses/items.py) -- not an import of live code. Tree by tree (a chain depends on
the node's whole path), trees taken in batches, only the chains that change written."""

import hashlib
import json

import msgspec

_EMPTY = bytes(32)
_SYSTEM_ROLES = frozenset({"system", "developer"})
_TEXT_PARTS = frozenset({"text", "input_text", "output_text"})
_TREES_PER_BATCH = 200
_ROWS_PER_WRITE = 1000
_encode = msgspec.json.Encoder(order="sorted").encode
_decode = msgspec.json.Decoder().decode


# -- the canonical form (storage/transcript.py) ---------------------------------------------------


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
        return content.strip()
    if isinstance(content, list):
        if all(_text_part(part) for part in content):
            return "".join(part["text"] for part in content).strip()
        return [["text", part["text"].strip()] if _text_part(part) else ["part", part] for part in content]
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


def _digest(message):
    return hashlib.sha256(_encode(_canonical(message))).digest()


def _first(messages):
    """The digest of the first non-system message (None: there is none)."""
    return next((_digest(m) for m in messages if not _is_system(m)), None)


def _fold(start, messages):
    """The chain after the non-system ``messages``, from ``start``."""
    h = start
    for m in messages:
        if not _is_system(m):
            h = hashlib.sha256(h + _digest(m)).digest()
    return h


# -- a Responses node's items as messages (proxy/dialects/responses/items.py: what the canonical
#    form reads of them -- role, content, tool calls, tool results) ----------------------------


def _parts_to_content(content, output):
    if content is None or isinstance(content, str) or not isinstance(content, list):
        return content
    texts = []
    parts = []
    only_text = True
    for part in content:
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        if kind in (("output_text", "text") if output else ("input_text", "text")) and isinstance(part.get("text"), str):
            texts.append(part["text"])
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "refusal":
            pass
        elif kind == "input_image":
            only_text = False
            url = part.get("image_url") or (f"file:{part['file_id']}" if part.get("file_id") else None)
            image = {"url": url}
            if part.get("detail"):
                image["detail"] = part["detail"]
            parts.append({"type": "image_url", "image_url": image})
        elif kind == "input_file":
            only_text = False
            parts.append({"type": "file", "file": {k: part[k] for k in ("file_id", "file_data", "filename") if k in part}})
        else:
            only_text = False
            parts.append(part)
    return "".join(texts) if only_text else parts


def _flat_name(namespace, name):
    return f"{namespace}__{name}" if isinstance(namespace, str) and namespace else name


def _responses_messages(items):
    out = []
    last_assistant = None
    for item in items if isinstance(items, list) else ():
        if not isinstance(item, dict):
            continue
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role") or "user"
            message = {"role": role, "content": _parts_to_content(item.get("content"), role == "assistant")}
            out.append(message)
            last_assistant = message if role == "assistant" else None
        elif kind == "function_call":
            call = {"id": item.get("call_id"), "type": "function",
                    "function": {"name": _flat_name(item.get("namespace"), item.get("name")),
                                 "arguments": item.get("arguments") or ""}}
            if last_assistant is None:
                last_assistant = {"role": "assistant", "content": None}
                out.append(last_assistant)
            last_assistant.setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            output = item.get("output")
            if isinstance(output, list):
                output = _parts_to_content(output, False)
            out.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": output})
            last_assistant = None
    return out


# -- the chains of a tree --------------------------------------------------------------------------


def _keys(nodes):
    """{id: (chain, digest of the first message received)} of nodes whose parents and compaction
    origins are among them."""
    by_id = {n["id"]: n for n in nodes}
    chains = {}
    answers = {}

    def source(n):
        return n["compacted_from"] if n["kind"] == "compaction" else n["parent_id"]

    for start in by_id:
        stack = [start]
        while stack:  # iterative: paths can be thousands of nodes long
            n = by_id[stack[-1]]
            up = source(n)
            if up is not None and up not in chains:
                stack.append(up)
                continue
            stack.pop()
            if n["id"] in chains:
                continue
            base = chains[up] if up is not None else _EMPTY
            if n["kind"] == "compaction":
                chains[n["id"]] = base
                continue
            sent = n["sent"] or []
            received = n["received"] or []
            if n["api"] == "responses":
                sent, received = _responses_messages(sent), _responses_messages(received)
            h = _fold(base, sent)
            if n["outcome"] == "success":
                h = _fold(h, received)
                answers[n["id"]] = _first(received)
            chains[n["id"]] = h
    return {i: (h, answers.get(i)) for i, h in chains.items()}


async def upgrade(conn):
    with_answer = await conn.fetchval(
        "SELECT EXISTS (SELECT 1 FROM information_schema.columns WHERE table_schema = current_schema() "
        "AND table_name = 'nodes' AND column_name = 'answer')")
    after = None
    while True:
        trees = [r["tree_id"] for r in await conn.fetch(
            "SELECT DISTINCT tree_id FROM nodes WHERE $1::uuid IS NULL OR tree_id > $1 ORDER BY tree_id LIMIT $2",
            after, _TREES_PER_BATCH)]
        if not trees:
            return
        after = trees[-1]
        for tree in trees:
            rows = await conn.fetch(
                "SELECT id, parent_id, kind, outcome, api, sent::text AS sent, received::text AS received, "
                "compacted_from, chain, " + ("answer" if with_answer else "NULL::bytea AS answer") +
                " FROM nodes WHERE tree_id = $1", tree)
            nodes = [{**dict(r), "sent": json.loads(r["sent"]),
                      "received": json.loads(r["received"]) if r["received"] else None} for r in rows]
            old = {r["id"]: (bytes(r["chain"]), bytes(r["answer"]) if r["answer"] is not None else None) for r in rows}
            changed = []
            for node_id, (h, answer) in _keys(nodes).items():
                was = old[node_id]
                answer = answer if was[1] is not None else None  # a missing digest is not made here
                if (h, answer) != was:
                    changed.append((tree, node_id, h, answer))
            for i in range(0, len(changed), _ROWS_PER_WRITE):
                if with_answer:
                    await conn.executemany("UPDATE nodes SET chain = $3, answer = $4 WHERE tree_id = $1 AND id = $2",
                                           changed[i:i + _ROWS_PER_WRITE])
                else:
                    await conn.executemany("UPDATE nodes SET chain = $3 WHERE tree_id = $1 AND id = $2",
                                           [c[:3] for c in changed[i:i + _ROWS_PER_WRITE]])
