"""Compaction (SPEC §5): when a path grows too long, its older part is summarised into a
compaction node -- ``kind = compaction``, no parent, ``compacted_from`` = the node it replaces --
whose ``sent`` is the most recent system prompt, one summary message and the last
``keep_recent`` messages raw. Assembly stops at it; nothing before it is deleted.

When:
- ``hard``: before a call whose estimated input is above ``hard`` x the model's input limit,
  synchronously; the call's node is hung under the new compaction node;
- ``soft``: after a successful turn above ``soft`` x the input limit, in the background -- the
  response never waits for it, and it is applied only if the head is still where it started and
  no turn is in flight (otherwise it is dropped: nothing was written);
- ``admin``: ``POST /admin/conversations/{id}/compact``.

The summary is held to ``summary_budget`` x the input limit: a longer one is summarised again,
then cut. A failed summarisation changes nothing. The whole result is written by one statement
(``bp_apply_compaction``), so a process that stops mid-way leaves no trace.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from storage import PathNode, uuid7

from .assembly import Target, build_body, path_items
from .errors import ConversationBusy, UpstreamFailure
from .tokens import estimate_request

if TYPE_CHECKING:
    from .services import Services

__all__ = ["CompactionResult", "Compactor", "render_transcript", "split_recent", "summariser_messages"]

log = logging.getLogger("branchpoint.compaction")

_decode = msgspec.json.Decoder().decode

SUMMARY_PREFIX = (
    "Summary of the earlier part of this conversation (older messages were compacted into it; "
    "the most recent messages follow verbatim):\n\n"
)

_SYSTEM = (
    "You compress the earlier part of a conversation between a user and an AI assistant into a "
    "summary that replaces it in the assistant's context. The most recent messages are kept "
    "verbatim and are not shown to you. Keep everything a later answer may need: facts, figures "
    "and numbers exactly as given, names and identifiers, decisions made and why, the user's "
    "goals, constraints and preferences, open tasks and unanswered questions, and the results of "
    "tool calls that still matter (with their key values). Drop greetings and repetition. Write "
    "compact notes in the language of the conversation. Stay under {budget} tokens."
)
_SHORTEN = (
    "This summary is about {tokens} tokens; the limit is {budget}. Rewrite it shorter, keeping "
    "facts, figures, names, decisions and open tasks:\n\n{summary}"
)

# a neutral target: kept raw items are stored provider-neutral (no reasoning, no opaque items),
# so a compaction node can be sent to any provider
_PORTABLE = Target("", accepts_reasoning=False)


def _is_summary(item: Any) -> bool:
    return _role(item) == "user" and isinstance(item.get("content"), str) and item["content"].startswith(SUMMARY_PREFIX)


def _role(item: Any) -> Any:
    return item.get("role") if isinstance(item, dict) else None


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict):
                if isinstance(part.get("text"), str):
                    parts.append(part["text"])
                elif part.get("type") in ("image_url", "input_image"):
                    parts.append("[image]")
                else:
                    parts.append(msgspec.json.encode(part).decode())
        return "\n".join(parts)
    return "" if content is None else msgspec.json.encode(content).decode()


def render_transcript(items: Sequence[dict[str, Any]]) -> str:
    """The items as a plain-text transcript for the summariser (any provider reads it)."""
    lines = []
    for item in items:
        role = _role(item) or "item"
        if role == "tool":
            lines.append(f"[tool result {item.get('tool_call_id', '')}]\n{_text(item.get('content'))}")
            continue
        text = _text(item.get("content"))
        if text:
            lines.append(f"[{role}]\n{text}")
        for call in item.get("tool_calls") or ():
            fn = call.get("function") or {}
            lines.append(f"[{role} calls tool {fn.get('name')} ({call.get('id')})]\n{fn.get('arguments', '')}")
        if item.get("refusal"):
            lines.append(f"[{role} refused]\n{item['refusal']}")
    return "\n\n".join(lines)


def summariser_messages(transcript: str, budget: int) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": _SYSTEM.format(budget=budget)},
        {"role": "user", "content": f"The conversation so far:\n\n{transcript}"},
    ]


def split_recent(items: Sequence[dict[str, Any]], keep: int,
                 pinned_calls: frozenset[Any] = frozenset()) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(older, recent): the last ``keep`` items stay raw, moved back so that no tool result is
    separated from the call it answers, and no call in ``pinned_calls`` (answered by items that
    come later, outside ``items``) leaves the raw part."""
    s = max(0, len(items) - keep)
    while True:
        calls_in_older: dict[Any, int] = {}
        for i in range(s):
            calls = items[i].get("tool_calls") if isinstance(items[i], dict) else None
            for call in calls or ():
                if isinstance(call, dict):
                    calls_in_older[call.get("id")] = i
        needed = [calls_in_older[c] for c in pinned_calls if c in calls_in_older]
        needed += [calls_in_older[item.get("tool_call_id")] for item in items[s:]
                   if _role(item) == "tool" and item.get("tool_call_id") in calls_in_older]
        if not needed:
            return list(items[:s]), list(items[s:])
        s = min(needed)


