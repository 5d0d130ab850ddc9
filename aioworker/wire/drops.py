"""Count dropped frames and outputs, and log them at most once a second: a flood of bad frames
must not turn into a flood of log lines (which, on a blocked stderr, would stall the loop)."""

from __future__ import annotations

import logging
import time


class DropCounter:
    def __init__(self, log: logging.Logger, what: str, interval_s: float = 1.0) -> None:
        self.log = log
        self.what = what
        self.interval_s = interval_s
        self.total = 0
        self._reported = 0
        self._reported_at = float("-inf")

    def count(self, reason: str) -> None:
        self.total += 1
        now = time.monotonic()
        if now - self._reported_at < self.interval_s:
            return
        self.log.warning(
            "dropped %d %s since the last report (%d in all); latest: %s",
            self.total - self._reported, self.what, self.total, reason,
        )  # fmt: skip
        self._reported, self._reported_at = self.total, now
