"""Large repeated items stored once per tenant (docs/architecture.md#shared-items).

Every session of a coding agent sends the same system prompt and the same tool definitions --
Codex ~18 KB of instructions, Claude Code 32-61 KB of tools, Open WebUI ~26 KB -- and a node keeps
its request's other fields whole: stored again with every node, they were most of what a session
stored. Here such a value is stored once per tenant in ``shared_items``, keyed by the sha256 of its
canonical JSON, and the node keeps a reference in its place:

    a system/developer item of ``sent``     {"_bp_shared": "<sha256 hex>", "role": "system"}
    a field of ``params`` (tools, ...)       {"_bp_shared": "<sha256 hex>"}

(the role stays beside the reference: SQL that picks a history's system items -- ``bp_tail`` --
still reads it). Only values of at least ``[database] share_items_above`` bytes are shared; user
messages, tool results and answers stay in their node, where full-text search finds them.

Writing: ``SharedItems.prepare`` replaces what it shares in a call's items and fields and stores
each new value (``INSERT ... ON CONFLICT``) before the node that refers to it is written. Reading:
``resolve_*`` put the values back -- the storage layer returns whole items, and nothing above it
sees a reference. Both go through a process cache: a value this process stored or read recently
costs no round trip.

Removal: ``sweep`` deletes the items no node refers to any more (a GIN index over the nodes'
references, migration 0023) once they have not been seen for ``GRACE`` -- so a process that decided
to refer to an item a moment ago (its cache says it exists) never finds it gone: a process counts
an item as stored only for ``FRESH`` after it last wrote (or touched) its row, and ``GRACE`` is well
above that plus a statement's longest time.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

import msgspec

from . import queries
from .database import Database

__all__ = ["FRESH", "GRACE", "REF", "SharedItems", "is_ref"]

REF = "_bp_shared"  # (a client's item or field that looks like a reference is shared itself: ``split``)
FRESH = 60.0  # seconds a process counts an item as stored after it last wrote its row
GRACE = 600.0  # an item not seen for this long, and referred to by no node, is removed
SHARED_ROLES = frozenset({"system", "developer"})
OWN = "_bp_"  # params of the proxy's own (proxy.dialects.OWN): never shared -- so never resolved either --
# but for the order of a request's schemas' properties (proxy.key_order), as large and as repeated
# as the tool definitions it describes
SHARED_OWN = frozenset({"_bp_key_order"})

_encode_sorted = msgspec.json.Encoder(order="sorted").encode
_N = TypeVar("_N", bound=msgspec.Struct)


def is_ref(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get(REF), str)


def _field_ref(name: str, value: Any) -> bool:
    """A field's value is a reference where ``split`` puts one: never in a param of the proxy's
    own (``OWN``), whatever its shape -- an import's line may hold anything there."""
    return is_ref(value) and not _own(name)


def _own(name: str) -> bool:
    return name.startswith(OWN) and name not in SHARED_OWN


def _digest(value: Any) -> tuple[str, bytes]:
    encoded = _encode_sorted(value)
    return hashlib.sha256(encoded).hexdigest(), encoded


