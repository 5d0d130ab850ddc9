"""What admin commands, signals and weights operations may do to a serving group: change its
state, hold and wake its steps, drain it, stop it. A narrow handle on the driver, so none of them
needs the whole driver. The open requests stay the driver's: a drain only counts them and may
end them all."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from aioworker.core.engine_core import EngineCore
from aioworker.runtime.lifecycle import RankLifecycle
from aioworker.runtime.state import ExitCode
from aioworker.wire.health import RankState


class Drainable(Protocol):
    """What a drain needs of the open requests: how many there are, and a way to end them all."""

    def __len__(self) -> int: ...

    def abort_all(self, reason: str) -> int: ...


class GroupControl:
    def __init__(
        self, lifecycle: RankLifecycle, core: EngineCore, open_requests: Drainable
    ) -> None:
        self.lifecycle = lifecycle
        self.core = core
        self._open = open_requests
        # Set when work arrives or steps may run again; the step loop waits on it when idle.
        self.work = asyncio.Event()
        # Set after every step, and when steps stop: what `wait_until` re-checks on.
        self.progress = asyncio.Event()
        self.drain_timer: asyncio.TimerHandle | None = None
        # While a weights operation holds the group, a drain waits for it (its deadline here).
        self._drains_held = False
        self._deferred_drain_s: float | None = None

    # -- state and steps ----------------------------------------------------------------------

    @property
    def state(self) -> RankState:
        return self.lifecycle.state

    def move(self, state: RankState) -> None:
        self.lifecycle.move(state)

    def leave(self, held: RankState, to: RankState) -> None:
        """Move to `to` if still in `held` (a drain or stop that came meanwhile wins)."""
        if self.state is held:
            self.move(to)

    def can_step(self) -> bool:
        """Steps run while serving or draining; weights and memory operations hold them."""
        return self.core.has_unfinished and self.lifecycle.machine.rules.runs_steps

    def wake(self) -> None:
        self.work.set()

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        """Wait until `predicate()` holds; it is checked whenever a step completes."""
        while not predicate():
            self.progress.clear()
            await self.progress.wait()

    # -- draining -----------------------------------------------------------------------------

    @property
    def drain_pending(self) -> bool:
        """A drain was asked for and waits for a weights operation to end."""
        return self._deferred_drain_s is not None

    def start_drain(self, deadline_s: float) -> str:
        """Refuse new requests, let those in flight finish, abort what runs after `deadline_s`,
        then stop. During a weights operation the drain waits for it to end; with memory
        released, requests cannot finish: they are aborted, and the rank stops. Says which."""
        if self.state in (RankState.DRAINING, RankState.STOPPED, RankState.FAILED):
            return f"already {self.state.lower()}"
        if self._drains_held:
            if self._deferred_drain_s is None:
                self._deferred_drain_s = deadline_s
            return "deferred until the weights operation in progress ends"
        if self.state is RankState.WEIGHTS_CLEARED:
            self._open.abort_all(
                "worker stopping while its memory is released: requests cannot finish"
            )
            self.lifecycle.stop()
            return "memory is released: requests aborted, stopping"
        self.move(RankState.DRAINING)
        loop = asyncio.get_running_loop()
        self.drain_timer = loop.call_later(
            deadline_s, self._abort_at_deadline, f"drain deadline of {deadline_s:g}s reached"
        )
        self.wake()
        self.finish_drain_if_done()
        return "draining"

    def hold_drains(self) -> None:
        self._drains_held = True

    def release_drains(self) -> None:
        """The weights operation ended: a drain asked for meanwhile starts now."""
        self._drains_held = False
        deadline_s, self._deferred_drain_s = self._deferred_drain_s, None
        if deadline_s is not None:
            self.start_drain(deadline_s)

    def _abort_at_deadline(self, reason: str) -> None:
        self._open.abort_all(reason)
        self.finish_drain_if_done()

    def finish_drain_if_done(self) -> None:
        if self.state is RankState.DRAINING and not self._open:
            self.lifecycle.stop()

    def stop(self) -> None:
        self.lifecycle.stop()

    def fail(self, code: ExitCode, reason: str) -> None:
        self.lifecycle.fail(code, reason)

    def close(self) -> None:
        if self.drain_timer is not None:
            self.drain_timer.cancel()
