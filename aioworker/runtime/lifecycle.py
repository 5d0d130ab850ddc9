"""A rank's lifecycle: its state (told to systemd as it changes), how it stops or fails, and the
exit code the supervisor sees."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from aioworker.runtime.notify import SystemdNotifier
from aioworker.runtime.state import ExitCode, RankStateMachine
from aioworker.wire.health import RankState

log = logging.getLogger(__name__)

# What systemd shows after the state's name (`systemctl status`); the rest show the name alone.
STATUS_PHRASES = {
    RankState.LOADING: "LOADING model",
    RankState.PROFILING: "PROFILING memory",
    RankState.WARMING: "WARMING up",
    RankState.DRAINING: "DRAINING requests in flight",
}
STOPPING_STATES = frozenset({RankState.DRAINING, RankState.STOPPED, RankState.FAILED})


class FatalError(RuntimeError):
    """Ends the rank with `code`: raised by any concern that finds the rank unable to go on."""

    def __init__(self, code: ExitCode, reason: str) -> None:
        super().__init__(reason)
        self.code = code


class RankLifecycle:
    def __init__(self, group: int, rank: int, notifier: SystemdNotifier) -> None:
        self.label = f"group {group} rank {rank}"
        self.notifier = notifier
        self.machine = RankStateMachine(self._on_change)
        # Called after every state change (the heartbeat thread publishes the new state at once).
        self.listeners: list[Callable[[], None]] = []
        self.detail = ""  # why the rank failed
        self.exit_code = ExitCode.OK
        self.stopped = asyncio.Event()
        self._told_ready = self._told_stopping = False
        notifier.status(self.status_text())  # STARTING

    @property
    def state(self) -> RankState:
        return self.machine.state

    def move(self, state: RankState) -> None:
        self.machine.move(state)

    def enter_start_phase(self, state: RankState) -> None:
        """PROFILING, WARMING: reported by the load thread, ignored once start-up is over."""
        if self.machine.rules.is_starting:
            self.machine.move(state)

    def stop(self) -> None:
        if not self.state.is_final:
            self.move(RankState.STOPPED)
        self.stopped.set()

    def fail(self, code: ExitCode, reason: str) -> None:
        if self.state is not RankState.FAILED:
            log.error("%s failing (exit %d): %s", self.label, code, reason)
            self.detail = reason
            self.exit_code = code
            self.move(RankState.FAILED)
        self.stopped.set()

    def is_starting(self) -> bool:
        return self.machine.rules.is_starting

    def status_text(self) -> str:
        if self.state is RankState.FAILED:
            return f"FAILED: {self.detail}"
        return f"{STATUS_PHRASES.get(self.state, str(self.state))}: {self.label}"

    def _on_change(self, state: RankState) -> None:
        self._notify_systemd(state)
        for listener in self.listeners:
            listener()

    def _notify_systemd(self, state: RankState) -> None:
        """STATUS on every change; READY=1 the first time the rank serves; STOPPING=1 once."""
        status = self.status_text()
        if state is RankState.READY and not self._told_ready:
            self._told_ready = True
            self.notifier.ready(status)
        elif state in STOPPING_STATES and not self._told_stopping:
            self._told_stopping = True
            self.notifier.stopping(status)
        else:
            self.notifier.status(status)