def _unanswered_tail_calls(body: Sequence[dict[str, Any]]) -> frozenset[Any]:
    """Tool calls of the last assistant message that have no result yet (a turn between rounds)."""
    for item in reversed(body):
        if _role(item) == "assistant":
            answered = {i.get("tool_call_id") for i in body if _role(i) == "tool"}
            return frozenset(c.get("id") for c in item.get("tool_calls") or () if isinstance(c, dict)) - answered
    return frozenset()


@dataclass
class _Prepared:
    system: list[dict[str, Any]]
    summary: dict[str, Any]
    recent: list[dict[str, Any]]
    summarised_to: uuid.UUID
    model: str
    provider: str
    params: dict[str, Any]
    usage: dict[str, int]
    tokens: int
    compacted: int
    calls: int
    first_request: bytes  # the summariser's first request body, kept with the node
    taken_over: bool = False  # a call crossing the hard threshold wrote it


@dataclass
class CompactionResult:
    compacted: bool
    reason: str = ""
    node: PathNode | None = None
    summary_tokens: int = 0
    kept_messages: int = 0
    compacted_messages: int = 0
    calls: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"object": "compaction", "compacted": self.compacted}
        if self.compacted and self.node is not None:
            out.update(node_id=str(self.node.id), compacted_from=str(self.node.compacted_from),
                       summary_tokens=self.summary_tokens, kept_messages=self.kept_messages,
                       compacted_messages=self.compacted_messages)
        else:
            out["reason"] = self.reason
        return out


