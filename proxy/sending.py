"""The client's side of a relayed answer: a send that waits no longer than ``[server]
client_send_timeout`` for the client to take what it is given (docs/behaviour.md#limits-and-hostile-peers).
A client that takes nothing for that long -- its socket full, the server's ``send`` waiting for
room -- is one that went away: else it would hold its conversation's lease and an upstream
connection for as long as it kept its socket open."""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["ClientStalled", "close_timed", "timed_send"]


class ClientStalled(OSError):
    """The client took nothing of its answer for ``[server] client_send_timeout`` seconds: ended as
    a client that went away (the server closes its connection: the answer was left unfinished)."""


def timed_send(send: Any, timeout: float) -> Any:
    """``send`` raising ``ClientStalled`` when a message is not taken within ``timeout`` seconds --
    the server's ``send`` waits while the client's socket is full (0: no limit). Call ``close()``
    on it when the response ends (its timer goes)."""
    return _TimedSend(send, timeout) if timeout > 0 else send


class _TimedSend:
    """One timer a response, not one a message: a send notes when it began, and the timer, when it
    fires, ends a send begun ``timeout`` ago (its task cancelled, the cancellation turned into
    ``ClientStalled``) or is set again for the send in progress -- none while nothing is sent.
    (``asyncio.timeout`` around each send cost ~7 us a message, against <1 us this way: a stream's
    every event passes here.)"""

    __slots__ = ("_handle", "_loop", "_send", "_since", "_stalled", "_task", "timeout")

    def __init__(self, send: Any, timeout: float) -> None:
        self._send = send
        self.timeout = timeout
        self._loop = asyncio.get_running_loop()
        self._since: float | None = None
        self._task: asyncio.Task[Any] | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._stalled = False

    async def __call__(self, message: Any) -> None:
        if self._stalled:
            raise self._error()
        self._since = since = self._loop.time()
        self._task = task = asyncio.current_task()
        if self._handle is None:
            self._handle = self._loop.call_at(since + self.timeout, self._check)
        try:
            await self._send(message)
        except asyncio.CancelledError:
            # (ours, and nobody else's: the shutdown's cancellation stays one)
            if self._stalled and task is self._task and task is not None and task.uncancel() == 0:
                raise self._error() from None
            raise
        finally:
            if self._task is task:  # (another task's send begun meanwhile stays watched)
                self._since = None

    def _check(self) -> None:
        self._handle = None
        since, task = self._since, self._task
        if since is None or task is None:
            return  # (nothing in progress: the next send sets the timer again)
        if self._loop.time() - since >= self.timeout:
            self._stalled = True
            task.cancel()
        else:
            self._handle = self._loop.call_at(since + self.timeout, self._check)

    def _error(self) -> ClientStalled:
        return ClientStalled(f"the client took nothing of its answer for {self.timeout:g} s "
                             "(server.client_send_timeout)")

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


def close_timed(send: Any) -> None:
    """The timer of a send ``timed_send`` made goes (a send it left as it was: nothing to do)."""
    if isinstance(send, _TimedSend):
        send.close()
