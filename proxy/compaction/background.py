"""Background compaction: after a turn above the soft threshold, summarise in the background and
apply the result only if the conversation is still where it was (docs/behaviour.md#compaction).

- A turn whose upstream reported no usage asks for a job too; the job estimates the path first
  and stops there when it is under the soft threshold.
- One job per conversation at a time. A turn that asks for one while a job runs leaves its
  request behind; when the running job ends without compacting (a newer turn moved the head,
  which is exactly why there is a newer request) the newest request runs next -- so a fast
  conversation is not left uncompacted because its turns kept overtaking the summariser.
- Any head move wins over a summary: it is applied by one statement only if the head is still
  the node it summarised and no call is in flight; otherwise nothing is written then.
- A call that crosses the hard threshold while a summary of its own path is being written takes
  that summary over (``take_over``) instead of asking the summariser a second time.
- A summary made stays ready for the conversation's next call (``use_ready``: ``READY_FOR``
  seconds, ``READY_MOST`` conversations): a call whose path still holds the node it summarised --
  a fast agent's next turn, which overtook it; a full-history turn that was in flight as it was
  applied (such calls hold no lease) and finished under the node it replaced -- hangs under it,
  the turns since kept raw. A fast conversation is compacted by its next call, not left for the
  hard threshold with a summary paid for and dropped each turn; and the request a newer turn
  left behind applies that summary (the turns since kept raw) rather than pay the summariser
  again.
- No summary when clearing old tool results before the next call will bring the path under the
  soft threshold (``Clearer.suffices``; docs/behaviour.md#context-editing).
- The path's size is held against ``[server] max_bytes_in_flight`` while it is summarised (a
  conversation may hold giant messages); no room within 5 s: the job is dropped.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec

from storage import PathNode

from ..background import Background
from ..builder import path_weight
from ..dialects import message_path
from ..limits import ServerBusy, holding

if TYPE_CHECKING:
    from .compactor import Compactor
    from .results import CompactionResult, Prepared

__all__ = ["READY_FOR", "READY_MOST", "BackgroundCompactions", "Job"]

log = logging.getLogger("branchpoint.compaction")
_encode = msgspec.json.Encoder().encode

READY_FOR = 900.0  # seconds a summary made waits for its conversation's next call
READY_MOST = 256  # conversations whose summary waits so (the oldest goes first) ...
READY_BYTES = 64 << 20  # ... and the bytes they hold at most (the items they keep raw may be large)


@dataclass(slots=True)
class _Ready:
    """A summary made, waiting for its conversation's next call (``use_ready``)."""

    summarised_to: uuid.UUID  # the node whose path it summarises
    prepared: Prepared
    until: float  # (the loop's clock)
    size: int  # bytes it holds, about (READY_BYTES)
    applied: uuid.UUID | None = None  # the compaction node it made, once applied in the background


@dataclass(frozen=True, slots=True)
class Job:
    tenant: str
    conversation_id: str
    tree_id: uuid.UUID
    head: uuid.UUID  # the node whose path is summarised
    model: str
    client_key: str | None
    measured: bool = True  # the upstream reported the turn's usage above the soft threshold; else it estimates

    @property
    def key(self) -> tuple[str, str]:
        return self.tenant, self.conversation_id


