"""Assembly (docs/behaviour.md#assembly): the upstream ``messages`` of a call, from the path (root first) and the
call's new items. Pure functions over plain data -- no I/O, tested without a database.

Rules, in order:
1. each node on the path contributes its ``sent`` items, then -- only if it succeeded -- its
   ``received`` items, shaped for the provider they are sent to (``shape_received``);
2. the new items are appended;
3. system rule: system/developer messages are not repeated in place; the most recent ones found
   (this call's, if it sent any, else those of the last node that sent any) go first, once --
   except in a full-history call that had them elsewhere (``SYSTEM_AT``): they go back where the
   client put them, counted from the end (an agent's trailing reminder stays last);
4. pairing check: tool results must directly follow the assistant message whose calls they
   answer; a call without its result there, a result anywhere else and a second result for the
   same call are dropped -- and reported, because on the normal path this changes nothing.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec

from .key_order import encode_sorted

__all__ = [
    "CARRIED",
    "CHAT_ROLES",
    "KEPT",
    "OPAQUE",
    "READABLE_REASONING",
    "SYSTEM_AT",
    "Assembled",
    "PathLike",
    "Target",
    "assemble",
    "build_body",
    "carried",
    "carried_items",
    "node_items",
    "pair_check",
    "path_items",
    "shape_received",
    "split_system",
    "strip",
    "system_positions",
    "system_positions_at",
    "system_sent",
    "uncarry",
]

NATIVE = "_bp_"  # the prefix of keys a dialect attaches to a message it read (its own items, their producer)
# (in a full-history call's params) where its system/developer messages were: for each, how many
# other messages followed it -- only when one of them was not at the start
SYSTEM_AT = "_bp_system_at"
# On an item of a compaction node: an answer carried over whole from the path it replaces (its
# reasoning of every kind included), whose value names the provider that produced it ("": none
# known). Assembly shapes it for each later call's provider like any answer (``node_items``): a
# provider that needs its signed reasoning back mid tool loop gets it; another provider does not.
CARRIED = "_bp_carried"
SYSTEM_ROLES = frozenset({"system", "developer"})
CHAT_ROLES = SYSTEM_ROLES | {"user", "assistant", "tool", "function"}  # what a chat message may be

# Fields of a returned assistant message that any OpenAI-compatible provider accepts back.
_PORTABLE = ("role", "content", "name", "tool_calls", "function_call", "refusal")
# Readable reasoning: only for providers that accept it back (``accepts_reasoning``).
READABLE_REASONING = ("reasoning_content", "reasoning")  # (chat fields a message carries it in)
# Opaque / provider-signed reasoning: only back to the very provider that produced it.
OPAQUE = ("reasoning_details", "thinking_blocks", "encrypted_content")
# What a translated answer kept of its producer's (proxy/dialects/signed.py: a tool call's
# signature, signed reasoning, which a Responses item or an Anthropic block has no place for),
# read back onto its message: a list of {"producer", "calls": {call id: {field: value}},
# "message": {field: value}}. It goes to that producer only, as the fields it stands for would
# (``unkept``) -- whether the message is an answer stored or one a client sent again.
KEPT = "_bp_kept"
# A tool call's own signed reasoning (Gemini's ``extra_content: {google: {thought_signature}}``):
# back to the very provider that produced it -- whether or not it ``accepts_reasoning``, since
# Gemini refuses a call whose earlier function calls come back without their signatures.
_SIGNED_CALL = ("extra_content",)


class PathLike(Protocol):
    """What assembly reads of a path node (``storage.PathNode`` fits)."""

    @property
    def status(self) -> str: ...
    @property
    def sent(self) -> list[dict[str, Any]]: ...
    @property
    def received(self) -> list[dict[str, Any]] | None: ...
    @property
    def provider(self) -> str | None: ...


@dataclass(frozen=True, slots=True)
class Target:
    """The provider a request goes to, and the API it speaks (chat | responses)."""

    provider: str
    accepts_reasoning: bool = False
    api: str = "chat"
    max_output: int | None = None  # the model's most output tokens (configured): a translated call asks no more


@dataclass(slots=True)
class Assembled:
    messages: list[dict[str, Any]]
    dropped: list[dict[str, Any]] = field(default_factory=list)  # pairing-check removals


def _shape_tool_call(tc: Any, signed: bool) -> Any:
    """A stored tool call as it may go back: id, type and function; ``signed`` (its producer is
    the target): its signed reasoning too (``_SIGNED_CALL``)."""
    if not isinstance(tc, dict):
        return tc
    kept = ("id", "type", "function", *_SIGNED_CALL) if signed else ("id", "type", "function")
    out = {k: tc[k] for k in kept if k in tc and tc[k] is not None}
    fn = out.get("function")
    if isinstance(fn, dict):
        out["function"] = {k: fn[k] for k in ("name", "arguments") if k in fn}
    out.setdefault("type", "function")
    return out


def _audio(msg: dict[str, Any], target: Target, producer: str | None, out: dict[str, Any]) -> None:
    """An audio answer (OpenAI's ``audio: {id, data, expires_at, transcript}``) as it may go back:
    to the chat provider that made it, while it keeps it (until ``expires_at``; none said: not
    kept), as the reference ``{"id"}`` its API takes; to any other, or once expired, its transcript
    as the content -- what the model said, never an empty turn. (The one impure rule here: it
    reads the clock.)"""
    audio = msg.get("audio")
    if not isinstance(audio, dict):
        return
    reference, expires = audio.get("id"), audio.get("expires_at")
    if isinstance(reference, str) and reference and producer == target.provider and target.api == "chat" \
            and type(expires) is int and expires > time.time():
        out["audio"] = {"id": reference}
    elif not out.get("content") and isinstance(audio.get("transcript"), str) and audio["transcript"]:
        out["content"] = audio["transcript"]


def shape_received(msg: dict[str, Any], target: Target, producer: str | None) -> dict[str, Any]:
    """A returned assistant message as it may be sent back to ``target``: portable fields only,
    nulls dropped, reasoning kept only where the target accepts it (opaque reasoning only to the
    provider that produced it; a tool call's signature to that provider whatever it accepts), an
    audio answer as ``_audio`` gives it."""
    out: dict[str, Any] = {}
    keep_reasoning = target.accepts_reasoning
    keep_opaque = keep_reasoning and producer == target.provider
    for key, value in msg.items():
        if value is None:
            continue
        if key in _PORTABLE or (key in READABLE_REASONING and keep_reasoning) or (key in OPAQUE and keep_opaque) \
                or key.startswith(NATIVE):
            out[key] = value
    if "tool_calls" in out:
        calls = out["tool_calls"]
        if isinstance(calls, list) and calls:
            signed = producer == target.provider
            out["tool_calls"] = [_shape_tool_call(tc, signed) for tc in calls]
        else:
            del out["tool_calls"]
    _audio(msg, target, producer, out)
    out.setdefault("role", "assistant")
    if "content" not in out:
        # null content is valid next to tool calls / a refusal / audio; an otherwise empty turn gets ""
        out["content"] = None if ("tool_calls" in out or "function_call" in out or "refusal" in out
                                  or "audio" in out) else ""
    return out


def _role(item: Any) -> Any:
    role = item.get("role") if isinstance(item, dict) else None
    return role if type(role) is str else None  # (a client's role may be anything: a list too)


def _key(value: Any) -> Any:
    """A tool call's id as a set member: a client's id may be anything, a list too."""
    return value if value is None or type(value) in (str, int, float, bool) else msgspec.json.encode(value)


def pair_check(items: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The rule the OpenAI API enforces: the messages right after an assistant message with
    ``tool_calls`` are the ``tool`` results of those calls (any order), before any other message.
    Dropped: a call whose result is not in that run, a result that is not in the run right after
    its call, a second result for the same call (and an assistant message left with neither
    content nor calls). Returns (kept, dropped); ``dropped`` lists what went and why."""
    kept: list[dict[str, Any]] = []
    dropped: list[dict[str, Any]] = []
    i, n = 0, len(items)
    while i < n:
        item = items[i]
        role = _role(item)
        if role == "tool":
            dropped.append({"tool_call_id": item.get("tool_call_id"), "reason": "tool result not right after its call"})
            i += 1
            continue
        if role != "assistant" or not item.get("tool_calls"):
            kept.append(item)
            i += 1
            continue
        calls = [tc for tc in item["tool_calls"] if isinstance(tc, dict)] if isinstance(item["tool_calls"], list) else []
        ids = {_key(tc.get("id")) for tc in calls}
        results: dict[Any, dict[str, Any]] = {}
        j = i + 1
        while j < n and _role(items[j]) == "tool":
            tid = _key(items[j].get("tool_call_id"))
            if tid in ids and tid not in results:
                results[tid] = items[j]
            else:
                reason = "a second result for the same call" if tid in results else "tool result not right after its call"
                dropped.append({"tool_call_id": items[j].get("tool_call_id"), "reason": reason})
            j += 1
        good = [tc for tc in calls if _key(tc.get("id")) in results]
        for tc in calls:
            if _key(tc.get("id")) not in results:
                dropped.append({"tool_call_id": tc.get("id"), "reason": "tool call without a result"})
        if isinstance(item["tool_calls"], list) and len(good) == len(item["tool_calls"]):
            kept.append(item)
        else:
            trimmed = {k: v for k, v in item.items() if k != "tool_calls"}
            if good:
                trimmed["tool_calls"] = good
                kept.append(trimmed)
            elif trimmed.get("content") or trimmed.get("refusal"):
                kept.append(trimmed)
            else:
                dropped.append({"message": "assistant", "reason": "empty after dropping its tool calls"})
        kept.extend(r for r in items[i + 1:j] if results.get(_key(r.get("tool_call_id"))) is r)
        i = j
    return kept, dropped


def split_system(items: Iterable[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(system/developer messages, every other item), each in order."""
    system: list[dict[str, Any]] = []
    rest: list[dict[str, Any]] = []
    for item in items:
        (system if _role(item) in SYSTEM_ROLES else rest).append(item)
    return system, rest


def uncarry(item: Any, target: Target) -> Any:
    """A compaction node's item as ``target`` gets it: a carried answer shaped for it."""
    if not isinstance(item, dict) or CARRIED not in item:
        return item
    producer = item[CARRIED]
    return shape_received({k: v for k, v in item.items() if k != CARRIED}, target, producer or None)


def node_items(node: PathLike, target: Target) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Rule 1 for one node: (its system/developer messages, its other items -- ``sent``, then
    ``received`` if it succeeded -- shaped for ``target``)."""
    node_system, items = split_system(node.sent)
    if getattr(node, "kind", None) == "compaction":  # (only a compaction node carries answers)
        items = [uncarry(m, target) for m in items]
    if node.status == "success" and node.received:
        items = items + [shape_received(m, target, node.provider) for m in node.received if isinstance(m, dict)]
    return node_system, unkept(items, target)


def unkept(items: list[dict[str, Any]], target: Target) -> list[dict[str, Any]]:
    """``items`` with what a translated answer kept (``KEPT``) given back to its producer only: on
    a call it names, the call's own fields; on the message, its opaque reasoning where ``target``
    takes reasoning back -- as ``shape_received`` shapes an answer. Another provider gets none of it."""
    if not any(type(m) is dict and KEPT in m for m in items):
        return items
    out = []
    for m in items:
        if type(m) is not dict or KEPT not in m:
            out.append(m)
            continue
        message = {k: v for k, v in m.items() if k != KEPT}
        for kept in m[KEPT] if isinstance(m[KEPT], list) else ():
            if not isinstance(kept, dict) or kept.get("producer") != target.provider:
                continue
            calls = kept.get("calls") if isinstance(kept.get("calls"), dict) else {}
            if calls and isinstance(message.get("tool_calls"), list):
                message["tool_calls"] = [
                    {**tc, **{k: v for k, v in calls[tc["id"]].items() if k in _SIGNED_CALL}}
                    if isinstance(tc, dict) and isinstance(tc.get("id"), str) and isinstance(calls.get(tc["id"]), dict)
                    else tc for tc in message["tool_calls"]]
            said = kept.get("message") if isinstance(kept.get("message"), dict) else {}
            if target.accepts_reasoning:
                message.update({k: v for k, v in said.items() if k in OPAQUE})
        out.append(message)
    return out


def path_items(path: Iterable[PathLike], target: Target) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Rule 1 and the system rule over a path: (the most recent system/developer messages,
    every other item root first -- ``sent``, then ``received`` of nodes that succeeded)."""
    system: list[dict[str, Any]] = []
    body: list[dict[str, Any]] = []
    for node in path:
        node_system, node_rest = node_items(node, target)
        if node_system:
            system = node_system
        body.extend(node_rest)
    return system, body


def carried(node: PathLike) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(system/developer messages, other items) of one node as a compaction node keeps them: its
    ``sent`` items as they are, its answers as their producer would get them back (every kind of
    reasoning kept, ``shape_received``) and marked ``CARRIED`` with it -- so the compaction node
    can still be sent to any provider, each getting what it accepts back."""
    node_system, items = split_system(node.sent)
    if node.status == "success" and node.received:
        producer = node.provider or ""
        whole = Target(producer, accepts_reasoning=True)  # (what its producer takes back: everything)
        items = items + [{**shape_received(m, whole, producer), **_audio_kept(m), CARRIED: producer}
                         for m in node.received if isinstance(m, dict)]
    return node_system, items


def _audio_kept(msg: dict[str, Any]) -> dict[str, Any]:
    """What a carried audio answer keeps of its audio: all ``_audio`` reads to shape it for each
    later call (its id, expiry and transcript; not its data)."""
    audio = msg.get("audio")
    if not isinstance(audio, dict):
        return {}
    return {"audio": {k: audio[k] for k in ("id", "expires_at", "transcript") if k in audio}}


def carried_items(path: Iterable[PathLike]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``path_items`` as a compaction node keeps them (``carried``)."""
    system: list[dict[str, Any]] = []
    body: list[dict[str, Any]] = []
    for node in path:
        node_system, node_rest = carried(node)
        if node_system:
            system = node_system
        body.extend(node_rest)
    return system, body


def system_sent(new_system: list[dict[str, Any]], path_system: list[dict[str, Any]],
                system_at: Sequence[int] | None) -> list[dict[str, Any]]:
    """The system rule: the call's own system messages, else those in effect on the path -- but
    none for a full-history call that sent none (``system_at`` empty: the path's are not the
    client's)."""
    return new_system or ([] if system_at is not None and not system_at else path_system)


def assemble(path: Iterable[PathLike], new_items: Sequence[dict[str, Any]], target: Target,
             system_at: Sequence[int] | None = None) -> Assembled:
    """The upstream ``messages`` for a call whose parent's path is ``path`` (root first);
    ``system_at``: where a full-history call had its system messages (``system_positions``; empty:
    it had none, and none is sent -- the path's are not the client's)."""
    system, body = path_items(path, target)
    new_system, new_rest = split_system(new_items)
    new_rest = unkept(new_rest, target)
    kept, dropped = pair_check(body + new_rest)
    system = system_sent(new_system, system, system_at)
    if system_at and len(system_at) == len(system):
        return Assembled(_placed(system, kept, system_at), dropped)
    return Assembled(system + kept, dropped)


def system_positions(messages: Sequence[Any]) -> list[int] | None:
    """For each system/developer message of a client's history, how many other messages follow it;
    None when they all come first (the system rule's own layout)."""
    after: list[int] = []
    rest = 0
    for m in reversed(messages):
        if _role(m) in SYSTEM_ROLES:
            after.append(rest)
        else:
            rest += 1
    after.reverse()
    return after if any(a != rest for a in after) else None


def system_positions_at(system: Sequence[int], count: int) -> list[int] | None:
    """``system_positions`` of ``count`` messages whose system/developer ones are at the indexes
    ``system`` (in order)."""
    rest = count - len(system)
    after = [rest - (i - j) for j, i in enumerate(system)]
    return after if any(a != rest for a in after) else None


def _placed(system: list[dict[str, Any]], messages: list[dict[str, Any]], after: Sequence[int]) -> list[dict[str, Any]]:
    """System messages put back among ``messages``, each before the last ``after[i]`` of them
    (first when it came before more than there are now: compaction summarised where it was)."""
    n = len(messages)
    at = [max(0, n - a) for a in after]
    out: list[dict[str, Any]] = []
    k = 0
    for i, m in enumerate(messages):
        while k < len(system) and at[k] <= i:
            out.append(system[k])
            k += 1
        out.append(m)
    out.extend(system[k:])
    return out


def strip(messages: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as a chat upstream gets them: without the native keys a dialect attached."""
    return [{k: v for k, v in m.items() if not k.startswith(NATIVE)} if any(k.startswith(NATIVE) for k in m) else m
            for m in messages]


def build_body(params: dict[str, Any], messages: list[dict[str, Any]], *, stream: bool) -> bytes:
    """The exact bytes sent upstream: the client's other fields untouched, the assembled
    ``messages``, and -- for a stream -- ``stream_options.include_usage`` so usage is captured.

    Keys are sorted: the body is then a pure function of values that survive a round trip
    through PostgreSQL's ``jsonb``, so ``GET /admin/nodes/{id}/request`` can rebuild it byte for
    byte and check it against the stored hash -- but for the objects whose key order the client's
    fields recorded (``key_order``: a schema's properties keep the client's order)."""
    body = dict(params)
    body["messages"] = messages
    if stream:
        options = body.get("stream_options")
        options = dict(options) if isinstance(options, dict) else {}
        options["include_usage"] = True
        body["stream_options"] = options
    return encode_sorted(body)
