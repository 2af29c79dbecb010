"""Compaction (docs/behaviour.md#compaction): when a path grows too long, its older part is
summarised into a compaction node that assembly stops at.

    compactor.py    Compactor: the hard, soft and admin triggers (when to clear, when to summarise)
    summaries.py    Summaries: a summary prepared and written as a compaction node
    clearing.py     context editing: old tool results replaced by placeholders (pure)
    clearer.py      Clearer: a clearing planned off the loop and written as a compaction node
    background.py   background jobs: one per conversation, newest request next, take-over
    policy.py       thresholds and what stays raw (pure)
    results.py      CompactionResult and Prepared: what a compaction hands back
    summariser.py   the summariser calls and the summary budget
"""

from .compactor import Compactor
from .policy import Edits, Limits, Thresholds, split_recent
from .results import CompactionResult, Prepared
from .summariser import SUMMARY_PREFIX, Summariser, render_transcript, summariser_messages

__all__ = [
    "SUMMARY_PREFIX",
    "CompactionResult",
    "Compactor",
    "Edits",
    "Limits",
    "Prepared",
    "Summariser",
    "Thresholds",
    "render_transcript",
    "split_recent",
    "summariser_messages",
]
