"""An executor that answers every plan at once with made-up tokens, and the loaded rank it
pretends to be. For testing and measuring the control plane without a model. Torch-free."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from aioworker.config import WorkerConfig
from aioworker.core.loaded_rank import LoadedRank
from aioworker.core.plan import StepPlan, StepResult
from aioworker.core.weights_phase import WeightsPhase

FAKE_VOCAB_SIZE = 32000


def fake_token(position: int) -> int:
    """The token a fake step samples at `position` of a sequence (never 0, the fake EOS)."""
    return 1 + (position * 7919) % (FAKE_VOCAB_SIZE - 1)


class FakeExecutor:
    """`step_seconds` > 0 makes each step take that long on a thread of its own, like a model."""

    def __init__(self, fail_at_step: int | None = None, step_seconds: float = 0.0) -> None:
        self.fail_at_step = fail_at_step
        self.step_seconds = step_seconds
        self._pending: queue.SimpleQueue | None = None
        if step_seconds > 0:
            self._pending = queue.SimpleQueue()
            threading.Thread(target=self._run_slowly, daemon=True).start()

    def submit(self, plan: StepPlan) -> Future[StepResult]:
        future: Future[StepResult] = Future()
        if self._pending is not None:
            self._pending.put((plan, future))
        else:
            self._settle(plan, future)
        return future

    def _run_slowly(self) -> None:
        while True:
            plan, future = self._pending.get()
            time.sleep(self.step_seconds)
            self._settle(plan, future)

    def _settle(self, plan: StepPlan, future: Future) -> None:
        if self.fail_at_step is not None and plan.step_id >= self.fail_at_step:
            future.set_exception(RuntimeError(f"injected failure at step {plan.step_id}"))
            return
        sampled = [
            fake_token(start + num)
            for start, num, do_sample in zip(
                plan.start_positions, plan.num_scheduled_tokens, plan.sample, strict=True
            )
            if do_sample
        ]
        future.set_result(StepResult(plan.step_id, sampled))

    def call(self, fn: Callable[[], Any]) -> Future:
        future: Future = Future()
        future.set_result(fn())
        return future

    def run_weights_phase(self, phase: WeightsPhase) -> Future[int]:
        return self.call(lambda: 0)

    def shutdown(self, timeout: float | None = None) -> bool:
        return True


def fake_loaded_rank(config: WorkerConfig) -> LoadedRank:
    return LoadedRank(
        model_dir=Path("fake"),
        vocab_size=FAKE_VOCAB_SIZE,
        eos_token_ids=(0,),
        max_model_len=config.model.max_model_len or 4096,
        num_blocks=config.cache.num_blocks or 65536,
        block_size=config.cache.block_size,
        device="fake",
        dtype="none",
        load_seconds=0.0,
    )


def build_fake(
    config: WorkerConfig, fail_at_step: int | None = None, step_seconds: float = 0.0
) -> tuple[FakeExecutor, LoadedRank]:
    return FakeExecutor(fail_at_step, step_seconds), fake_loaded_rank(config)
