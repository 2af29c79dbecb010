"""Ids: time-ordered UUIDs (RFC 9562 version 7) -- node ids sort by creation, so an index on id is
append-mostly and "newest first" is an id order (Python 3.11 has no ``uuid.uuid7``); and a
conversation name's derived tree, as the database derives it."""

from __future__ import annotations

import hashlib
import os
import threading
import time
import uuid

__all__ = ["tree_of", "uuid7"]

_lock = threading.Lock()
_last_ms = 0
_seq = 0


def uuid7() -> uuid.UUID:
    """A version-7 UUID; monotonic within this process (a 12-bit counter orders ids of one ms)."""
    global _last_ms, _seq
    with _lock:
        ms = time.time_ns() // 1_000_000
        if ms <= _last_ms:
            _seq += 1
            if _seq > 0xFFF:  # counter exhausted: borrow the next millisecond
                _last_ms += 1
                _seq = 0
            ms = _last_ms
        else:
            _last_ms = ms
            _seq = int.from_bytes(os.urandom(2), "big") & 0x7FF  # random start, room to count up
        seq = _seq
    rand = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
    value = (ms & ((1 << 48) - 1)) << 80 | 0x7 << 76 | seq << 64 | 0b10 << 62 | rand
    return uuid.UUID(int=value)


def tree_of(tenant: str, conversation_id: str) -> uuid.UUID:
    """The tree a conversation of this name is made in unless an alias says otherwise -- what the
    database's ``bp_tree_of`` computes (md5 of the tenant's length in characters, ':', the tenant
    and the name, read as a uuid): on a schema distributed by tree, where its calls are sent."""
    return uuid.UUID(hashlib.md5(f"{len(tenant)}:{tenant}{conversation_id}".encode()).hexdigest())
