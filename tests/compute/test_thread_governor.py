"""The thread governor keeps the thread count whose steps were measured faster: all cores on a
quiet host, fewer beside a busy process, all again once it is gone; and the probing backs off."""

from __future__ import annotations

from aioworker.compute.thread_governor import (
    FIRST_INTERVAL,
    MAX_INTERVAL,
    MAX_PROBE_GAP_S,
    PROBE_STEPS,
    ThreadGovernor,
)

# Seconds per 16-token step on a 2-core host, by thread count: quiet, and beside a busy process.
QUIET = {1: 0.074, 2: 0.046}
BUSY = {1: 0.078, 2: 0.190}


class Host:
    def __init__(self, max_threads: int = 2) -> None:
        self.calls: list[int] = []
        self.now = 0.0
        self.governor = ThreadGovernor(max_threads, self.calls.append, clock=lambda: self.now)

    def run(self, num_steps: int, speeds: dict[int, float], num_tokens: int = 16) -> list[int]:
        """The thread count of each step."""
        counts = []
        for _ in range(num_steps):
            self.governor.before_step()
            counts.append(self.governor.running)
            self.now += speeds[self.governor.running]
            self.governor.after_step(num_tokens, speeds[self.governor.running])
        return counts


def test_a_quiet_host_keeps_every_core_and_probes_less_and_less() -> None:
    host = Host()
    counts = host.run(3000, QUIET)
    assert counts.count(1) <= 8 * PROBE_STEPS  # a few probes, each a few steps
    assert host.governor.current == 2 and host.governor.interval == MAX_INTERVAL


def test_beside_a_busy_process_one_thread_is_kept_and_every_core_again_once_it_is_gone() -> None:
    host = Host()
    host.run(100, QUIET)
    counts = host.run(FIRST_INTERVAL * 8 + 600, BUSY)
    assert host.governor.current == 1
    assert counts[-300:].count(1) >= 300 - 2 * PROBE_STEPS
    host.run(2 * MAX_INTERVAL + 8, QUIET)
    assert host.governor.current == 2


def test_a_host_that_turns_busy_after_a_long_quiet_spell_is_noticed_within_seconds() -> None:
    host = Host()
    host.run(5000, QUIET)  # the probes have backed off to their longest interval
    counts = host.run(200, BUSY)  # 200 steps of 0.19 s: far fewer than the interval
    assert host.governor.current == 1
    slow_seconds = sum(BUSY[c] for c in counts[: counts.index(1)])
    assert slow_seconds <= MAX_PROBE_GAP_S + 1.0


def test_steps_of_another_size_decide_nothing() -> None:
    """A probe that only sees prompt chunks has nothing of the current count to compare with."""
    host = Host()
    host.run(FIRST_INTERVAL, QUIET, num_tokens=16)
    probe = host.run(PROBE_STEPS, {1: 0.001, 2: 0.5}, num_tokens=272)
    assert probe == [1] * PROBE_STEPS and host.governor.current == 2


def test_one_thread_is_never_changed() -> None:
    host = Host(max_threads=1)
    host.run(2000, BUSY)
    assert host.calls == []


def test_a_probe_step_far_slower_than_the_current_ends_the_probe_at_once() -> None:
    host = Host()
    host.run(100, BUSY)  # now on one thread, probing two every so often
    assert host.governor.current == 1
    counts = host.run(4000, BUSY)
    # Every probe of two threads ended after its first step.
    runs = "".join(str(c) for c in counts).split("1")
    assert {len(run) for run in runs if run} == {1}