class SharedItems:
    """``min_bytes``: the smallest value shared (0: nothing is); ``cache_bytes``: the values kept
    in this process to resolve references without a round trip; ``fresh``: how long after writing
    an item's row this process counts it as stored (``FRESH``; kept well below ``GRACE``)."""

    def __init__(self, db: Database, *, min_bytes: int, cache_bytes: int = 32 * 1024 * 1024,
                 fresh: float = FRESH) -> None:
        self.db = db
        self.min_bytes = min_bytes
        self.fresh = fresh
        self.cache_bytes = cache_bytes
        self._values: OrderedDict[tuple[str, str], tuple[Any, int]] = OrderedDict()  # -> (value, its size)
        self._size = 0
        self._stored: dict[tuple[str, str], float] = {}  # -> when this process last wrote its row

    # -- writing ---------------------------------------------------------------------------------

    def split(self, tenant: str, sent: Sequence[Any], params: dict[str, Any]) -> tuple[list[Any], dict[str, Any], dict[str, bytes]]:
        """``sent`` and ``params`` with the values to share replaced by references (the same
        objects when nothing is), and those values (hash -> canonical JSON) -- pure but for
        remembering the values it read."""
        found: dict[str, bytes] = {}
        out_sent = sent if isinstance(sent, list) else list(sent)
        share = self.min_bytes > 0
        for i, item in enumerate(sent):
            if not isinstance(item, dict):
                continue
            role = item.get("role")
            shared_role = type(role) is str and role in SHARED_ROLES
            # (an item that looks like a reference is stored as it is, behind a real one: a
            # client's value is never taken for a reference, however it was sent)
            if (share and shared_role) or is_ref(item):
                key, encoded = _digest(item)
                if len(encoded) >= self.min_bytes or is_ref(item):
                    if out_sent is sent:
                        out_sent = list(sent)
                    found[key] = encoded
                    self._remember(tenant, key, item, len(encoded))
                    out_sent[i] = {REF: key, "role": role} if type(role) is str else {REF: key}
        out_params = params
        for name, value in params.items():
            if _own(name) or not isinstance(value, (dict, list, str)):
                continue
            if share or is_ref(value):
                key, encoded = _digest(value)
                if len(encoded) >= self.min_bytes or is_ref(value):
                    if out_params is params:
                        out_params = dict(params)
                    found[key] = encoded
                    self._remember(tenant, key, value, len(encoded))
                    out_params[name] = {REF: key}
        return out_sent, out_params, found

    async def store(self, tenant: str, found: dict[str, bytes]) -> None:
        """Write the values this process has not written (or touched) for ``FRESH``: one
        statement for all of them, none when there is nothing to write."""
        now = time.monotonic()
        due = [key for key in found if (tenant, key) not in self._stored or now - self._stored[(tenant, key)] >= self.fresh]
        if not due:
            return
        # (decoded again, not passed as raw JSON: a NUL character is shielded like in any jsonb value)
        await self.db.execute(queries.SHARED_STORE, tenant, {k: msgspec.json.decode(found[k]) for k in due})
        if len(self._stored) > 100_000:
            self._stored.clear()
        for key in due:
            self._stored[(tenant, key)] = now

    async def prepare(self, tenant: str, sent: Sequence[Any], params: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
        """``split``, then ``store``: what a node is written with."""
        out_sent, out_params, found = self.split(tenant, sent, params)
        if found:
            await self.store(tenant, found)
        return out_sent, out_params

    # -- reading ---------------------------------------------------------------------------------

    def _remember(self, tenant: str, key: str, value: Any, size: int) -> None:
        entry = (tenant, key)
        if entry in self._values:
            self._values.move_to_end(entry)
            return
        self._values[entry] = (value, size)
        self._size += size
        while self._size > self.cache_bytes and self._values:
            _, (_, dropped) = self._values.popitem(last=False)
            self._size -= dropped

    async def _load(self, tenant: str, keys: Iterable[str]) -> None:
        missing = sorted({k for k in keys if (tenant, k) not in self._values})
        if not missing:
            return
        for row in await self.db.fetch(queries.SHARED_LOAD, tenant, missing):
            value = row["item"]
            self._remember(tenant, row["hash"], value, len(_encode_sorted(value)))

    def _value(self, tenant: str, ref: dict[str, Any]) -> Any:
        found = self._values.get((tenant, ref[REF]))
        if found is None:  # (gone: never, while a node refers to it -- say so rather than guess)
            raise LookupError(f"shared item {ref[REF]} of tenant {tenant!r} is missing")
        self._values.move_to_end((tenant, ref[REF]))
        return found[0]

    @staticmethod
    def refs(sent: Iterable[Any], params: dict[str, Any] | None) -> list[str]:
        out = [item[REF] for item in sent if is_ref(item)]
        if params:
            out.extend(v[REF] for k, v in params.items() if _field_ref(k, v))
        return out

    def _whole(self, tenant: str, sent: list[Any], params: dict[str, Any] | None) -> tuple[list[Any], dict[str, Any] | None]:
        if any(is_ref(item) for item in sent):
            sent = [self._value(tenant, item) if is_ref(item) else item for item in sent]
        if params and any(_field_ref(k, v) for k, v in params.items()):
            params = {k: self._value(tenant, v) if _field_ref(k, v) else v for k, v in params.items()}
        return sent, params

    async def resolve(self, tenant: str, nodes: list[_N]) -> list[_N]:
        """Nodes (``PathNode``, ``NodeRow`` ... of one tenant) with their references resolved."""
        keys = [k for n in nodes for k in self.refs(n.sent, getattr(n, "params", None))]
        if not keys:
            return nodes
        await self._load(tenant, keys)
        out = []
        for node in nodes:
            params = getattr(node, "params", None)
            if not self.refs(node.sent, params):
                out.append(node)
                continue
            sent, params = self._whole(tenant, node.sent, params)
            changes: dict[str, Any] = {"sent": sent}
            if params is not None and hasattr(node, "params"):
                changes["params"] = params
            out.append(msgspec.structs.replace(node, **changes))
        return out

    async def resolve_rows(self, rows: list[_N]) -> list[_N]:
        """Rows that carry their tenant (``NodeRow``, ``PathRow``), resolved, in their order."""
        tenants = {r.tenant for r in rows}  # type: ignore[attr-defined]
        if len(tenants) <= 1:
            return await self.resolve(next(iter(tenants)), rows) if tenants else rows
        resolved: dict[int, Any] = {}
        for tenant in tenants:
            group = [i for i, r in enumerate(rows) if r.tenant == tenant]  # type: ignore[attr-defined]
            for i, r in zip(group, await self.resolve(tenant, [rows[i] for i in group]), strict=True):
                resolved[i] = r
        return [resolved[i] for i in range(len(rows))]

    # -- removal -------------------------------------------------------------------------------

    async def sweep(self, *, grace: float = GRACE, page: int = 1000) -> int:
        """Delete the shared items no node refers to and no process saw for ``grace`` seconds;
        returns how many went. Reads the old ones a page at a time, asks which of them nodes
        still refer to (the GIN index), deletes the rest -- if still unseen."""
        removed = 0
        after = ("", "")
        while True:
            candidates = await self.db.fetch(queries.SHARED_CANDIDATES, grace, after[0], after[1], page)
            by_tenant: dict[str, list[str]] = {}
            for row in candidates:
                by_tenant.setdefault(row["tenant"], []).append(row["hash"])
            for tenant, keys in by_tenant.items():
                used = {row["ref"] for row in await self.db.fetch(queries.SHARED_REFERRED, tenant, keys)}
                if used:  # (seen now: not looked at again for ``grace``, not at every sweep)
                    await self.db.execute(queries.SHARED_SEEN, tenant, sorted(used))
                unused = [k for k in keys if k not in used]
                if unused:
                    status = await self.db.execute(queries.SHARED_DELETE, tenant, unused, grace)
                    removed += int(status.split()[-1])
                    for key in unused:
                        self._stored.pop((tenant, key), None)
            if len(candidates) < page:
                return removed
            after = (candidates[-1]["tenant"], candidates[-1]["hash"])
