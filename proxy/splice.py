"""Assembly without re-encoding (docs/architecture.md#the-path-cache): the same messages as
``assembly.assemble`` + ``build_body``, byte for byte, for a path whose nodes are kept in the path
cache. Pure functions, no I/O.

Each kept node gets, once per target, a ``Segment``: its non-system items shaped for the target
and encoded (``msgspec.Raw``, spliced into the body as they are), plus what assembly needs to
know about the path through it -- the system messages in effect, and the pairing check's state.

Why the pairing check can be done on a short tail: ``pair_check`` reads the items left to right,
and at any item that is not a ``tool`` result it starts afresh (a run of results ends there). So
the check of a whole list is the check of the part before such an item followed by the check
of the rest. A segment remembers whether everything before the last non-tool item of its path
passed unchanged (``clean``) and the items from there on (``tail``); a call then checks only
``tail`` + its new items.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from .assembly import PathLike, Target, node_items, pair_check, split_system, strip, system_sent

__all__ = ["EMPTY", "Prefix", "Segment", "segment", "splice"]

_encode_sorted = msgspec.json.Encoder(order="sorted").encode


@dataclass(frozen=True, slots=True)
class Segment:
    """What a node adds for one target, and the state of the path through it."""

    system: list[dict[str, Any]]  # the system/developer messages in effect after this node
    tail: list[Any]  # the path's items from its last non-tool item on
    tail_raws: list[msgspec.Raw]  # those items encoded
    clean: bool  # the pairing check changes nothing before ``tail``
    settled: list[msgspec.Raw]  # this node's contribution to the part before ``tail``, encoded
    marked: bool = False  # a cache_control marker on the path through it (a chat client's: not sent again)


@dataclass(frozen=True, slots=True)
class Prefix:
    """The encoded items of a whole path before its tail, joined: spliced in as one piece."""

    joined: bytes  # items separated by commas, no brackets ("" for none)
    count: int

    def extend(self, settled: list[msgspec.Raw]) -> Prefix:
        if not settled:
            return self
        more = b",".join(settled)
        return Prefix(self.joined + b"," + more if self.count else more, self.count + len(settled))


EMPTY = Prefix(b"", 0)


def segment(node: PathLike, before: Segment | None, target: Target) -> Segment:
    """The segment of ``node`` for ``target``, after its parent's segment ``before``."""
    node_system, items = node_items(node, target)
    encoded = [_encode_sorted(x) for x in strip(items)] if items else []
    raws = [msgspec.Raw(x) for x in encoded]
    combined = (before.tail if before else []) + items
    combined_raws = (before.tail_raws if before else []) + raws
    cut = len(combined) - 1
    while cut >= 0 and _role(combined[cut]) == "tool":
        cut -= 1
    clean = before.clean if before else True
    if cut > 0 and clean:
        clean = not pair_check(combined[:cut])[1]
    cut = max(cut, 0)
    system = node_system or (before.system if before else [])
    marked = (before.marked if before else False) or any(b'"cache_control"' in x for x in encoded) or (
        bool(node_system) and b'"cache_control"' in _encode_sorted(node_system))
    return Segment(system, combined[cut:], combined_raws[cut:], clean, combined_raws[:cut], marked)


def splice(prefix: Prefix, last: Segment, new_items: Sequence[dict[str, Any]], *,
           system_at: Sequence[int] | None = None) -> tuple[list[Any], list[dict[str, Any]]] | None:
    """(the upstream ``messages``, what the pairing check dropped) for a path whose encoded
    prefix is ``prefix`` and whose last node's segment is ``last``, and the call's new items;
    None when the path's own pairing is not clean, or a stored message holds a cache_control
    marker, which only the call that put it there sends (then assemble it the slow way).
    ``system_at`` as ``assemble`` takes it: only None (the system rule) or empty (a full-history
    call without system messages: none sent) -- a layout of the client's own is assembled."""
    if not last.clean or last.marked:
        return None
    new_system, new_rest = split_system(new_items)
    kept, dropped = pair_check(last.tail + new_rest)
    middle = [msgspec.Raw(prefix.joined)] if prefix.count else []
    system = system_sent(new_system, last.system, system_at)
    return strip(system) + middle + strip(kept), dropped


def _role(item: Any) -> Any:
    return item.get("role") if isinstance(item, dict) else None

