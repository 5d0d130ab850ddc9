"""Where a rank's steps are: the step running now and since when, and tokens generated. The
heartbeat, the hung-step watch and the systemd watchdog read it."""

from __future__ import annotations

import time


class StepProgress:
    def __init__(self, hung_step_timeout_s: float) -> None:
        self.hung_step_timeout_s = hung_step_timeout_s
        self.step_id = -1
        # time.monotonic() when the oldest step in flight was submitted; None between steps.
        self.started_at: float | None = None
        self.num_tokens_generated = 0
        self._watched_step_id = -1

    def step_age(self, now: float) -> float:
        """Seconds the current step has run (0 between steps)."""
        return now - self.started_at if self.started_at is not None else 0.0

    def is_progressing(self) -> bool:
        """No step in flight past hung_step_timeout_s, unless a newer step started since the
        previous call (each call remembers the step id it saw)."""
        step_id, started = self.step_id, self.started_at
        moved, self._watched_step_id = step_id != self._watched_step_id, step_id
        timeout = self.hung_step_timeout_s
        return started is None or moved or timeout <= 0 or time.monotonic() - started < timeout
