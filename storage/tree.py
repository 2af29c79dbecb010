"""The conversation tree as the call path uses it: start a call, finish it, keep its lease alive,
reap calls whose process died, write compactions. One method, one statement, one round trip --
shared, for starts and finishes, with the other calls' that reach the database at the same time
(``storage.batching``). (On a schema distributed by tree a named conversation's start is sent
beside its tree, and may take a second or third round trip: ``TreeStore._begin_beside_tree``.)"""

from __future__ import annotations

import functools
import logging
import typing
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from . import queries
from .batching import Batch
from .database import Database, _encode, _needs_shield, _on_a_fresh_stack, _shield
from .errors import StorageError, StorageUnavailable
from .ids import tree_of
from .model import Outcome, PathNode, rows
from .pathcache import PathCache
from .shared import SharedItems
from .transcript import digests, prefix_hashes, system_hash

__all__ = ["Begun", "CallFinish", "CallStart", "ContextMode", "ParentMode", "TreeStore"]

log = logging.getLogger("branchpoint.storage")

ParentMode = Literal["head", "root", "node"]


ContextMode = Literal["delta", "full", "window"]  # window: the window did not suffice, nothing written


@dataclass(frozen=True, slots=True)
class Begun:
    """A started call: its conversation and tree, the parent it hangs under (None: a root) and that
    parent's path; the mode that handled it, how many of its non-system messages matched stored
    nodes (full mode) and how many of them the new node does not repeat (``start``)."""

    conversation_id: str
    tree_id: uuid.UUID
    parent_id: uuid.UUID | None
    mode: ContextMode
    matched: int = 0
    start: int = 0
    with_system: bool = False
    path: list[PathNode] = field(default_factory=list)
    # the start as it ran: with what it decided (above), what the finish writes the node again from
    # when the database lost the start (its commit does not wait for the disk:
    # docs/architecture.md#durability) -- encoded only if that is ever needed
    ran: CallStart | None = None

    def restore(self) -> msgspec.Raw:
        """The start and its decisions, as ``bp_restore_start`` reads them."""
        assert self.ran is not None
        return msgspec.Raw(_encode({
            "conversation_id": self.conversation_id, "parent_id": str(self.parent_id) if self.parent_id else None,
            "mode": self.mode, "start": self.start, "with_system": self.with_system, "call": _jsonb(self.ran)}))


class CallStart(msgspec.Struct, kw_only=True):
    """How a call starts: the one contract between the call lifecycle and ``bp_begin_call``. The
    lifecycle builds it from the call; it travels to SQL whole, as one jsonb argument, read there
    into one composite type (``bp_call_start_t`` in storage/functions/calls.sql, which says how
    each field is used). Adding a field: here, and there. Every field travels (the defaults are
    here, not in SQL); bytes as hex strings (``_jsonb``)."""

    tenant: str
    conversation_id: str | None  # None: full mode finds (or makes) the conversation by content
    node_id: uuid.UUID
    new_tree_id: uuid.UUID
    kind: str
    mode: ContextMode
    parent_mode: ParentMode
    parent_id: uuid.UUID | None
    sent: list[Any]
    digests: list[bytes]
    prefixes: list[bytes]
    system_hash: bytes | None
    lease_seconds: float
    model: str | None
    provider: str | None
    params: dict[str, Any]
    new_conversation_id: str | None = None
    prefix_offset: int = 0
    ordinals: list[int] | None = None
    api: str = "chat"
    tree_id: uuid.UUID | None = None  # None here: bp_begin_call_at sets it (a start beside its tree)
    restorable: bool = True  # this process's finish writes a lost start again: its commit need not wait


class CallFinish(msgspec.Struct, kw_only=True):
    """How a call ended: the one contract between the call lifecycle and ``bp_finish_call``
    (storage/functions/calls.sql reads it into ``bp_call_finish_t``, as CallStart). The node it finishes is given beside
    it: (tree, node) address the row -- the tree is the argument a PostgreSQL distributed by tree
    routes the call by (docs/scaling.md). ``received_digests``: the transcript digests of the
    answer (None: those of ``received`` read as chat messages)."""

    outcome: Outcome
    received: list[Any] | None = None
    received_digests: list[bytes] | None = None
    usage: dict[str, Any] | None = None
    finish_reason: str | None = None
    error: Any = None  # {type, code, message, status} (proxy.failures.NodeError)
    request_hash: bytes | None = None  # sha256 of the exact body sent upstream (None: none was sent)
    leased: bool = False  # the call took the conversation's lease (delta turn calls)
    restore: msgspec.Raw | None = None  # the start, for a node found missing (``Begun.restore``)


