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
    """Steps and weights phases run in submission order. `step_seconds` > 0 makes each step take
    that long on a thread of its own, like a model; `phase_seconds` does the same for weights
    phases. Faults on request: steps from `fail_at_step` on raise, and so does the weights phase
    named `fail_phase`. Like a real rank, a step after `release` (weights) fails until `resume`."""

    def __init__(
        self,
        fail_at_step: int | None = None,
        step_seconds: float = 0.0,
        fail_phase: str | None = None,
        phase_seconds: float = 0.0,
    ) -> None:
        self.fail_at_step = fail_at_step
        self.step_seconds = step_seconds
        self.fail_phase = fail_phase
        self.phase_seconds = phase_seconds
        self.weights_released = False
        self.phases_run: list[str] = []
        self._pending: queue.SimpleQueue | None = None
        if step_seconds > 0 or phase_seconds > 0:
            self._pending = queue.SimpleQueue()
            threading.Thread(target=self._run_in_order, daemon=True).start()

    def submit(self, plan: StepPlan) -> Future[StepResult]:
        return self._enqueue(lambda future: self._settle(plan, future), self.step_seconds)

    def run_weights_phase(self, phase: WeightsPhase) -> Future[int]:
        return self._enqueue(lambda future: self._run_phase(phase, future), self.phase_seconds)

    def call(self, fn: Callable[[], Any]) -> Future:
        future: Future = Future()
        future.set_result(fn())
        return future

    def shutdown(self, timeout: float | None = None) -> bool:
        return True

    def _enqueue(self, settle: Callable[[Future], None], seconds: float) -> Future:
        future: Future = Future()
        if self._pending is None:
            future.set_running_or_notify_cancel()
            settle(future)
        else:
            self._pending.put((settle, future, seconds))
        return future

    def _run_in_order(self) -> None:
        while True:
            settle, future, seconds = self._pending.get()
            if not future.set_running_or_notify_cancel():
                continue  # its waiter gave up (the rank is stopping)
            time.sleep(seconds)
            settle(future)

    def _settle(self, plan: StepPlan, future: Future) -> None:
        if self.fail_at_step is not None and plan.step_id >= self.fail_at_step:
            future.set_exception(RuntimeError(f"injected failure at step {plan.step_id}"))
            return
        if self.weights_released and not plan.is_empty:
            future.set_exception(RuntimeError("a step ran on released weights"))
            return
        sampled = [
            fake_token(start + num)
            for start, num, do_sample in zip(
                plan.start_positions, plan.num_scheduled_tokens, plan.sample, strict=True
            )
            if do_sample
        ]
        future.set_result(StepResult(plan.step_id, sampled))

    def _run_phase(self, phase: WeightsPhase, future: Future) -> None:
        self.phases_run.append(phase.op)
        if phase.op == self.fail_phase:
            future.set_exception(RuntimeError(f"injected failure in weights phase {phase.op}"))
            return
        if phase.op == "release" and phase.weights:
            self.weights_released = True
        elif phase.op == "resume":
            self.weights_released = False
        future.set_result(0)


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


def build_fake(config: WorkerConfig, **faults: Any) -> tuple[FakeExecutor, LoadedRank]:
    """A fake executor (see FakeExecutor for `faults`) and the rank it pretends to be."""
    return FakeExecutor(**faults), fake_loaded_rank(config)