class BackgroundCompactions:
    def __init__(self, compactor: Compactor, tasks: Background, *, give_up_after: float) -> None:
        self.compactor = compactor
        self.tasks = tasks
        self.give_up_after = give_up_after  # how long a finished summary waits for a call in flight
        self.waiting: dict[tuple[str, str], Job] = {}  # the newest request per conversation with a job running
        self.running: set[tuple[str, str]] = set()
        # summaries being written: a call above the hard threshold may take one over
        self.summarising: dict[tuple[str, str], tuple[uuid.UUID, asyncio.Future[Prepared | str]]] = {}
        # summaries made, for the conversation's next call: (the node summarised, the summary, until
        # when, the compaction node it made if it was applied)
        self.ready: dict[tuple[str, str], _Ready] = {}

    def request(self, job: Job) -> None:
        """Compact ``job``'s path in the background, now or after the job already running."""
        if job.key in self.running:
            self.waiting[job.key] = job
            return
        self.running.add(job.key)
        self.tasks.spawn(self._run(job))

    async def _run(self, job: Job) -> None:
        try:
            while True:
                compacted = await self._one(job)
                newer = self.waiting.pop(job.key, None)
                if compacted or newer is None:
                    return
                job = newer
        finally:
            self.running.discard(job.key)
            self.waiting.pop(job.key, None)

    async def _one(self, job: Job) -> bool:
        """Summarise ``job``'s path -- or take the summary made for an earlier node of it -- and
        apply it if nothing moved. Returns whether it compacted."""
        c = self.compactor
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Prepared | str] = loop.create_future()
        self.summarising[job.key] = (job.head, future)
        try:
            path = message_path(await c.tree.path(job.tree_id, job.head, tenant=job.tenant))
            later: list[PathNode] = []
            ready = self._ready_on(job.key, path)
            if ready is not None:
                # a summary made for an earlier node of this path: applied here, the nodes since
                # kept raw -- not paid for twice (a call above hard, meanwhile, finds none written)
                del self.summarising[job.key]
                future.set_result("reused")
                ids = [n.id for n in path]
                later = path[ids.index(ready.summarised_to) + 1:]
                prepared: Prepared | str = ready.prepared
            else:
                prepared = await self._prepare(job, path)
                future.set_result(prepared)
                if isinstance(prepared, str):
                    return False
                self._keep(job, prepared)  # (applied below or not: the next call may need it -- use_ready)
            del path
            assert not isinstance(prepared, str)
            give_up = loop.time() + self.give_up_after
            while True:
                state = await c.tree.conversation_state(job.tenant, job.conversation_id)
                if state is None:
                    outcome = "conversation_not_found"
                    break
                current, busy = state
                if prepared.taken_over:
                    outcome = "taken_over"  # a call above the hard threshold used this summary
                    break
                if current != job.head:
                    outcome = "moved"  # a turn or a head move came first: it wins (the next call may use it)
                    break
                if busy:  # a call is in flight; if it leaves the head where it is, apply then
                    if loop.time() > give_up:
                        outcome = "busy"
                        break
                    await asyncio.sleep(0.05)
                    continue
                result = await c.summaries.write(prepared, tenant=job.tenant, conversation_id=job.conversation_id,
                                                 tree_id=job.tree_id, mode="background", trigger="soft",
                                                 compacted_from=job.head, later=later)
                if result.compacted:
                    entry = self.ready.get(job.key)
                    if entry is not None and entry.prepared is prepared and result.node is not None:
                        entry.applied = result.node.id
                    return True
                if result.reason not in ("moved", "busy"):
                    outcome = result.reason
                    break
            c.metrics.compactions.labels("soft", outcome).inc()
            # (the summary stays ready: a newer request, or the next call whose path holds the node, uses it)
            log.info("background compaction not applied", extra={"conversation_id": job.conversation_id,
                                                                  "outcome": outcome})
            return False
        except Exception:
            log.exception("background compaction failed", extra={"conversation_id": job.conversation_id})
            return False
        finally:
            if not future.done():
                future.set_result("failed")
            if self.summarising.get(job.key, (None, None))[1] is future:
                del self.summarising[job.key]

    async def _prepare(self, job: Job, path: list[PathNode]) -> Prepared | str:
        """The summary of ``job``'s path -- or why there is none."""
        c = self.compactor
        if not job.measured and not await c.above_soft(path, job.model):
            return "small"  # (no usage reported: the estimate says the path is still small)
        if await c.clearer.suffices(path, job.model):
            # the next call clears old tool results and is then under the soft threshold: no
            # summary (a model call, and a new prefix for the provider's cache) is needed
            c.metrics.compactions.labels("soft", "left_to_clearing").inc()
            return "left_to_clearing"
        try:
            async with holding(path_weight(path)):  # (max_bytes_in_flight: a request's path counts too)
                return await c.summaries.prepare(path, job.model, job.client_key, "soft")
        except ServerBusy:
            c.metrics.compactions.labels("soft", "busy").inc()
            log.info("background compaction dropped: no room under max_bytes_in_flight",
                     extra={"conversation_id": job.conversation_id})
            return "busy"

    def _keep(self, job: Job, prepared: Prepared) -> None:
        self.ready.pop(job.key, None)
        size = len(prepared.first_request) + len(_encode([prepared.system, prepared.summary, prepared.recent]))
        if size > READY_BYTES // 8:
            return  # (a path of giant items: not held for later)
        while self.ready and (len(self.ready) >= READY_MOST
                              or sum(e.size for e in self.ready.values()) + size > READY_BYTES):
            del self.ready[next(iter(self.ready))]
        self.ready[job.key] = _Ready(job.head, prepared, asyncio.get_running_loop().time() + READY_FOR, size)

    def _ready_on(self, key: tuple[str, str], path: Sequence[PathNode]) -> _Ready | None:
        """The summary made for this conversation, if ``path`` still holds the node it summarised."""
        entry = self.ready.get(key)
        if entry is None:
            return None
        if asyncio.get_running_loop().time() > entry.until:
            del self.ready[key]
            return None
        if not any(n.id == entry.summarised_to for n in path):
            return None  # the path went through it, or is another branch
        applied = entry.applied
        if applied is not None and any(n.parent_id == applied for n in path):
            return None  # (the path through the compaction it made, unfolded for a provider that cannot read it)
        return entry

    async def use_ready(self, *, tenant: str, conversation_id: str, tree_id: uuid.UUID, kind: str,
                        path: Sequence[PathNode], call_node: uuid.UUID) -> CompactionResult | None:
        """Apply the summary a background job made for this conversation, when ``path`` still
        holds the node it summarised (the call's path went on from there without it): the call
        hangs under it, the nodes since kept raw. None when there is none to use."""
        key = (tenant, conversation_id)
        entry = self._ready_on(key, path)
        if entry is None:
            return None
        state = await self.compactor.tree.conversation_state(tenant, conversation_id)
        if state is None or state[0] != path[-1].id:
            return None  # not a call that continues from the head (an edit, a regeneration): it stays beside
        result = await self._for_call(entry.prepared, entry.summarised_to, path, tenant=tenant,
                                      conversation_id=conversation_id, tree_id=tree_id, kind=kind,
                                      call_node=call_node, trigger="soft")
        if result is None:
            return None
        if self.ready.get(key) is entry:
            del self.ready[key]
        return result

    async def take_over(self, *, tenant: str, conversation_id: str, tree_id: uuid.UUID, kind: str,
                        path: Sequence[PathNode], call_node: uuid.UUID) -> CompactionResult | None:
        """Use the summary a background job is writing for this path, if there is one."""
        pending = self.summarising.get((tenant, conversation_id))
        if pending is None:
            return None
        summarised_to, future = pending
        ids = [n.id for n in path]
        if summarised_to not in ids:
            return None  # it summarises another branch
        try:
            prepared = await asyncio.wait_for(asyncio.shield(future), timeout=120)
        except TimeoutError:
            return None
        if isinstance(prepared, str):
            return None
        result = await self._for_call(prepared, summarised_to, path, tenant=tenant, conversation_id=conversation_id,
                                      tree_id=tree_id, kind=kind, call_node=call_node, trigger="hard")
        if result is None:
            return None
        prepared.taken_over = True
        return result

    async def _for_call(self, prepared: Prepared, summarised_to: uuid.UUID, path: Sequence[PathNode], *, tenant: str,
                        conversation_id: str, tree_id: uuid.UUID, kind: str, call_node: uuid.UUID,
                        trigger: str) -> CompactionResult | None:
        """Write ``prepared`` (a summary of the path to ``summarised_to``) for a call on ``path``:
        the compaction node replaces the whole path, the nodes after ``summarised_to`` kept raw,
        and the call hangs under it. None when it could not be written."""
        ids = [n.id for n in path]
        result = await self.compactor.summaries.write(prepared, tenant=tenant, conversation_id=conversation_id,
                                                      tree_id=tree_id, mode=kind, trigger=trigger,
                                                      compacted_from=path[-1].id,
                                                      later=path[ids.index(summarised_to) + 1:], call_node=call_node)
        return result if result.compacted else None
