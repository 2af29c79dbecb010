"""A call as the lifecycle carries it: the request a route read (``Call``), and the call once its
node is started (``Started``) -- or, for a call not to be stored (``Call.store``), once it is
under way without one."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from storage import transcript, uuid7

from .assembly import SYSTEM_AT, system_positions_at
from .dialects import Dialect
from .dialects.messages.translate import APPLIED_EDITS  # (exchange params: context edits as carried out)

if TYPE_CHECKING:
    from storage import Begun

    from .compaction import Edits

__all__ = ["APPLIED_EDITS", "COMPACTED", "Call", "Started", "history_key", "items_after"]

COMPACTED = "_bp_compacted"  # exchange params: the compaction node this call was compacted under


def history_key(tenant: str, conversation_id: str | None, raws: list[bytes]) -> Any:
    """What a process remembers a resent history under (``transcript.KnownHistories``): its
    conversation, or -- none named yet (/auto/v1) -- its first three items (not the first alone:
    every user of an app shares its system prompt, and would compare with another's history). Only
    what is compared depends on it: the keys come from the bytes, whichever entry they are compared
    with."""
    if conversation_id is not None:
        return (tenant, conversation_id)
    return (tenant, None, *raws[:3])


@dataclass(slots=True)
class Call:
    """A parsed request to be stored, built by the route with its dialect's help: ``items`` are
    what the client sent in its API's format, ``messages`` the same read as chat messages."""

    tenant: str
    conversation_id: str | None  # None: full-history mode finds (or makes) the conversation by content
    kind: str  # "turn" | "transform"
    mode: str  # "delta": messages are the new items | "full": the client's whole history
    parent_mode: str  # "head" | "root" | "node" (delta mode)
    parent_id: uuid.UUID | None
    body: dict[str, Any]  # the client's body; every field but its items is forwarded (``params``)
    items: list[dict[str, Any]]  # what the call sends (``Dialect.items``)
    stream: bool
    client_key: str | None
    headers: list[tuple[str, str]]  # incoming request headers (filtered when forwarded)
    dialect: Dialect  # the client's API: the format of ``items``
    credentials: tuple[str, ...] = ()  # every credential the client sent: masked wherever echoed
    messages: list[dict[str, Any]] = None  # type: ignore[assignment]  # ``items`` as chat messages (default: by the dialect)
    ordinals: list[int] | None = None  # the message each item stands for (``dialects.Transcript``)
    params: dict[str, Any] = None  # type: ignore[assignment]  # the other fields, stored (default: by the dialect)
    dropped_tools: list[str] = field(default_factory=list)  # hosted tools its upstream cannot run, left out
    query: bytes = b""  # the request's query string: forwarded to an upstream that speaks the client's API
    compact_threshold: int | None = None  # the client's own threshold (Responses context_management): tokens
    edits: Edits | None = None  # the client's own clearing of old tool results (Anthropic's, for another upstream)
    applied_edits: list[dict[str, Any]] | None = None  # what came of ``edits`` (Anthropic's applied_edits)
    truncation_auto: bool = False  # Responses truncation "auto": an overflow compacts and retries once
    compaction_controls: bool = False  # the client asked for either: its answer shows a compaction made first
    compaction: Any = None  # set when this call was compacted first: the compaction node (storage.PathNode)
    raw_items: list[bytes] | None = None  # each item as the JSON bytes it was sent as (full history, chat)
    history_key: Any = None  # what this process remembers them under (``history_key``)
    keys: transcript.HistoryKeys | None = None  # full history: its keys, once worked out (``CallLifecycle``)
    # its items are new by the client's own word -- a Conversations API call (``conversation``), a
    # stateless client resumed after a compaction item (its items matched there by its route):
    # never taken for a resent history
    new_items: bool = False
    store: bool = True  # False: translated for its upstream and answered, nothing stored (no conversation named)

    def exchange_params(self) -> dict[str, Any]:
        """The params an answer is translated with: the stored ones, and -- when the call was
        compacted first and its client asked for OpenAI's compaction controls -- the compaction
        node (``COMPACTED``), which a Responses answer begins with; when it asked for context
        edits of its own, what came of them (``APPLIED_EDITS``), which a Messages answer says."""
        extra: dict[str, Any] = {}
        if self.compaction is not None and self.compaction_controls:
            extra[COMPACTED] = self.compaction
        if self.applied_edits is not None:
            extra[APPLIED_EDITS] = self.applied_edits
        return {**self.params, **extra} if extra else self.params

    def __post_init__(self) -> None:
        if self.messages is None:
            self.messages, self.ordinals = self.dialect.read(self.items)
        if self.params is None:
            self.params = self.dialect.params(self.body)

    @property
    def api(self) -> str:
        return self.dialect.name

    def start_keys(self, histories: transcript.KnownHistories) -> tuple[list[bytes], list[bytes], bytes | None]:
        """What the call's start is keyed by: (the digests of its messages -- delta mode --, the
        hashes of their prefixes, the hash of its system messages). A full-history call's keys are
        kept (``keys``), and its layout with them: where its system messages were
        (``SYSTEM_AT``; empty when it sent none, so none is sent whatever the path holds)."""
        if self.mode == "full":
            self.keys = self.history_keys(histories)
            at = system_positions_at(self.keys.system, len(self.messages))
            if at is not None or not self.keys.system:
                self.params = {**self.params, SYSTEM_AT: at or []}
            return [], self.keys.prefixes, transcript.system_hash([self.messages[i] for i in self.keys.system])
        digests = transcript.digests(self.messages)
        # the hashes of the prefixes let the safety net recognise a delta client resending its history
        # -- only when an assistant message is among them (a delta client never resends the model's
        # answers: an ordinary turn probes nothing), and never for a call that says where its items
        # go: a parent named (full history takes none; an answer it sends again is its to send) or
        # items new by its word (``new_items``)
        prefixes = transcript.prefix_hashes(digests) if not self.new_items and self.parent_mode != "node" and any(
            type(m) is dict and m.get("role") == "assistant" for m in self.messages) else []
        return digests, prefixes, transcript.system_hash(self.messages)

    def history_keys(self, histories: transcript.KnownHistories) -> transcript.HistoryKeys:
        """A full-history call's keys: only the items this process has not seen sent before in
        this conversation are hashed (``histories``; docs/behaviour.md#full-history-mode)."""
        raws = self.raw_items
        if raws is None or self.ordinals is not None or len(raws) != len(self.messages):
            return transcript.history_keys(self.messages)
        key = self.history_key if self.history_key is not None else history_key(self.tenant, self.conversation_id, raws)
        return histories.keys(key, raws, self.messages)

    def tail(self, skip: int, *, with_system: bool) -> list[dict[str, Any]]:
        """The items after the first ``skip`` non-system messages they stand for."""
        if self.ordinals is None:  # one item, one message
            if self.keys is not None:
                return _tail(self.items, self.keys.system, skip, with_system)
            return transcript.tail(self.items, skip, with_system=with_system)
        return items_after(self.items, self.ordinals, skip, with_system=with_system)


def items_after(items: list[Any], ordinals: list[int] | None, skip: int, *, with_system: bool) -> list[Any]:
    """The items after the first ``skip`` non-system messages they stand for (``ordinals``: the
    message each item stands for, 0 a system/developer one -- ``bp_tail``'s; None: one item, one
    message); system/developer ones kept only when ``with_system``."""
    if ordinals is None:
        return transcript.tail(items, skip, with_system=with_system)
    return [item for item, n in zip(items, ordinals, strict=True) if (n > skip if n else with_system)]


def _tail(items: list[Any], system: list[int], skip: int, with_system: bool) -> list[Any]:
    """``transcript.tail`` of ``items`` whose system/developer items are at ``system``."""
    cut = skip  # the index of the first item after ``skip`` non-system ones
    for i in system:
        if i > cut:
            break
        cut += 1
    before = [items[i] for i in system if i < cut] if with_system else []
    if with_system or not system or system[-1] < cut:
        return before + items[cut:]
    at = set(system)
    return before + [item for i, item in enumerate(items[cut:], cut) if i not in at]


@dataclass(slots=True)
class Started:
    call: Call
    conversation_id: str
    node_id: uuid.UUID
    tree_id: uuid.UUID
    parent_id: uuid.UUID | None
    mode: str  # the mode that handled the call (a delta call resending its history: full)
    matched: int  # full mode: how many of the client's non-system messages matched stored nodes
    new_items: list[dict[str, Any]]  # what this node adds to its parent's path
    secrets: tuple[str | None, ...]  # credentials an upstream error must never echo back
    request_hash: bytes | None = None
    finished: bool = False
    stored: bool = True  # False: no node -- a call that names no conversation, only translated (``Call.store``)
    begun: Begun | None = None  # how it started: what its finish writes again should the database lose it

    @classmethod
    def unstored(cls, call: Call, new_items: list[dict[str, Any]], secrets: tuple[str | None, ...]) -> Started:
        """A call that is not to be stored (``Call.store``), under way without a node: the id its
        answer is named by is made up (a message's ``msg_...``), nothing names it elsewhere."""
        node_id = uuid7()
        return cls(call, "", node_id, node_id, None, "delta", 0, new_items, secrets, stored=False)

    @property
    def leased(self) -> bool:
        return self.mode == "delta" and self.call.kind == "turn"

    def headers(self) -> list[tuple[str, str]]:
        if not self.stored:
            return [("x-branchpoint-dropped-tools", _listed(self.call.dropped_tools))] if self.call.dropped_tools else []
        headers = [
            ("x-conversation-id", self.conversation_id),
            ("x-node-id", str(self.node_id)),
            ("x-parent-node-id", str(self.parent_id) if self.parent_id else "root"),
            ("x-context-mode", self.mode),
            ("x-context-matched", str(self.matched)),
        ]
        if self.call.dropped_tools:
            headers.append(("x-branchpoint-dropped-tools", _listed(self.call.dropped_tools)))
        return headers


def _listed(names: Any) -> str:
    """Names a client chose (a hosted tool's type, an MCP server's name) as one header value: each
    percent-encoded but for what a tool name is made of -- a character outside Latin-1 made the
    answer's headers fail after the call was made and stored (a 500 its client retried), a comma
    read as two names, a line break cut the connection."""
    return ",".join(quote(str(name), safe="-_.:~@/+") for name in names)


