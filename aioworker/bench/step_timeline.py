"""Where a run's time goes, step by step (W1's breakdown): each completed step's kind and batch,
the engine thread's host time for it (scheduling the next steps, taking this one's tokens), and
the time that thread waited for the executor's result; and the Triton kernels compiled during
the run (triton_compiles.py), host time that a warm engine does not pay.

The engine keeps up to two steps in flight, so the executor works while the engine thread
plans. A kind of step whose wait is near zero is bound by the engine thread; one whose wait is
most of its time is bound by the executor: the device's step, or the executor thread's own host
work for it. That host work is recorded too, as the executor thread's time in launching each step
(its inputs built and copied, the graph replayed, the sampling queued): where it comes near the
step's whole time, the executor's host, not the device, bounds that kind of step. On the CPU a
launch runs the whole step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from aioworker.bench.triton_compiles import TritonCompiles

# Decode steps grouped by how many sequences they decode (upper bounds).
BATCH_BUCKETS = (8, 32, 128, 256)


@dataclass
class StepRecord:
    rows: int  # sequences scheduled
    prefill_tokens: int  # tokens of sequences scheduled more than one (0: a decode step)
    wait_s: float  # the engine thread's other time: blocked on the executor for this result
    host_s: float  # the engine thread's time in launch and complete for this step
    # The executor thread's time launching this step (runner.launch); None where the engine's
    # executor has no runner of its own to time (a fake executor, a driver of remote ranks).
    launch_s: float | None = None

    @property
    def seconds(self) -> float:
        return self.wait_s + self.host_s


@dataclass
class StepTimeline:
    """Records the steps an engine (LLMEngine) completes while attached (`with`)."""

    engine: object
    steps: list[StepRecord] = field(default_factory=list)
    compiles: TritonCompiles = field(default_factory=TritonCompiles)
    _launch_s: float = 0.0  # launches' time since the last completion
    _last: float = 0.0
    _originals: tuple = ()  # the core's launch and complete, while attached
    _runner: object = None  # the executor's runner whose launch is timed, while attached
    _launch_by_step: dict = field(default_factory=dict)  # step id -> the executor's launch s

    def __enter__(self) -> StepTimeline:
        core = self.engine.core
        self._originals = (core.launch, core.complete)
        core.launch, core.complete = self._launch, self._complete
        self._runner = getattr(core.executor, "runner", None)
        if self._runner is not None:
            self._runner.launch = self._timed_runner_launch(self._runner.launch)
        self.compiles.__enter__()
        self._last = time.perf_counter()
        return self

    def __exit__(self, *_) -> None:
        self.compiles.__exit__()
        # The core's and runner's own methods again: the wrappers were set on the instances only.
        del self.engine.core.launch, self.engine.core.complete
        if self._runner is not None:
            del self._runner.launch
            self._runner = None

    def _timed_runner_launch(self, launch):
        """runner.launch, timed on the executor thread by the step it launches."""

        def timed(plan):
            started = time.perf_counter()
            try:
                return launch(plan)
            finally:
                self._launch_by_step[plan.step_id] = time.perf_counter() - started

        return timed

    def _launch(self, *args, **kwargs):
        started = time.perf_counter()
        try:
            return self._originals[0](*args, **kwargs)
        finally:
            self._launch_s += time.perf_counter() - started

    def _complete(self, result):
        plan = self.engine.core.in_flight[0].plan
        started = time.perf_counter()
        outputs = self._originals[1](result)
        now = time.perf_counter()
        prefill = sum(n for n in plan.num_scheduled_tokens if n > 1)
        wait = started - self._last - self._launch_s
        host = self._launch_s + now - started
        launch = self._launch_by_step.pop(plan.step_id, None)
        self.steps.append(StepRecord(len(plan.seq_ids), prefill, wait, host, launch))
        self._launch_s, self._last = 0.0, now
        return outputs

    def summary(self) -> str:
        """Per kind of step: how many, their time and share, and a step's mean host and wait;
        then the Triton compiles."""
        groups: dict[str, list[StepRecord]] = {}
        for step in self.steps:
            groups.setdefault(_kind(step), []).append(step)
        wall = sum(s.seconds for s in self.steps) or 1.0
        parts = []
        for kind in _kinds_in_order(groups):
            steps = groups[kind]
            seconds = sum(s.seconds for s in steps)
            host_ms = 1000 * sum(s.host_s for s in steps) / len(steps)
            wait_ms = 1000 * sum(s.wait_s for s in steps) / len(steps)
            parts.append(
                f"{kind}: {len(steps)} steps, {seconds:.2f} s ({seconds / wall:.0%}), a step "
                f"{host_ms:.2f} ms host + {wait_ms:.2f} ms waiting on the executor"
                + _executor_launch(steps)
            )
        return "; ".join([*parts, self.compiles.summary()])


def _executor_launch(steps: list[StepRecord]) -> str:
    """The executor thread's mean launch time a step, where it was timed."""
    timed = [s.launch_s for s in steps if s.launch_s is not None]
    if not timed:
        return ""
    return f" (the executor's launch {1000 * sum(timed) / len(timed):.2f} ms)"


def _kind(step: StepRecord) -> str:
    if step.prefill_tokens:
        return "steps with prefill"
    for bound in BATCH_BUCKETS:
        if step.rows <= bound:
            return f"decode of <= {bound}"
    return f"decode of > {BATCH_BUCKETS[-1]}"


def _kinds_in_order(groups: dict) -> list[str]:
    order = ["steps with prefill", *(f"decode of <= {b}" for b in reversed(BATCH_BUCKETS))]
    return [k for k in order if k in groups] + [k for k in groups if k not in order]