def _holds_bytes(hint: Any) -> bool:
    return hint is bytes or any(_holds_bytes(arg) for arg in typing.get_args(hint))


@functools.cache
def _bytes_fields(cls: type[msgspec.Struct]) -> tuple[str, ...]:
    """The fields of a contract that hold bytes (``bytes``, ``list[bytes]``, optional or not)."""
    hints = typing.get_type_hints(cls)
    return tuple(name for name in cls.__struct_fields__ if _holds_bytes(hints[name]))


def _hex(value: Any) -> Any:
    if isinstance(value, bytes):
        return "\\x" + value.hex()
    if isinstance(value, list):
        return ["\\x" + b.hex() for b in value]
    return value


def _jsonb(contract: msgspec.Struct) -> msgspec.Raw:
    """A contract as the jsonb argument it is sent as. Bytes go as hex strings (``\\x...``), which
    bytea's input reads as it is: ``jsonb_populate_record`` fills bytea and bytea[] fields without
    decoding in PL/pgSQL. A NUL character, which jsonb cannot hold, is shielded inside the JSON
    values (the items, params, usage, error) as ``storage.database`` shields any jsonb value; one in
    a text field stays, and PostgreSQL refuses it as before."""
    try:
        return _jsonb_here(contract)
    except RecursionError:  # (deep items: as storage.database encodes any deep jsonb value)
        return _on_a_fresh_stack(_jsonb_here, contract)


def _jsonb_here(contract: msgspec.Struct) -> msgspec.Raw:
    contract = msgspec.structs.replace(
        contract, **{name: _hex(getattr(contract, name)) for name in _bytes_fields(type(contract))})
    data = _encode(contract)
    if _needs_shield(data):
        fields = msgspec.to_builtins(contract)
        data = _encode({k: _shield(v) if isinstance(v, (list, dict)) else v for k, v in fields.items()})
    return msgspec.Raw(data)


