"""The engine core with the fake executor: admission, the in-flight window, aborts while steps
are in flight, and the outputs it returns."""

from __future__ import annotations

import inspect
from concurrent.futures import Future

import pytest

from aioworker.config import load_config
from aioworker.core.engine_core import MAX_IN_FLIGHT, EngineCore
from aioworker.core.executor import Executor
from aioworker.core.fake_executor import FakeExecutor, fake_loaded_rank, fake_token
from aioworker.core.outputs import FinishReason
from aioworker.core.plan import StepPlan, StepResult
from aioworker.core.sampling_params import InvalidRequestError, SamplingParams

CONFIG = load_config(overrides={"cache.num_blocks": 32, "model.max_model_len": 128})


class HeldExecutor(FakeExecutor):
    """Answers a step only when the test releases it, so steps stay in flight."""

    def __init__(self) -> None:
        super().__init__()
        self.held: list[tuple[StepPlan, Future]] = []

    def submit(self, plan: StepPlan) -> Future[StepResult]:
        future: Future[StepResult] = Future()
        self.held.append((plan, future))
        return future

    def release_oldest(self) -> None:
        plan, future = self.held.pop(0)
        self._settle(plan, future)


def make_core(executor=None) -> EngineCore:
    return EngineCore(executor or FakeExecutor(), fake_loaded_rank(CONFIG), CONFIG.scheduler)


def test_requests_run_to_their_length_with_the_fake_tokens() -> None:
    core = make_core()
    core.add("a", [1, 2, 3], SamplingParams(max_tokens=4))
    core.add("b", [4, 5], SamplingParams(max_tokens=2))
    outputs = []
    while core.has_unfinished:
        outputs += core.step()
    tokens = {rid: [t for o in outputs if o.request_id == rid for t in o.token_ids] for rid in "ab"}
    assert tokens == {
        "a": [fake_token(p) for p in range(3, 7)],
        "b": [fake_token(2), fake_token(3)],
    }
    assert [o.finish_reason for o in outputs if o.finished] == [FinishReason.LENGTH] * 2
    assert core.block_manager.num_used_blocks == 0


def test_no_more_than_the_window_of_steps_is_in_flight() -> None:
    executor = HeldExecutor()
    core = make_core(executor)
    core.add("a", [1, 2, 3], SamplingParams(max_tokens=10))
    core.launch()
    assert len(core.in_flight) == len(executor.held) == MAX_IN_FLIGHT
    executor.release_oldest()
    [first] = core.complete(core.in_flight[0].future.result())
    assert first.step_id == 0 and first.token_ids == [fake_token(3)]
    core.launch()
    assert [step.plan.step_id for step in core.in_flight] == [1, 2]


def test_an_abort_while_steps_run_frees_blocks_and_drops_their_tokens() -> None:
    executor = HeldExecutor()
    core = make_core(executor)
    core.add("a", [1, 2, 3], SamplingParams(max_tokens=10))
    core.launch()
    assert core.block_manager.num_used_blocks == 1
    assert core.abort("a") and not core.abort("a")
    assert core.block_manager.num_used_blocks == 0
    terminal = core.terminal_output("a", FinishReason.ABORT, "by the test")
    assert (terminal.step_id, terminal.finish_reason) == (0, FinishReason.ABORT)
    while core.in_flight:
        executor.release_oldest()
        assert core.complete(core.in_flight[0].future.result()) == []
    assert not core.has_unfinished


def test_admission_names_the_field_and_a_reused_id() -> None:
    core = make_core()
    core.add("a", [1], SamplingParams())
    with pytest.raises(InvalidRequestError, match="request_id 'a' is already in use"):
        core.add("a", [1], SamplingParams())
    with pytest.raises(InvalidRequestError, match="prompt has 129 tokens; max_model_len is 128"):
        core.add("b", [1] * 129, SamplingParams())


def test_outputs_carry_the_weights_version_of_their_step() -> None:
    core = make_core()
    core.add("a", [1], SamplingParams(max_tokens=2))
    core.weights_version = 7
    assert {out.weights_version for out in core.step()} == {7}


@pytest.mark.parametrize("name", ["submit", "run_weights_phase", "shutdown"])
def test_both_executors_have_the_protocols_methods(name: str) -> None:
    from aioworker.compute.executor_thread import ExecutorThread

    wanted = inspect.signature(getattr(Executor, name))
    for executor_class in (FakeExecutor, ExecutorThread):
        found = inspect.signature(getattr(executor_class, name))
        assert list(found.parameters) == list(wanted.parameters), executor_class
