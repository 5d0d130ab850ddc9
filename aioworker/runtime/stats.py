"""A running mean of recent samples (the loop time per step in `admin status`)."""

from __future__ import annotations

import collections


class RecentMean:
    """Mean of the last `size` samples, in O(1) per sample."""

    def __init__(self, size: int = 128) -> None:
        self.samples = collections.deque(maxlen=size)
        self.total = 0.0

    def add(self, value: float) -> None:
        if len(self.samples) == self.samples.maxlen:
            self.total -= self.samples[0]
        self.samples.append(value)
        self.total += value

    @property
    def mean(self) -> float:
        return self.total / len(self.samples) if self.samples else 0.0
