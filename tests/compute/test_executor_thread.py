"""The executor thread with a stand-in runner and weights: results in submission order while later
steps are launched behind a running one, weights phases in line with the steps, and a failure
delivered only to the step that caused it."""

from __future__ import annotations

import time
from concurrent.futures import wait

import pytest
import torch

from aioworker.compute.executor_thread import ExecutorThread
from aioworker.compute.kv_transfer import NoKvCopies
from aioworker.compute.step.mask_mailbox import MaskMailbox
from aioworker.core.plan import StepPlan, StepResult
from aioworker.core.weights_phase import WeightsPhase
from tests.plans import empty_plan

SLOW_STEP_ID = 0  # its tokens take SLOW_SECONDS to arrive
FAILS_AT_LAUNCH = 98
FAILS_AT_RESULT = 99
SLOW_SECONDS = 0.5


class LaunchedStep:
    def __init__(self, step_id: int, events: list[str]) -> None:
        self.step_id = step_id
        self.events = events

    def result(self) -> StepResult:
        if self.step_id == SLOW_STEP_ID:
            time.sleep(SLOW_SECONDS)
        if self.step_id == FAILS_AT_RESULT:
            raise RuntimeError("the device failed")
        self.events.append(f"done {self.step_id}")
        return StepResult(self.step_id, [self.step_id])


class RecordingRunner:
    def __init__(self, events: list[str]) -> None:
        self.events = events
        self.masks = MaskMailbox()
        self.kv_copies = NoKvCopies()

    def launch(self, plan: StepPlan) -> LaunchedStep:
        if plan.step_id == FAILS_AT_LAUNCH:
            raise ValueError("a bad plan")
        self.events.append(f"launch {plan.step_id}")
        return LaunchedStep(plan.step_id, self.events)


class RecordingWeights:
    def __init__(self, events: list[str]) -> None:
        self.events = events

    def run_phase(self, phase: WeightsPhase) -> int:
        self.events.append(phase.op)
        return 7


@pytest.fixture
def executor_events():
    events: list[str] = []
    executor = ExecutorThread(torch.device("cpu"), name="test-executor")
    executor.install(RecordingRunner(events), RecordingWeights(events))
    yield executor, events
    assert executor.shutdown(timeout=5)


def test_later_steps_launch_while_one_runs_and_results_keep_submission_order(
    executor_events,
) -> None:
    executor, events = executor_events
    futures = [executor.submit(empty_plan(i)) for i in range(4)]
    finished: list[int] = []
    for future in futures:
        future.add_done_callback(lambda f: finished.append(f.result().step_id))
    wait(futures, timeout=5)
    assert [f.result() for f in futures] == [StepResult(i, [i]) for i in range(4)]
    assert finished == [0, 1, 2, 3]
    launches = [f"launch {i}" for i in range(4)]
    assert events == launches + [f"done {i}" for i in range(4)]


def test_a_weights_phase_runs_after_the_steps_submitted_before_it(executor_events) -> None:
    executor, events = executor_events
    executor.call(lambda: time.sleep(0.2))  # keeps the thread busy while everything is queued
    first = [executor.submit(empty_plan(i)) for i in (1, 2)]
    phase = executor.run_weights_phase(WeightsPhase(op="commit"))
    last = executor.submit(empty_plan(3))
    assert phase.result(timeout=5) == 7
    wait([*first, last], timeout=5)
    order = [e for e in events if not e.startswith("done")]
    assert order == ["launch 1", "launch 2", "commit", "launch 3"]


def test_a_failing_step_fails_only_its_own_future(executor_events) -> None:
    executor, _ = executor_events
    bad_plan = executor.submit(empty_plan(FAILS_AT_LAUNCH))
    bad_device = executor.submit(empty_plan(FAILS_AT_RESULT))
    good = executor.submit(empty_plan(3))
    with pytest.raises(ValueError, match="a bad plan"):
        bad_plan.result(timeout=5)
    with pytest.raises(RuntimeError, match="the device failed"):
        bad_device.result(timeout=5)
    assert good.result(timeout=5) == StepResult(3, [3])


def test_shutdown_finishes_the_queued_steps_first() -> None:
    events: list[str] = []
    executor = ExecutorThread(torch.device("cpu"), name="test-executor")
    executor.install(RecordingRunner(events), RecordingWeights(events))
    futures = [executor.submit(empty_plan(i)) for i in range(3)]
    assert executor.shutdown(timeout=5)
    assert [f.result(timeout=0) for f in futures] == [StepResult(i, [i]) for i in range(3)]