class TreeStore:
    """``batch``: starts and finishes reaching the database together share a round trip
    (``storage.batching``); ``shared``: large items stored once per tenant (``storage.shared``) --
    a node is written with references and read back whole."""

    def __init__(self, db: Database, cache: PathCache | None = None, *, batch: bool = True,
                 shared: SharedItems | None = None) -> None:
        self.db = db
        self.cache = cache if cache is not None else PathCache(0)
        self.shared = shared if shared is not None else SharedItems(db, min_bytes=0)
        self._begins = Batch(db, queries.BEGIN_CALL, enabled=batch)
        self._finishes = Batch(db, queries.FINISH_CALL, enabled=batch)

    async def begin_call(self, start: CallStart) -> Begun:
        """Start a call. Raises ``Busy``, ``NodeMissing`` or ``BeforeCompaction`` when a rule
        refuses it.

        The parent's path is read only below the nodes this process keeps (``PathCache``)
        and completed from them."""
        tenant, conversation_id = start.tenant, start.conversation_id
        sent, params = await self.shared.prepare(tenant, start.sent, start.params)
        if sent is not start.sent or params is not start.params:
            start = msgspec.structs.replace(start, sent=sent, params=params)
        known = queries.uuid_array(
            self.cache.known(tenant, conversation_id, start.parent_id if start.parent_mode == "node" else None))
        if self.db.distributed and conversation_id is not None:
            records = await self._begin_beside_tree(start, known)
        else:
            records = await self._begins.fetch((tenant, conversation_id or ""), start.node_id, _jsonb(start), known)
        try:
            return await self._begun(start, records)
        except StorageUnavailable as exc:
            # the call has started (its pending node holds the conversation): the caller releases
            # it, as for a start it stopped waiting for
            if exc.sent:
                raise
            raise StorageUnavailable(str(exc), sent=True) from exc
        except Exception:
            # not the database's fault (a shared item gone, a bug): released here, then reported
            # as what it is
            log.exception("a started call's path could not be read; its node is released")
            try:
                await self.abandon(start.node_id)
            except StorageError:
                pass  # (its lease runs out: the reaper finishes it)
            raise

    async def _begin_beside_tree(self, start: CallStart, known: str) -> list[Any]:
        """A named conversation's start on a schema distributed by tree (docs/scaling.md): run
        beside the tree it is expected in -- the one this process last saw it in, else its name's
        derived tree -- so the whole start runs on the worker holding that tree. An alias there (a
        fork) points to its tree: once more beside that one. A conversation not found where it
        was looked for (a new name, or deleted or made again meanwhile) starts on the
        coordinator, which claims names (their lock is taken there, for every claim of a name)."""
        assert start.conversation_id is not None
        tree: uuid.UUID | None = self.cache.tree(start.tenant, start.conversation_id) or tree_of(
            start.tenant, start.conversation_id)
        body = _jsonb(start)  # (bp_begin_call_at sets its tree_id: encoded once for every try)
        for _ in range(2):
            records = await self.db.fetch(queries.BEGIN_CALL_AT, tree, body, known)
            if records[0]["mode"] != "elsewhere":
                return records
            tree = records[0]["tree_id"]
            if tree is None:
                break
        return await self.db.fetch(queries.BEGIN_CALL, body, known)

    async def _begun(self, start: CallStart, records: list[Any]) -> Begun:
        tenant = start.tenant
        first = records[0]
        fresh = rows(PathNode, (r[8:] for r in records)) if first["node_id"] is not None else []  # (BEGIN_CALL)
        fresh = await self.shared.resolve(tenant, fresh)
        parent = first["parent_id"]
        path: list[PathNode] = []
        if parent is not None:
            # the read stopped above a kept node (or the parent itself is kept), or reached the root
            stop = fresh[0].parent_id if fresh else parent
            completed = self.cache.complete(tenant, first["conversation_id"], first["tree_id"], stop, fresh)
            if completed is None:  # the kept part was evicted meanwhile: read it all
                completed = await self.path(first["tree_id"], parent, tenant=tenant)
                self.cache.complete(tenant, first["conversation_id"], first["tree_id"], None, completed)
            path = completed
        elif first["conversation_id"] is not None:
            self.cache.complete(tenant, first["conversation_id"], first["tree_id"], None, [])
        mode = first["mode"]
        return Begun(first["conversation_id"], first["tree_id"], parent, mode, first["matched"],
                     first["start"], first["with_system"], path, start if mode in ("delta", "full") else None)

    async def finish_call(self, tree_id: uuid.UUID, node_id: uuid.UUID, finish: CallFinish, *,
                          tenant: str = "", conversation_id: str = "", begun: Begun | None = None) -> bool | None:
        """Store the outcome; the head follows the head rule. True: stored; False: the node was no
        longer pending (reaped meanwhile); None: it is missing and could not be written again (its
        conversation deleted since its start was lost). ``tenant`` and ``conversation_id`` order a
        batch (``storage.batching``). ``begun``: the call's start, to write its node again if the
        database lost it (``Begun.restore``; then the node holds no lease, and the finish moves the
        head by the head rule alone)."""
        if finish.received_digests is None:
            finish = msgspec.structs.replace(finish, received_digests=digests(finish.received or ()))
        records = await self._finishes.fetch((tenant, conversation_id), node_id, tree_id, node_id, _jsonb(finish))
        finished = records[0]["finished"]
        if finished is None and begun is not None and begun.ran is not None:
            log.warning("a call's node is missing at its finish (the database lost its start); written again",
                        extra={"node_id": str(node_id)})
            finish = msgspec.structs.replace(finish, restore=begun.restore())
            finished = (await self.db.fetch(queries.FINISH_CALL, tree_id, node_id, _jsonb(finish)))[0]["finished"]
            if finished is None:
                log.error("a call's lost start could not be written again (its place in the tree is gone); "
                          "its outcome is not stored", extra={"node_id": str(node_id)})
        return finished

    async def renew(self, tree_id: uuid.UUID, node_id: uuid.UUID, lease_seconds: float) -> bool:
        return bool(await self.db.fetchval(queries.RENEW_LEASE, tree_id, node_id, lease_seconds))

    async def reap_expired(self, limit: int = 100) -> int:
        """Reap every pending node whose lease ran out; returns how many were reaped."""
        reaped = 0
        for row in await self.db.fetch(queries.EXPIRED_PENDING, limit):
            if await self.db.fetchval(queries.REAP_NODE, row["tree_id"], row["id"]):
                reaped += 1
        return reaped

    async def abandon(self, node_id: uuid.UUID) -> str:
        """'reaped', 'missing' or 'finished' (``bp_abandon``)."""
        return await self.db.fetchval(queries.ABANDON, node_id)

    async def path(self, tree_id: uuid.UUID, node_id: uuid.UUID, *, tenant: str) -> list[PathNode]:
        """The path of ``node_id``, root first, whole (``tenant``: the tree's, whose shared items
        it may refer to)."""
        return await self.shared.resolve(tenant, rows(PathNode, await self.db.fetch(queries.PATH_NODES, tree_id, node_id)))

    async def apply_compaction(self, *, tenant: str, conversation_id: str, tree_id: uuid.UUID, node_id: uuid.UUID,
                               compacted_from: uuid.UUID, sent: list[Any], model: str,
                               provider: str, params: dict[str, Any], usage: dict[str, Any] | None, mode: str,
                               call_node: uuid.UUID | None, request: bytes | None) -> str:
        """'ok', or why nothing was written: 'moved', 'busy', 'lost_lease', 'conversation_not_found'."""
        hashed = system_hash(sent)  # (of the items themselves, before any is shared)
        sent, _ = await self.shared.prepare(tenant, sent, {})
        return await self.db.fetchval(
            queries.APPLY_COMPACTION, tenant, conversation_id, tree_id, node_id, compacted_from, sent, hashed,
            model, provider, params, usage, mode, call_node, request,
        )

    async def record_attempt(self, tree_id: uuid.UUID, node_id: uuid.UUID, parent_id: uuid.UUID | None,
                             attempt_id: uuid.UUID, error: Any, request_hash: bytes | None) -> bool:
        """Keep a failed attempt of the pending call ``node_id``, about to be tried again, as a node
        of its own (``attempt_id``, under ``parent_id``, where the attempt hung; ``error``: {type,
        code, message, status}). False when the call is no longer pending (nothing is written)."""
        return bool(await self.db.fetchval(queries.RECORD_ATTEMPT, tree_id, node_id, parent_id, attempt_id,
                                           msgspec.to_builtins(error), request_hash))

    async def node_params(self, tree_id: uuid.UUID, node_id: uuid.UUID) -> dict[str, Any]:
        return await self.db.fetchval(queries.NODE_PARAMS, tree_id, node_id) or {}

    async def continued_node(self, tenant: str, prefixes: list[bytes]) -> dict[str, Any] | None:
        """The deepest node of the tenant a history with these prefix hashes continues (its
        ``id``, ``conversation_id``, ``parent_id``, ``outcome`` and ``k``, how many of the
        history's messages it holds), or None: what a conversation's first full-history call is
        matched against (proxy/sessions.py)."""
        if not prefixes:
            return None
        row = await self.db.fetchrow(queries.CONTINUED_NODE, tenant, queries.bytea_array(prefixes))
        return None if row is None else dict(row)

    async def resumed_node(self, tenant: str, tree_id: uuid.UUID, anchor: uuid.UUID, conversation_id: str,
                           digests: list[bytes]) -> tuple[uuid.UUID, int] | None:
        """The deepest node of ``conversation_id``'s reach whose transcript is ``anchor``'s followed
        by the first k (>= 1) of the messages with these ``digests``: ``(node, k)``, or None --
        where a stateless client that resends what followed a compaction item is
        (``RESUMED_NODE``)."""
        if not digests:
            return None
        start = await self.db.fetchval(queries.NODE_CHAIN, tree_id, anchor)
        if start is None:
            return None
        prefixes = prefix_hashes(digests, bytes(start))
        visible = await self.db.fetchval(queries.VISIBLE_FOREIGN, tree_id, tenant, conversation_id)
        row = await self.db.fetchrow(queries.RESUMED_NODE, tenant, tree_id, conversation_id,
                                     queries.bytea_array(prefixes), queries.uuid_array(visible or ()))
        return None if row is None else (row["id"], row["k"])

    async def conversation_state(self, tenant: str, conversation_id: str) -> tuple[uuid.UUID | None, bool] | None:
        """(head, busy) of a conversation, or None when it does not exist."""
        row = await self.db.fetchrow(queries.CONVERSATION_STATE, tenant, conversation_id)
        return None if row is None else (row["head_node_id"], row["busy"])
