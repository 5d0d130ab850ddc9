"""The one place where the torch-free side meets the model: an executor takes plans and weights
phases and answers with futures. The executor thread (compute/) and the fake executor (core/)
both satisfy this Protocol; the engine core and the runtime know nothing else of them."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Protocol

from aioworker.core.grammar import StepMasks
from aioworker.core.plan import StepPlan, StepResult
from aioworker.core.weights_phase import WeightsPhase


class Executor(Protocol):
    def submit(self, plan: StepPlan) -> Future[StepResult]:
        """Queue a step behind the ones already submitted; the future gives its sampled tokens."""
        ...

    def provide_masks(self, masks: StepMasks) -> None:
        """A submitted step's grammar masks (any thread): its sampling waits for them."""
        ...

    def run_weights_phase(self, phase: WeightsPhase) -> Future[int]:
        """Run a weights phase after the steps already submitted; the future gives bytes freed."""
        ...

    def shutdown(self, timeout: float | None = None) -> bool:
        """Stop after the queued work; False if still busy after `timeout` seconds."""
        ...
