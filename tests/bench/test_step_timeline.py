"""W1's breakdown (bench/step_timeline.py) on a CPU engine: every completed step recorded once,
with its kind and batch, its times adding up to the run's, and the engine as before afterwards."""

from __future__ import annotations

import time

import pytest

from aioworker.bench.step_timeline import StepRecord, StepTimeline
from aioworker.core.sampling_params import SamplingParams
from tests.conftest import make_engine
from tests.tiny_models import build_tiny_model


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("tiny")
    build_tiny_model("qwen3", model_dir)
    engine = make_engine(model_dir, **{"model.dtype": "float32"})
    yield engine
    engine.close()


def test_every_step_is_recorded_with_its_kind_and_the_times_add_up(engine) -> None:
    prompts = [[1 + i, 2, 3, 4, 5][: 2 + i] for i in range(3)]
    params = [
        SamplingParams(temperature=0.0, max_tokens=4 + 3 * i, ignore_eos=True) for i in range(3)
    ]
    launches = []
    engine.core.scheduler.schedule = _counting(engine.core.scheduler.schedule, launches)
    try:
        with StepTimeline(engine) as timeline:
            started = time.perf_counter()
            engine.generate(prompts, params)
            wall = time.perf_counter() - started
    finally:
        del engine.core.scheduler.schedule
    steps = timeline.steps
    assert len(steps) == sum(plan is not None for plan in launches)  # each submitted plan once
    assert sum(s.prefill_tokens for s in steps) == sum(len(p) for p in prompts)
    decode_rows = sum(s.rows for s in steps if not s.prefill_tokens)
    sampled_in_prefill = sum(s.rows for s in steps if s.prefill_tokens)
    assert decode_rows + sampled_in_prefill == sum(p.max_tokens for p in params)
    assert all(s.wait_s >= 0 and s.host_s > 0 for s in steps)
    assert sum(s.seconds for s in steps) == pytest.approx(wall, rel=0.2, abs=0.01)
    # The executor thread's launch of each step, matched to it by step id: on the CPU a launch
    # runs the whole step, so the launches together take most of the run.
    assert all(s.launch_s is not None and s.launch_s > 0 for s in steps)
    assert sum(s.launch_s for s in steps) <= wall
    assert "launch" not in vars(engine.core) and "complete" not in vars(engine.core)  # detached
    assert "launch" not in vars(engine.core.executor.runner)
    assert not timeline._launch_by_step  # every launch timed was taken by its step


def test_the_summary_groups_steps_by_kind_and_batch() -> None:
    timeline = StepTimeline(engine=None)
    timeline.steps = [
        StepRecord(rows=4, prefill_tokens=300, wait_s=0.010, host_s=0.002),
        StepRecord(rows=200, prefill_tokens=0, wait_s=0.004, host_s=0.001, launch_s=0.002),
        StepRecord(rows=200, prefill_tokens=0, wait_s=0.006, host_s=0.001, launch_s=0.004),
        StepRecord(rows=3, prefill_tokens=0, wait_s=0.0, host_s=0.002),
    ]
    summary = timeline.summary()
    parts = summary.split("; ")
    assert parts[0].startswith("steps with prefill: 1 steps, 0.01 s (46%)")
    assert parts[1] == (
        "decode of <= 256: 2 steps, 0.01 s (46%), a step 1.00 ms host + 5.00 ms waiting on the "
        "executor (the executor's launch 3.00 ms)"
    )
    assert parts[2].startswith("decode of <= 8: 1 steps") and "2.00 ms host + 0.00 ms" in parts[2]
    assert "launch" not in parts[2]  # not timed: nothing said
    assert parts[3] == "no Triton kernel compiled"  # never attached


def _counting(schedule, plans: list):
    def counted():
        plan = schedule()
        plans.append(plan)
        return plan

    return counted
