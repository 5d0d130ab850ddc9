"""How many CPU threads a rank's steps run on, chosen by measuring them while it serves.

On a quiet 2-core host a step runs fastest on both cores. Beside another busy process it runs
fastest on one: OpenMP splits each matmul evenly across its threads, so a step waits for its
slowest thread, and a thread that shares its core with another process is the slowest most of
the time (the embedded model's serving throughput fell to 0.25x beside one spinning process on
two threads, and to 0.96x on one: docs/benchmarks.md). No reading of the host's load tells which
count is faster for this model on this machine; timing steps does. So every so often a few
steps run with one thread more or fewer, and the count whose steps of the same size were faster
is kept. A probe that confirms the current count doubles the wait before the next one, so a
quiet host pays almost nothing for the watching.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict, deque
from collections.abc import Callable

# Steps run at each count before one is judged, and how many recent steps of a size are kept.
PROBE_STEPS = 4
KEPT_STEPS = 8
# Steps between probes: the first wait, and the longest once probes keep confirming; and the
# longest time between probes, since a step can take 50 ms or a second as conditions change.
FIRST_INTERVAL = 32
MAX_INTERVAL = 512
MAX_PROBE_GAP_S = 5.0
# A count must be this much faster to replace the current one (step times vary by a few %).
MIN_GAIN = 0.05
# A probe step this much slower than the current count's steps of its size ends the probe at
# once: beside a busy process one step on too many threads can take a second.
CLEAR_LOSS = 0.3


def size_class(num_tokens: int) -> int:
    """Steps are compared with steps of about the same size: the bit length of their token
    count (16 decodes, and 16 decodes beside a 256-token prompt chunk, are different sizes)."""
    return num_tokens.bit_length()


class ThreadGovernor:
    """Call `before_step` and `after_step` around each step, on the thread that runs them."""

    def __init__(
        self,
        max_threads: int,
        set_threads: Callable[[int], None],
        log: Callable[[str], None] = lambda message: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_threads = max_threads
        self.set_threads = set_threads
        self.log = log
        self.clock = clock
        self.last_probe_at = clock()
        self.current = max_threads
        self.interval = FIRST_INTERVAL
        self.steps_until_probe = FIRST_INTERVAL
        self.probe: int | None = None  # the count being tried, while a probe runs
        self.probe_steps_left = 0
        self.probe_sizes: set[int] = set()
        self.direction = -1  # the next probe tries one thread fewer (then more)
        # (thread count, size class) -> the latest step times, seconds
        self.times: dict[tuple[int, int], deque[float]] = defaultdict(
            lambda: deque(maxlen=KEPT_STEPS)
        )
        self.running = max_threads

    def before_step(self) -> None:
        wanted = self.probe if self.probe is not None else self.current
        if wanted != self.running:
            self.set_threads(wanted)
            self.running = wanted

    def after_step(self, num_tokens: int, seconds: float) -> None:
        size = size_class(num_tokens)
        self.times[(self.running, size)].append(seconds)
        if self.probe is None:
            self.steps_until_probe -= 1
            if self.steps_until_probe <= 0 or self.clock() - self.last_probe_at > MAX_PROBE_GAP_S:
                self._start_probe()
            return
        self.probe_sizes.add(size)
        self.probe_steps_left -= 1
        if self.probe_steps_left <= 0 or self._clearly_slower(size, seconds):
            self._judge_probe()

    def _clearly_slower(self, size: int, seconds: float) -> bool:
        current = self.times[(self.current, size)]
        return bool(current) and seconds > (1.0 + CLEAR_LOSS) * statistics.median(current)

    def _start_probe(self) -> None:
        self.last_probe_at = self.clock()
        candidate = self.current + self.direction
        if not 1 <= candidate <= self.max_threads:
            self.direction = -self.direction
            candidate = self.current + self.direction
        self.direction = -self.direction
        if not 1 <= candidate <= self.max_threads:  # one thread and nothing else to try
            self.steps_until_probe = MAX_INTERVAL
            return
        for (threads, _), times in self.times.items():
            if threads == candidate:
                times.clear()  # measured under other conditions: only this probe counts
        self.probe, self.probe_steps_left, self.probe_sizes = candidate, PROBE_STEPS, set()

    def _judge_probe(self) -> None:
        candidate, self.probe = self.probe, None
        gains = [
            statistics.median(self.times[(self.current, size)])
            / statistics.median(self.times[(candidate, size)])
            - 1.0
            for size in self.probe_sizes
            if self.times[(self.current, size)]
        ]
        if gains and statistics.median(gains) >= MIN_GAIN:
            self.log(
                f"steps run {statistics.median(gains):.0%} faster on {candidate} CPU "
                f"thread(s) than on {self.current}: switching"
            )
            self.current, self.interval = candidate, FIRST_INTERVAL
        elif gains:
            self.interval = min(2 * self.interval, MAX_INTERVAL)
        self.steps_until_probe = self.interval
