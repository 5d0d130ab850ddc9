"""A rank runs one asyncio task per concern (task intake, steps, admin, heartbeats, liveness).
A concern that crashes fails the rank with its exception: nothing dies silently."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine

from aioworker.runtime.lifecycle import FatalError, RankLifecycle
from aioworker.runtime.state import ExitCode

log = logging.getLogger(__name__)


class Concerns:
    def __init__(self, lifecycle: RankLifecycle) -> None:
        self.lifecycle = lifecycle
        self._tasks: set[asyncio.Task] = set()

    def spawn(self, coro: Coroutine) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._on_done)
        return task

    async def cancel_all(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _on_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if isinstance(exc, FatalError):
            self.lifecycle.fail(exc.code, str(exc))
        elif exc is not None:
            log.error("task %s crashed", task.get_coro(), exc_info=exc)
            self.lifecycle.fail(ExitCode.FAILED, f"{type(exc).__name__}: {exc}")
