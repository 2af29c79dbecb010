"""Work that outlives the request that started it (storing an outcome after the database came
back, a background compaction, draining an upstream connection): spawned here, so that shutdown
can wait for all of it. And ``periodically``: the loop of a process's recurring jobs (the reaper,
retention), which a failed run never ends."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from storage import StorageError

__all__ = ["Background", "periodically"]


async def periodically(job: Callable[[], Awaitable[Any]], interval: float, *, what: str, log: logging.Logger,
                       at_once: bool = False) -> None:
    """Run ``job`` every ``interval`` seconds (the first run at once, or after the first interval)
    until cancelled; a run that fails is logged -- a database away as a warning -- and the next
    one comes all the same."""
    if not at_once:
        await asyncio.sleep(interval)
    while True:
        try:
            await job()
        except StorageError as exc:
            log.warning(f"{what} could not run", extra={"error": str(exc)})
        except Exception:
            log.exception(f"{what} failed")
        await asyncio.sleep(interval)


class Background:
    def __init__(self) -> None:
        self.tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run ``coro`` in the background; ``wait()`` (shutdown) waits for it."""
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def wait(self, timeout: float) -> None:
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=timeout)

    async def cancel(self) -> None:
        """Stop what is still running (the shutdown has waited for it long enough), and give it a
        moment to end."""
        tasks = list(self.tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=1)
