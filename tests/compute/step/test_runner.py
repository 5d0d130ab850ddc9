"""The model runner's one launch path: on the CPU, launch runs the forward and sampling before it
returns, and execute is launch(plan).result() for every runner."""

from __future__ import annotations

from types import SimpleNamespace

import msgspec
import pytest

from aioworker.compute.step.stages import CompletedStep
from aioworker.core.plan import LogitControls, NewSeq, StepPlan
from aioworker.core.sampling_params import SamplingParams
from tests.conftest import make_engine
from tests.plans import GREEDY, empty_plan, prefill_plan
from tests.tiny_models import build_tiny_model

PROMPT = [5, 17, 42, 8, 99, 3]


@pytest.fixture(scope="module")
def tiny_engine(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-qwen3")
    build_tiny_model("qwen3", path)
    engine = make_engine(path, **{"cache.num_blocks": 64, "model.max_model_len": 256})
    yield engine
    engine.close()


def prefill(step_id: int, seq_id: int) -> StepPlan:
    """The whole prompt in one step, into a block of its own (block = -seq_id)."""
    return prefill_plan(PROMPT, [-seq_id], seq_id, step_id)


def release(step_id: int, seq_id: int) -> StepPlan:
    return empty_plan(step_id, released_seq_ids=(seq_id,))


def test_cpu_launch_samples_before_it_returns_and_execute_agrees(tiny_engine) -> None:
    [expected] = tiny_engine.generate(
        [PROMPT], SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    )
    runner = tiny_engine.executor.runner

    def launch_then_execute():
        handle = runner.launch(prefill(-1, -1))
        sampled_at_launch = runner.seqs[-1].last_sampled
        executed = runner.execute(prefill(-2, -2))
        runner.execute(release(-3, -1))
        runner.execute(release(-4, -2))
        return handle, sampled_at_launch, executed

    handle, sampled_at_launch, executed = tiny_engine.executor.call(launch_then_execute).result()
    assert isinstance(handle, CompletedStep)
    assert sampled_at_launch == expected.token_ids[0]
    assert handle.result().sampled_token_ids == expected.token_ids
    assert executed.sampled_token_ids == expected.token_ids
    assert -1 not in runner.seqs and -2 not in runner.seqs


def test_the_cuda_runner_overrides_only_its_stages_of_the_one_pipeline() -> None:
    pytest.importorskip("triton")
    from aioworker.compute.step.cuda_runner import CudaModelRunner

    stages = {"launch", "sample", "execute", "prepare", "forward", "record", "complete"}
    assert stages & set(vars(CudaModelRunner)) == {"prepare", "forward", "record", "complete"}
    assert not hasattr(CudaModelRunner, "decode_forward")


def test_only_the_driver_keeps_the_state_of_logit_controls(tiny_engine) -> None:
    """Peers never sample: a plan that admits a sequence with controls leaves them no state."""
    runner = tiny_engine.executor.runner
    controlled = msgspec.structs.replace(
        GREEDY, controls=LogitControls(repetition_penalty=1.3, bad_words_token_ids=[[5, 6]])
    )
    plan = msgspec.structs.replace(
        prefill(-1, -1), new_seqs=[NewSeq(-1, len(PROMPT), controlled, PROMPT)]
    )

    def admit_then_release(is_driver: bool) -> int:
        tp, runner.tp = runner.tp, SimpleNamespace(is_driver=is_driver, size=1)
        try:
            runner.apply_plan_state(plan)
            kept = len(runner.controls)
            runner.apply_plan_state(release(-2, -1))
        finally:
            runner.tp = tp
        return kept

    kept = [
        tiny_engine.executor.call(lambda d=d: admit_then_release(d)).result() for d in (True, False)
    ]
    assert kept == [1, 0] and len(runner.controls) == 0
