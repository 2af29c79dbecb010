"""Which conversation a full-history call belongs to when the request does not say it by id, and
where a new conversation begins (docs/behaviour.md#full-history-mode):

- **session headers**: under ``/auto/v1`` without ``X-Conversation-Id``, the first header of
  ``[server] session_headers`` the request carries with a valid conversation id as its value names
  the conversation (Codex's ``session-id``, Claude Code's ``X-Claude-Code-Session-Id``, Open
  WebUI's ``X-OpenWebUI-Chat-Id``). One app session is one conversation: an edit of its first
  question matches nothing and becomes a second root of it.
- **a session that continues another one** (a resumed or forked agent session under a new id): the
  first full-history call of a named conversation -- one that has no node yet: it does not exist,
  or was made empty (the Conversations API) -- is matched against the whole tenant first; when it continues a node of another conversation, the new
  conversation is made a fork at that node (nothing copied), and the call, matched in it as usual,
  hangs there.

Both happen before the call's start (``bp_begin_call``), which never changes: a named
conversation this process saw begun in the last ``_SEEN_FOR`` seconds costs nothing more
(``_seen``); else one look-up of its row, and a new one the tenant-wide match (and the fork when it
continues something). A conversation deleted -- here or in another process -- is looked at again
within that time at most, so a session named again after its delete continues another
conversation as a new one does, whichever process serves it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from storage import AdminStore, Refused, TreeStore

from .errors import InvalidConversationId
from .ids import valid_conversation_id

__all__ = ["Sessions"]

log = logging.getLogger("branchpoint.call")

# conversations known to exist, per process: at most this many remembered (then forgotten at once),
# each for this long (a delete elsewhere is not heard of: the row is looked at again after it)
_SEEN_MAX = 100_000
_SEEN_FOR = 60.0


class Sessions:
    def __init__(self, tree: TreeStore, admin: AdminStore, headers: Iterable[str]) -> None:
        self.tree = tree
        self.admin = admin
        self.headers = tuple(h.strip().lower() for h in headers if h.strip())
        self._seen: dict[tuple[str, str], float] = {}  # -> when it was seen begun (monotonic)

    def named(self, headers: list[tuple[str, str]]) -> str | None:
        """The conversation a session header names: the value of the first header of
        ``session_headers`` (in their order) that the request carries with a valid conversation
        id; None when there is none (the conversation is then found by content)."""
        if not self.headers:
            return None
        values: dict[str, str] = {}
        for name, value in headers:
            values.setdefault(name.lower(), value.strip())
        for name in self.headers:
            value = values.get(name)
            if value:
                try:
                    return valid_conversation_id(value, source=name)
                except InvalidConversationId:
                    continue  # not a conversation id: ignored
        return None

    async def continue_from(self, tenant: str, conversation_id: str, prefixes: list[bytes]) -> None:
        """Before the first full-history call of ``conversation_id``: when its history continues a
        node of another conversation of the tenant, make it a fork at that node. ``prefixes``:
        the call's prefix hashes (storage.transcript.prefix_hashes)."""
        key = (tenant, conversation_id)
        seen = self._seen.get(key)
        if seen is not None and time.monotonic() - seen < _SEEN_FOR:
            return
        state = await self.tree.conversation_state(tenant, conversation_id)
        if state is not None and state[0] is not None:  # (it has a head: it has begun)
            self._remember(key)
            return
        found = await self.tree.continued_node(tenant, prefixes)
        if found is None or found["conversation_id"] == conversation_id:
            return
        if found["k"] == len(prefixes) and found["outcome"] != "success" and found["parent_id"] is None:
            return  # a retry of another conversation's failed first call: a root here too (continues nothing)
        try:
            if state is None:
                await self.admin.fork(tenant, found["conversation_id"], conversation_id, found["id"])
            else:  # (it exists, with no head: made empty -- the Conversations API -- or cleared: if it holds no node)
                await self.admin.fork_into_empty(tenant, found["conversation_id"], conversation_id, found["id"])
        except Refused as exc:  # made meanwhile by another call, or the source went: start as usual
            log.info("session not forked", extra={"conversation_id": conversation_id, "reason": type(exc).__name__})
            return
        self._remember(key)
        log.info("session continues another conversation: forked", extra={
            "conversation_id": conversation_id, "forked_from": found["conversation_id"], "node_id": str(found["id"])})

    def _remember(self, key: tuple[str, str]) -> None:
        if len(self._seen) >= _SEEN_MAX:
            self._seen.clear()
        self._seen[key] = time.monotonic()

