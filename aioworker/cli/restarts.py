"""When `aioworker serve` restarts what crashed: after a backoff that doubles with each recent
restart, up to a bound, and not at all once `max_restarts` restarts fall within the window (a
crash loop, which ends the launcher). Pure bookkeeping on monotonic times; torch-free."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from aioworker.config import LauncherOptions


@dataclass(frozen=True)
class RestartPolicy:
    backoff_s: float = 1.0
    max_backoff_s: float = 30.0
    max_restarts: int = 5
    window_s: float = 300.0

    @classmethod
    def from_options(cls, options: LauncherOptions) -> RestartPolicy:
        return cls(
            options.restart_backoff_s,
            options.max_restart_backoff_s,
            options.max_restarts,
            options.restart_window_s,
        )

    def describe(self) -> str:
        return f"at most {self.max_restarts} restart(s) within {self.window_s:g}s"


class RestartHistory:
    """The restarts of one group (or of the API server) that still count: those in the window."""

    def __init__(self, policy: RestartPolicy) -> None:
        self.policy = policy
        self._times: deque[float] = deque()

    def num_recent(self, now: float) -> int:
        while self._times and now - self._times[0] > self.policy.window_s:
            self._times.popleft()
        return len(self._times)

    def next_delay(self, now: float) -> float | None:
        """Seconds to wait before the next restart, or None: that many restarts already fell
        within the window (a crash loop)."""
        recent = self.num_recent(now)
        if recent >= self.policy.max_restarts:
            return None
        return min(self.policy.max_backoff_s, self.policy.backoff_s * 2**recent)

    def record(self, now: float) -> None:
        self._times.append(now)
