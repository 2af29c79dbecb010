"""What compacting hands back: ``Prepared``, a summary ready to be written as a compaction node
(what a background job may hand over to a call, ``background.py``), and ``CompactionResult``, what
a summary or a clearing did -- or why nothing was written -- with the shape the admin and
Responses APIs answer with (``as_dict``).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from storage import PathNode

__all__ = ["CompactionResult", "Prepared"]


@dataclass
class Prepared:
    """A summary ready to be written as a compaction node."""

    system: list[dict[str, Any]]
    summary: dict[str, Any]
    recent: list[dict[str, Any]]
    model: str
    provider: str
    params: dict[str, Any]
    usage: dict[str, int]
    tokens: int
    compacted: int
    calls: int
    first_request: bytes  # the summariser's first request body, kept with the node
    taken_over: bool = False  # a call crossing the hard threshold wrote it
    written: uuid.UUID | None = None  # the compaction node it was first written as (its usage counted there)


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
    method: str = "summary"  # or "clear_tool_results"
    cleared_results: int = 0  # (a clearing) tool results replaced by placeholders
    freed_tokens: int = 0  # (a clearing) about how many tokens that took out of the request
    clearing: CompactionResult | None = None  # (a summary) the clearing made before it for the same call

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"object": "compaction", "compacted": self.compacted}
        if self.compacted or self.method != "summary":  # (a summary not made: the shape it always had)
            out["method"] = self.method
        if self.compacted and self.node is not None:
            out.update(node_id=str(self.node.id), compacted_from=str(self.node.compacted_from))
            if self.method == "summary":
                out.update(summary_tokens=self.summary_tokens, kept_messages=self.kept_messages,
                           compacted_messages=self.compacted_messages)
            else:
                out.update(cleared_results=self.cleared_results, freed_tokens=self.freed_tokens)
        else:
            out["reason"] = self.reason
        return out
