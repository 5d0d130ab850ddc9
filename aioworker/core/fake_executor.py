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

import msgspec

from aioworker.config import WorkerConfig
from aioworker.core.grammar import StepMasks
from aioworker.core.loaded_rank import LoadedRank
from aioworker.core.plan import StepPlan, StepResult
from aioworker.core.weights_phase import WeightsPhase

FAKE_VOCAB_SIZE = 32000
# The weights the fake rank reports holding and reading per step, as a small model's would be.
FAKE_WEIGHT_BYTES_HELD = 120 << 20
FAKE_WEIGHT_BYTES_READ = 96 << 20


def fake_token(position: int) -> int:
    """The token a fake step samples at `position` of a sequence (never 0, the fake EOS)."""
    return 1 + (position * 7919) % (FAKE_VOCAB_SIZE - 1)


def fake_draft(position: int) -> int:
    """What the fake executor's draft model proposes at `position`: the token a fake step
    samples there, except at every fifth position (so that some drafts are rejected)."""
    token = fake_token(position)
    return token if position % 5 else 1 + token % (FAKE_VOCAB_SIZE - 1)


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
        self.masks_provided: list[int] = []
        self._pending: queue.SimpleQueue | None = None
        if step_seconds > 0 or phase_seconds > 0:
            self._pending = queue.SimpleQueue()
            threading.Thread(target=self._run_in_order, daemon=True).start()

    def submit(self, plan: StepPlan) -> Future[StepResult]:
        return self._enqueue(lambda future: self._settle(plan, future), self.step_seconds)

    def provide_masks(self, masks: StepMasks) -> None:
        """Fake tokens follow no grammar: the masks are only counted."""
        self.masks_provided.append(masks.step_id)

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
        if plan.has_drafts:
            result = _verified(plan)
        else:
            sampled = [
                fake_token(start + num)
                for start, num, do_sample in zip(
                    plan.start_positions, plan.num_scheduled_tokens, plan.sample, strict=True
                )
                if do_sample
            ]
            result = StepResult(plan.step_id, sampled)
        if plan.drafts_next:
            result = _with_next_drafts(plan, result)
        future.set_result(result)

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


def _verified(plan: StepPlan) -> StepResult:
    """A plan with drafts, verified like a greedy model whose token at each position is
    fake_token(position): the drafts that equal it, then the first one that differs."""
    tokens, counts = [], []
    end = 0
    for start, num, num_drafts, do_sample in zip(
        plan.start_positions,
        plan.num_scheduled_tokens,
        plan.num_draft_tokens,
        plan.sample,
        strict=True,
    ):
        end += num
        if not do_sample:
            continue
        drafts = plan.input_token_ids[end - num_drafts : end]
        position = start + num - num_drafts  # of the token sampled after the last known one
        accepted = 0
        while accepted < num_drafts and drafts[accepted] == fake_token(position + accepted):
            accepted += 1
        tokens += [*drafts[:accepted], fake_token(position + accepted)]
        counts.append(accepted + 1)
    return StepResult(plan.step_id, tokens, num_sampled=counts)


def _with_next_drafts(plan: StepPlan, result: StepResult) -> StepResult:
    """The drafts a draft model would propose after the step: fake_draft at the positions that
    follow each sampled sequence's last kept token."""
    starts, nums = plan.start_positions, plan.num_scheduled_tokens
    ends = [start + num for start, num in zip(starts, nums, strict=True)]
    asked = [
        (end - (plan.num_draft_tokens[i] if plan.has_drafts else 0), k)
        for i, (end, k, do_sample) in enumerate(
            zip(ends, plan.num_next_drafts, plan.sample, strict=True)
        )
        if do_sample
    ]
    drafts = []
    for (first, k), tokens in zip(asked, result.tokens_per_sequence(), strict=True):
        last = first + len(tokens) - 1  # the position of the sequence's last kept token
        drafts.append([fake_draft(last + 1 + i) for i in range(k)])
    return msgspec.structs.replace(result, next_drafts=drafts)


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
        quantization=config.model.quantization,
        weight_bytes_held=FAKE_WEIGHT_BYTES_HELD,
        weight_bytes_read=FAKE_WEIGHT_BYTES_READ,
    )


def build_fake(config: WorkerConfig, **faults: Any) -> tuple[FakeExecutor, LoadedRank]:
    """A fake executor (see FakeExecutor for `faults`) and the rank it pretends to be."""
    return FakeExecutor(**faults), fake_loaded_rank(config)