class Compactor:
    def __init__(self, services: Services) -> None:
        self.s = services
        self.running: set[tuple[str, str]] = set()  # background compactions of this process
        # summaries being written in the background: a call that crosses the hard threshold
        # meanwhile takes this one over instead of asking the summariser a second time
        self.summarising: dict[tuple[str, str], tuple[uuid.UUID, asyncio.Future[_Prepared | str]]] = {}

    # -- thresholds ----------------------------------------------------------------------------

    def limits(self, model: str) -> tuple[int, int, int]:
        """(input limit, hard threshold, soft threshold) in tokens for ``model``."""
        limit = self.s.settings.limits_for(model).input_limit
        c = self.s.settings.compaction
        return limit, int(limit * c.hard), int(limit * c.soft)

    # -- the summariser ------------------------------------------------------------------------

    async def _summarise(self, messages: list[dict[str, Any]], model: str, client_key: str | None,
                         usage: dict[str, int], sent: list[bytes]) -> str:
        """One summariser call; adds its usage to ``usage`` and its request body to ``sent``."""
        upstream = self.s.upstream.route(model)
        payload = build_body({"model": model, "temperature": 0}, messages, stream=False)
        sent.append(payload)
        headers = self.s.upstream.request_headers(upstream, [("content-type", "application/json")], client_key)
        request = self.s.upstream.build("POST", upstream, "chat/completions", headers=headers, content=payload)
        response = await self.s.upstream.send(request)
        if response.status_code != 200:
            raise UpstreamFailure(f"the summariser answered HTTP {response.status_code}")
        try:
            data = _decode(response.content)
            text = data["choices"][0]["message"]["content"]
        except (msgspec.DecodeError, RecursionError, KeyError, IndexError, TypeError) as exc:
            raise UpstreamFailure(f"the summariser's answer is not a completion ({type(exc).__name__})") from None
        if not isinstance(text, str) or not text.strip():
            raise UpstreamFailure("the summariser returned no text")
        for key, value in (data.get("usage") or {}).items():
            if isinstance(value, int):
                usage[key] = usage.get(key, 0) + value
        return text.strip()

    async def _summary(self, older: list[dict[str, Any]], model: str, client_key: str | None, budget: int,
                       usage: dict[str, int], sent: list[bytes]) -> tuple[str, int, int]:
        """(summary text, its tokens, summariser calls) -- held to ``budget``."""
        counter = self.s.tokens
        limit, _, _ = self.limits(model)
        # what one summariser request may carry: its input limit less the prompt and a margin for
        # estimate error (the summary itself counts against the model's reserved output)
        room = max(1000, int(limit * 0.9) - 300)
        transcript = render_transcript(older)
        calls = 0
        if counter.text(transcript) > room:
            # too long for one request: summarise it in chunks, then the summaries together
            chunks, current, size = [], [], 0
            for item in older:
                n = counter.message(item)
                if current and size + n > room:
                    chunks.append(current)
                    current, size = [], 0
                current.append(item)
                size += n
            chunks.append(current)
            parts = []
            for chunk in chunks:
                parts.append(await self._summarise(summariser_messages(render_transcript(chunk), budget), model,
                                                   client_key, usage, sent))
                calls += 1
            transcript = "\n\n".join(f"[summary of part {i + 1}]\n{p}" for i, p in enumerate(parts))
        summary = await self._summarise(summariser_messages(transcript, budget), model, client_key, usage, sent)
        calls += 1
        tokens = counter.text(summary)
        if tokens > budget:
            summary = await self._summarise(
                [{"role": "user", "content": _SHORTEN.format(tokens=tokens, budget=budget, summary=summary)}],
                model, client_key, usage, sent)
            calls += 1
            tokens = counter.text(summary)
        if tokens > budget:
            summary = self._cut(summary, budget)
            tokens = counter.text(summary)
        return summary, tokens, calls

    def _cut(self, text: str, budget: int) -> str:
        """Cut ``text`` to at most ``budget`` tokens (binary search on characters)."""
        marker = " [...]"
        lo, hi = 0, len(text)
        counter = self.s.tokens
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if counter.text(text[:mid] + marker) <= budget:
                lo = mid
            else:
                hi = mid - 1
        return text[:lo] + marker

    # -- compacting a path ---------------------------------------------------------------------

    async def _prepare(self, path: Sequence[PathNode], model: str, client_key: str | None, trigger: str,
                       new_items: Sequence[dict[str, Any]] = ()) -> _Prepared | str:
        """Summarise the older part of ``path``; returns what to write, or why not."""
        c = self.s.settings.compaction
        summariser = c.model or model
        limit, _, _ = self.limits(model)
        budget = max(64, int(limit * c.summary_budget))
        system, body = path_items(path, _PORTABLE)
        pinned = frozenset(i.get("tool_call_id") for i in new_items if _role(i) == "tool") | _unanswered_tail_calls(body)
        older, recent = split_recent(body, c.keep_recent, pinned)
        if all(_is_summary(item) for item in older):  # nothing, or only the previous summary
            return "nothing_to_compact"
        usage: dict[str, int] = {}
        requests: list[bytes] = []
        try:
            summary, tokens, calls = await self._summary(older, summariser, client_key, budget, usage, requests)
        except Exception as exc:
            if not isinstance(exc, UpstreamFailure):
                log.exception("summarisation failed")
            self.s.metrics.compactions.labels(trigger, "failed").inc()
            log.warning("summarisation failed; nothing compacted", extra={"error": getattr(exc, "message", str(exc))})
            return "summarisation_failed"
        params = {
            "format": "text",
            "trigger": trigger,
            "summariser_model": summariser,
            "keep_recent": c.keep_recent,
            "summary_budget_tokens": budget,
            "summary_tokens": tokens,
            "compacted_messages": len(older),
            "summariser_calls": calls,
        }
        first_request = requests[0]
        return _Prepared(system, {"role": "user", "content": SUMMARY_PREFIX + summary}, recent, path[-1].id,
                         summariser, self.s.upstream.route(summariser).name, params, usage, tokens, len(older), calls,
                         first_request)

    async def _write(self, prepared: _Prepared, *, tenant: str, conversation_id: str, tree_id: uuid.UUID,
                     mode: str, trigger: str, compacted_from: uuid.UUID, later: Sequence[PathNode] = (),
                     call_node: uuid.UUID | None = None) -> CompactionResult:
        """Write the compaction node replacing the path up to ``compacted_from``: the summary,
        then raw the recent items and those of ``later`` nodes (added after the summarised path)."""
        system, extra = path_items(later, _PORTABLE)
        system = system or prepared.system
        recent = [*prepared.recent, *extra]
        sent = [*system, prepared.summary, *recent]
        node_id = uuid7()
        params = {**prepared.params, "kept_messages": len(recent)}
        outcome = await self.s.tree.apply_compaction(
            tenant=tenant, conversation_id=conversation_id, tree_id=tree_id, node_id=node_id,
            compacted_from=compacted_from, sent=sent, model=prepared.model, provider=prepared.provider,
            params=params, usage=prepared.usage or None,
            sent_hash=hashlib.sha256(msgspec.json.encode(sent, order="sorted")).digest(),
            mode=mode, call_node=call_node, request=prepared.first_request,
        )
        if outcome != "ok":
            return CompactionResult(False, outcome)
        self.s.metrics.compactions.labels(trigger, "ok").inc()
        log.info("compacted", extra={"conversation_id": conversation_id, "node_id": str(node_id), "trigger": trigger,
                                     "compacted_messages": prepared.compacted, "summary_tokens": prepared.tokens})
        node = PathNode(id=node_id, parent_id=None, kind="compaction", status="success", sent=sent, received=None,
                        provider=prepared.provider, model=prepared.model, usage=prepared.usage or None,
                        compacted_from=compacted_from)
        return CompactionResult(True, node=node, summary_tokens=prepared.tokens, kept_messages=len(recent),
                                compacted_messages=prepared.compacted, calls=prepared.calls)

    async def compact(self, *, tenant: str, conversation_id: str, tree_id: uuid.UUID, path: Sequence[PathNode],
                      model: str, client_key: str | None, mode: str, trigger: str,
                      call_node: uuid.UUID | None = None, new_items: Sequence[dict[str, Any]] = ()) -> CompactionResult:
        """Summarise the older part of ``path`` and write the compaction node in one go (``mode``:
        turn, transform or admin -- see ``bp_apply_compaction``). Never raises for an upstream
        failure: the result says why nothing was compacted."""
        if not path:
            return CompactionResult(False, "empty")
        prepared = await self._prepare(path, model, client_key, trigger, new_items)
        if isinstance(prepared, str):
            return CompactionResult(False, prepared)
        result = await self._write(prepared, tenant=tenant, conversation_id=conversation_id, tree_id=tree_id,
                                   mode=mode, trigger=trigger, compacted_from=path[-1].id, call_node=call_node)
        if not result.compacted:
            self.s.metrics.compactions.labels(trigger, result.reason).inc()
            log.info("compaction not applied", extra={"conversation_id": conversation_id, "outcome": result.reason})
        return result

    # -- the three triggers ---------------------------------------------------------------------

    def after_turn(self, *, tenant: str, conversation_id: str, tree_id: uuid.UUID, head: uuid.UUID, model: str,
                   usage: dict[str, Any] | None, client_key: str | None) -> bool:
        """After a successful turn: start a background compaction if the context it measured is
        above the soft threshold. Returns whether one was started. Never waits."""
        measured = None
        if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
            measured = usage["prompt_tokens"] + (usage.get("completion_tokens") or 0)
        if measured is None:
            return False
        _, _, soft = self.limits(model)
        key = (tenant, conversation_id)
        if measured <= soft or key in self.running:
            return False
        self.running.add(key)
        task = self.s.spawn(self._background(tenant, conversation_id, tree_id, head, model, client_key))
        task.add_done_callback(lambda _: self.running.discard(key))
        return True

    async def _background(self, tenant: str, conversation_id: str, tree_id: uuid.UUID, head: uuid.UUID,
                          model: str, client_key: str | None) -> None:
        """Summarise in the background, then apply it -- only if the head is still where it
        started and no call is in flight (SPEC §5); any head move, a new turn included, wins and
        the work is dropped. A call that crosses the hard threshold meanwhile takes the summary
        over instead (``_take_over``), so it is not lost on a fast tool loop."""
        key = (tenant, conversation_id)
        future: asyncio.Future[_Prepared | str] = asyncio.get_running_loop().create_future()
        self.summarising[key] = (head, future)
        try:
            path = await self.s.tree.path(tree_id, head)
            prepared = await self._prepare(path, model, client_key, "soft")
            future.set_result(prepared)
            if isinstance(prepared, str):
                return
            give_up = asyncio.get_running_loop().time() + max(30.0, self.s.settings.server.lease_seconds)
            while True:
                state = await self.s.tree.conversation_state(tenant, conversation_id)
                if state is None:
                    outcome = "conversation_not_found"
                    break
                current, busy = state
                if prepared.taken_over:
                    outcome = "taken_over"  # a call above the hard threshold used this summary
                    break
                if current != head:
                    outcome = "moved"  # a turn or a head move came first: it wins
                    break
                if busy:  # a call is in flight; if it leaves the head where it is, apply then
                    if asyncio.get_running_loop().time() > give_up:
                        outcome = "busy"
                        break
                    await asyncio.sleep(0.05)
                    continue
                result = await self._write(prepared, tenant=tenant, conversation_id=conversation_id, tree_id=tree_id,
                                           mode="background", trigger="soft", compacted_from=head)
                if result.compacted:
                    return
                if result.reason not in ("moved", "busy"):
                    outcome = result.reason
                    break
            self.s.metrics.compactions.labels("soft", outcome).inc()
            log.info("background compaction dropped", extra={"conversation_id": conversation_id, "outcome": outcome})
        except Exception:
            log.exception("background compaction failed", extra={"conversation_id": conversation_id})
        finally:
            if not future.done():
                future.set_result("failed")
            if self.summarising.get(key, (None, None))[1] is future:
                del self.summarising[key]

    async def before_call(self, *, tenant: str, conversation_id: str, tree_id: uuid.UUID, kind: str,
                          path: list[PathNode], new_items: Sequence[dict[str, Any]], model: str,
                          client_key: str | None, call_node: uuid.UUID, extra: Sequence[Any] = ()) -> CompactionResult | None:
        """Before a call: compact synchronously if the request would be above the hard threshold."""
        if not path:
            return None
        estimate = estimate_request(self.s.tokens, path, new_items, extra)
        _, hard, _ = self.limits(model)
        if estimate <= hard:
            return None
        taken = await self._take_over(tenant, conversation_id, tree_id, kind, path, call_node)
        if taken is not None:
            taken.extra["estimate_before"] = estimate
            return taken
        result = await self.compact(tenant=tenant, conversation_id=conversation_id, tree_id=tree_id, path=path,
                                    model=model, client_key=client_key, mode=kind, trigger="hard",
                                    call_node=call_node, new_items=new_items)
        result.extra["estimate_before"] = estimate
        return result

    async def _take_over(self, tenant: str, conversation_id: str, tree_id: uuid.UUID, kind: str,
                         path: Sequence[PathNode], call_node: uuid.UUID) -> CompactionResult | None:
        """Use the summary a background compaction of this path is writing, if there is one."""
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
        result = await self._write(prepared, tenant=tenant, conversation_id=conversation_id, tree_id=tree_id,
                                   mode=kind, trigger="hard", compacted_from=path[-1].id,
                                   later=path[ids.index(summarised_to) + 1:], call_node=call_node)
        if not result.compacted:
            return None
        prepared.taken_over = True
        return result

    async def compact_now(self, caller: Any, conv: Any) -> dict[str, Any]:
        """``POST /admin/conversations/{id}/compact``."""
        if conv["busy"]:
            raise ConversationBusy(f"conversation {conv['id']!r} has a turn call in flight")
        if conv["head_node_id"] is None:
            return CompactionResult(False, "empty").as_dict()
        path = await self.s.tree.path(conv["tree_id"], conv["head_node_id"])
        model = next((n.model for n in reversed(path) if n.kind != "compaction" and n.model), None)
        model = model or self.s.settings.compaction.model or "gpt-4o-mini"
        result = await self.compact(tenant=caller.tenant, conversation_id=conv["id"], tree_id=conv["tree_id"],
                                    path=path, model=model, client_key=caller.client_key, mode="admin",
                                    trigger="admin")
        if not result.compacted and result.reason in ("moved", "busy"):
            raise ConversationBusy(f"conversation {conv['id']!r} moved while compacting; retry")
        return result.as_dict()
