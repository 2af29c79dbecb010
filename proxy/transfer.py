"""Exports and imports of a conversation's tree (docs/behaviour.md#export-and-import).

An export is JSON Lines, one node a line, oldest first, every field of the node and ``head`` on
the conversation's head (``proxy.admin_objects.ExportedNode``; ``export_lines`` writes it for the
admin API and the CLI alike); its first line also carries the conversation's own fields. An import
re-creates such a file as a new conversation: fresh node ids (parents, compaction origins and the
nodes a clearing's placeholders name follow), calls that were still in flight marked interrupted,
each node's matching keys computed from its items, what was withdrawn from the Responses API
still withdrawn, and the nodes of a fork's source (``inherited``) marked so that their calls,
counted in the source, are not counted again (``dialects.INHERITED``).

An import may come from anyone with a key (``POST /admin/conversations/{id}/import``), so the file
is checked whole before anything is written: a node the tree's rules, the assembly or the
database could not take is refused (``NotAnExport``, a 400), never stored.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from storage import NodeRow, uuid7
from storage.transcript import node_keys

from .admin_objects import ExportedConversation, exported, in_utc
from .assembly import CHAT_ROLES
from .compaction import clearing
from .dialects import INHERITED, dialect
from .dialects.messages.request import check_message
from .dialects.responses.checks import content_problem, item_problem
from .errors import InvalidRequest
from .ids import metadata_problem
from .limits import ContextTooLarge
from .surrogates import loads

if TYPE_CHECKING:
    from storage import AdminStore, ConversationRow

    from .builder import RequestBuilder
    from .upstream import UpstreamClient

__all__ = ["NotAnExport", "Prepared", "export_lines", "prepare_import", "reverify"]

_encode = msgspec.json.Encoder().encode
_HASH = re.compile(r"[0-9a-f]{64}")


async def export_lines(admin: AdminStore, conv: ConversationRow) -> AsyncIterator[bytes]:
    """A conversation's export, a line at a time: its nodes oldest first, a compaction's
    summariser request with it, the conversation's own fields on the first line -- with its head
    and the nodes the export holds (a fork's: those of its source it sees too)."""
    count = conv.node_count + len(await admin.visible_foreign(conv))
    first: ExportedConversation | None = ExportedConversation(conv.created_at, conv.head_node_id, count, conv.metadata)
    async for row in admin.export(conv):
        summariser = await admin.summariser_request(row) if row.kind == "compaction" else None
        yield _encode(exported(row, conv.head_node_id, conv.id, summariser_request=summariser,
                               conversation=first)) + b"\n"
        first = None


class NotAnExport(ValueError):
    """The file is not an export this proxy can import; the message says where and why."""


class _Conversation(msgspec.Struct, forbid_unknown_fields=False):
    created_at: datetime | None = None
    metadata: dict[str, str] | None = None
    # (exports made before they were fields lack both: nothing to check a cut against)
    head_node_id: uuid.UUID | msgspec.UnsetType | None = msgspec.UNSET
    node_count: int | None = None


class _Line(msgspec.Struct, forbid_unknown_fields=False):
    """One line of an export, as far as an import reads it (other fields, e.g. ``object`` or
    ``conversation_id``, are ignored)."""

    id: uuid.UUID
    kind: Literal["turn", "transform", "compaction", "items"]
    sent: list[dict[str, Any]]
    created_at: datetime
    parent_id: uuid.UUID | None = None
    compacted_from: uuid.UUID | None = None
    outcome: Literal["success", "transient", "overflow", "invalid"] | None = None
    status: str | None = None  # exports made before outcome was a field of its own
    received: list[dict[str, Any]] | None = None
    model: str | None = None
    provider: str | None = None
    params: dict[str, Any] = msgspec.field(default_factory=dict)
    usage: dict[str, Any] | None = None
    finish_reason: str | None = None
    error: dict[str, Any] | None = None
    finished_at: datetime | None = None
    api: Literal["chat", "responses", "messages"] = "chat"
    head: bool = False
    response_deleted: bool = False
    request_hash: str | None = None
    summariser_request: str | None = None
    inherited: bool = False  # a node of the exported fork's source: its call counted there
    conversation: _Conversation | None = None


_decode_line = msgspec.json.Decoder(_Line).decode


def _line(raw: bytes) -> _Line:
    try:
        return _decode_line(raw)
    except msgspec.DecodeError:  # (one holding a lone surrogate escape -- proxy.surrogates -- read so; else raised again)
        return msgspec.convert(loads(raw), _Line)


@dataclass(frozen=True)
class Prepared:
    nodes: list[dict[str, Any]]  # ready for AdminStore.import_tree
    head: uuid.UUID | None
    compactions: int
    created_at: datetime | None = None  # the conversation's, as exported
    metadata: dict[str, str] | None = None  # its Conversations API metadata, as exported
    renamed: frozenset[uuid.UUID] = frozenset()  # compactions whose placeholders now name new ids
    old_ids: dict[uuid.UUID, uuid.UUID] | None = None  # a node's new id -> its exported one


def _conversation(line: _Line) -> tuple[datetime | None, dict[str, str] | None]:
    """The conversation's own fields of an export's first line, checked as the Conversations API
    checks its metadata."""
    conv = line.conversation
    if conv is None:
        return None, None
    if conv.created_at is not None and in_utc(conv.created_at) is None:
        raise NotAnExport("line 1: the conversation's created_at is outside the years 1 to 9999 (UTC)")
    problem = metadata_problem(conv.metadata) if conv.metadata is not None else None
    if problem is not None:
        raise NotAnExport(f"line 1: the conversation's {problem[0]}")
    return conv.created_at, conv.metadata


def _check_whole(lines: list[_Line]) -> None:
    """A file cut short -- at a line's end, which leaves every line it keeps whole -- is refused:
    it holds fewer nodes than its first line counts, or not the head that line names (a node
    made while the export ran comes after those counted: more is fine)."""
    conv = lines[0].conversation
    if conv is None:
        return
    if conv.node_count is not None and len(lines) < conv.node_count:
        raise NotAnExport(f"the export holds {len(lines)} node(s) where its first line counts {conv.node_count}: "
                          "it was cut short")
    if conv.head_node_id is not msgspec.UNSET:
        marked = [line.id for line in lines if line.head]
        if conv.head_node_id is not None and conv.head_node_id not in marked:
            raise NotAnExport(f"the head its first line names ({conv.head_node_id}) is on no line marked head: "
                              "it was cut short or edited")
        if conv.head_node_id is None and marked:
            raise NotAnExport(f"line 1 names no head, but node {marked[0]} is marked head")


def _outcome(line: _Line) -> str | None:
    """A node's outcome; exports made before it was a field of its own carry it in the status."""
    if line.outcome is not None:
        return line.outcome
    if line.status == "success":
        return "success"
    if line.status == "failed":
        kind = (line.error or {}).get("kind")
        return kind if kind in ("transient", "overflow", "invalid") else "transient"
    return None


def _text(value: str | None) -> str | None:
    return value.replace("\x00", "") if value is not None and "\x00" in value else value  # text columns


def _check_items(where: str, items: list[dict[str, Any]], api: str) -> None:
    """An imported item meets the checks of items stored with no upstream to refuse them (else the
    copy's every later call would send it malformed, or lose it): a Responses item the
    Conversations API's, a Messages fragment (it reads as a message) a Messages request's, a chat
    message its request's role and the content a message may have (or none)."""
    for i, item in enumerate(items):
        at = f"{where}[{i}]"
        if api == "messages":
            try:
                check_message(item, at)
            except InvalidRequest as exc:
                raise NotAnExport(exc.message) from None
            continue
        if api == "responses":
            problem = item_problem(item)
        elif not isinstance(item.get("role"), str) or item.get("role") not in CHAT_ROLES:
            raise NotAnExport(f"{at}: a chat message needs a role of {sorted(CHAT_ROLES)}")
        else:
            problem = content_problem(item["content"]) if item.get("content") is not None else None
        if problem is not None:
            raise NotAnExport(f"{at}{problem[1]}: {problem[0]}")


def _parents_first(lines: list[_Line]) -> list[tuple[int, _Line]]:
    """(line number, line) in an order where what a node refers to -- its parent, its compaction
    origin -- comes before it, the file's own order wherever it already is so. An export lists
    nodes oldest first, but a node can be older than its parent: a call's pending node moved under
    the summary its synchronous compaction made. A reference to no line, or a cycle, is left for
    the caller to refuse (a line whose origin is not yet placed keeps its place)."""
    numbered = list(enumerate(lines, 1))
    by_id: dict[uuid.UUID, tuple[int, _Line]] = {}
    for entry in numbered:
        by_id.setdefault(entry[1].id, entry)
    placed: set[int] = set()
    out: list[tuple[int, _Line]] = []
    for entry in numbered:
        stack, seen = [entry], {entry[0]}
        while stack:  # (no recursion: a path may be thousands of nodes deep)
            number, line = stack[-1]
            if number in placed:
                stack.pop()
                continue
            waiting = next((by_id[ref] for ref in (line.parent_id, line.compacted_from)
                            if ref in by_id and by_id[ref][0] not in placed and by_id[ref][0] not in seen), None)
            if waiting is not None:
                stack.append(waiting)
                seen.add(waiting[0])
                continue
            stack.pop()
            placed.add(number)
            out.append((number, line))
    return out


def prepare_import(data: bytes) -> Prepared:
    """Read an export (JSON Lines) and make it importable, or raise ``NotAnExport``."""
    lines: list[_Line] = []
    for number, raw in enumerate(data.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            lines.append(_line(raw))
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise NotAnExport(f"line {number}: {exc}") from None
        except RecursionError:  # (as a request body nested too deeply is refused)
            raise NotAnExport(f"line {number}: nested too deeply") from None
    if not lines:
        raise NotAnExport("the export holds no node")
    _check_whole(lines)

    ids: dict[uuid.UUID, uuid.UUID] = {}
    depth: dict[uuid.UUID, int] = {}
    renamed: set[uuid.UUID] = set()
    continued = {ref for line in lines for ref in (line.parent_id, line.compacted_from)}
    nodes: list[dict[str, Any]] = []
    head: uuid.UUID | None = None
    for number, line in _parents_first(lines):
        where = f"line {number} (node {line.id})"
        if line.id in ids:
            raise NotAnExport(f"{where}: the node appears twice")
        for ref in (line.parent_id, line.compacted_from):
            if ref is not None and ref not in ids:
                raise NotAnExport(f"{where}: refers to {ref}, which is on no line before it or after it")
        if (line.kind == "compaction") != (line.compacted_from is not None) or (line.kind == "compaction" and line.parent_id):
            raise NotAnExport(f"{where}: a compaction node, and only it, has compacted_from and no parent")
        for field, moment in (("created_at", line.created_at), ("finished_at", line.finished_at)):
            if moment is not None and in_utc(moment) is None:  # the database would take it; no reader could read it
                raise NotAnExport(f"{where}: {field} {moment.isoformat()} is outside the years 1 to 9999 (UTC)")
        outcome, error, finished_at = _outcome(line), line.error, line.finished_at
        if outcome == "success" or line.head or line.id in continued:
            # (a failed call nothing continues is no one's context: kept as it came -- an upstream
            # may have refused it for just such an item)
            _check_items(f"{where} sent", line.sent, line.api)
            _check_items(f"{where} received", line.received or [], line.api)
        if outcome == "success" and line.kind not in ("compaction", "items") and line.received is None:
            raise NotAnExport(f"{where}: a {line.kind} that succeeded needs its received items")
        if outcome is None:  # still in flight when exported
            outcome = "transient"
            error = {"type": "interrupted", "code": "interrupted", "status": None,
                     "message": "still in flight when exported"}
            finished_at = finished_at or line.created_at
        ids[line.id] = new_id = uuid7()
        depth[line.id] = 0 if line.parent_id is None else depth[line.parent_id] + 1
        if line.head:
            if head is not None:
                raise NotAnExport(f"{where}: a second head")
            head = new_id  # (on any node: the admin API moves it to any finished one)
        sent, params = line.sent, line.params
        if line.kind == "compaction":
            # (a clearing's placeholders -- and those a summary kept among its recent items -- name
            # the nodes holding the originals: their new ids)
            sent, params = clearing.renamed(sent, ids), clearing.renamed(params, ids)
            if sent != line.sent:
                renamed.add(new_id)
        if line.inherited:  # (the source's call: its usage kept, counted there and not again here)
            params = {**params, INHERITED: True}
        if line.request_hash is not None and not _HASH.fullmatch(line.request_hash):
            raise NotAnExport(f"{where}: request_hash is not a sha256 in hex")
        nodes.append({
            "id": new_id,
            "parent_id": ids[line.parent_id] if line.parent_id else None,
            "compacted_from": ids[line.compacted_from] if line.compacted_from else None,
            "kind": line.kind, "outcome": outcome, "sent": sent,
            "received": line.received,
            "model": _text(line.model), "provider": _text(line.provider), "params": params, "usage": line.usage,
            "finish_reason": _text(line.finish_reason), "error": error, "depth": depth[line.id],
            "created_at": line.created_at, "finished_at": finished_at, "api": line.api,
            "response_deleted": line.response_deleted, "request_hash": line.request_hash,
            "summariser_request": _text(line.summariser_request) if line.kind == "compaction" else None,
        })

    def as_messages(node: dict[str, Any], items: list[Any]) -> list[Any]:
        return dialect(node.get("api")).to_messages(items, node.get("provider"))

    keys = node_keys(nodes, as_messages)  # what each node is matched by, computed from its items
    for node in nodes:
        k = keys[node["id"]]
        node.update(chain=k.chain.hex(), answered=k.answered, system_hash=k.system_hash.hex() if k.system_hash else None,
                    answer=k.answer.hex() if k.answer else None)
    created_at, metadata = _conversation(lines[0])
    return Prepared(nodes, head, sum(1 for n in nodes if n["kind"] == "compaction"), created_at, metadata,
                    frozenset(renamed), {new: old for old, new in ids.items()})


_UUID = re.compile(rb"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def reverify(prepared: Prepared, builder: RequestBuilder, upstream: UpstreamClient) -> None:
    """The request hashes of the calls under a compaction whose placeholders the import renamed.
    Such a call's request, rebuilt (``GET /admin/nodes/{id}/request``), names the copy's nodes,
    so the hash it was exported with cannot match it: each is rebuilt here, and when that body,
    the original's ids put back, is the one the exported hash is of, the node takes the hash of
    the body as the copy rebuilds it. A hash that did not match -- forged, or of a request this
    proxy's configuration would build otherwise -- is kept as it came (``/request``: not
    verified)."""
    if not prepared.renamed or prepared.old_ids is None:
        return
    by_id = {n["id"]: n for n in prepared.nodes}
    old = {str(new).encode(): str(was).encode() for new, was in prepared.old_ids.items()}
    root: dict[uuid.UUID, uuid.UUID] = {}
    rows: dict[uuid.UUID, NodeRow] = {}
    tree_id = uuid7()  # (none stored yet: an opaque compaction is not unfolded, the hash then kept)

    def row(node: dict[str, Any]) -> NodeRow:
        found = rows.get(node["id"])
        if found is None:
            finished = node["finished_at"]
            found = rows[node["id"]] = NodeRow(
                id=node["id"], conversation_id="", parent_id=node["parent_id"], kind=node["kind"],
                status="success" if node["outcome"] == "success" else "failed", outcome=node["outcome"],
                sent=node["sent"], received=node["received"], model=node["model"], provider=node["provider"],
                params=node["params"], usage=node["usage"], finish_reason=node["finish_reason"], error=node["error"],
                compacted_from=node["compacted_from"], depth=node["depth"], created_at=in_utc(node["created_at"]),
                finished_at=in_utc(finished) if finished is not None else None, tenant="", tree_id=tree_id,
                request_hash=None, api=node["api"], response_deleted=node["response_deleted"])
        return found

    for node in prepared.nodes:  # (parents first)
        parent = node["parent_id"]
        root[node["id"]] = node["id"] if parent is None else root[parent]
        if node["request_hash"] is None or parent is None or root[node["id"]] not in prepared.renamed:
            continue
        path = []
        while parent is not None:
            path.append(row(by_id[parent]))
            parent = by_id[parent]["parent_id"]
        path.reverse()
        try:
            body = builder.replay_unstored(row(node), path, upstream.replay_target(node["provider"], node["model"])).payload
        except ContextTooLarge:  # (this proxy's bound is lower than the original's: not rebuilt)
            continue
        original = _UUID.sub(lambda m: old.get(m.group(), m.group()), body)
        if hashlib.sha256(original).hexdigest() == node["request_hash"]:
            node["request_hash"] = hashlib.sha256(body).hexdigest()
