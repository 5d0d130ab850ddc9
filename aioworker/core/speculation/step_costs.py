"""How long a step of n tokens takes, as measured: one running mean per power-of-two bucket of
token counts, read by interpolating between buckets. The speculation policy asks it what k
drafts per sequence would cost against none, so that it speculates only where that pays."""

from __future__ import annotations

# How much a new measurement moves its bucket's mean (recent steps matter most: contexts grow).
_WEIGHT = 0.2


class StepCosts:
    def __init__(self) -> None:
        # bucket (n.bit_length()) -> [mean tokens, mean seconds]
        self._buckets: dict[int, list[float]] = {}

    def observe(self, num_tokens: int, seconds: float) -> None:
        if num_tokens <= 0 or seconds <= 0:
            return
        bucket = self._buckets.get(num_tokens.bit_length())
        if bucket is None:
            self._buckets[num_tokens.bit_length()] = [float(num_tokens), seconds]
            return
        bucket[0] += _WEIGHT * (num_tokens - bucket[0])
        bucket[1] += _WEIGHT * (seconds - bucket[1])

    def knows(self, num_tokens: int) -> bool:
        """Whether a step of this many tokens (its bucket) was measured."""
        return num_tokens.bit_length() in self._buckets

    def seconds(self, num_tokens: int) -> float | None:
        """The estimated time of a step of `num_tokens`, or None when nothing near it (at or
        above, and at or below) was measured."""
        points = sorted(self._buckets.values())
        below = [p for p in points if p[0] <= num_tokens]
        above = [p for p in points if p[0] >= num_tokens]
        if not below or not above:
            exact = self._buckets.get(num_tokens.bit_length())
            return exact[1] if exact is not None else None
        (n0, t0), (n1, t1) = below[-1], above[0]
        if n1 == n0:
            return t0
        return t0 + (t1 - t0) * (num_tokens - n0) / (n1 - n0)

    def table(self) -> list[tuple[int, float]]:
        """(mean tokens, mean milliseconds) per measured bucket, smallest first."""
        return [(round(n), t * 1e3) for n, t in sorted(self._buckets.values())]
