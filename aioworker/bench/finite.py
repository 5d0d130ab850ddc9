"""Whether an engine's logits are finite over a few greedy steps: a benchmark of a broken engine
times the same bytes and instructions as a working one, so only a check of the values shows it.
A dummy load once left the GPU formats' quantized weights unwritten, and W4 timed NaN models for
weeks (docs/benchmarks.md, 2026-12-06).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from aioworker.core.sampling_params import SamplingParams


@dataclass(frozen=True)
class StepLogits:
    rows: int
    nan: int
    inf: int

    @property
    def finite(self) -> bool:
        return self.nan == 0 and self.inf == 0


def greedy_step_logits(engine, prompt: list[int], tokens: int) -> list[StepLogits]:
    """Generate `tokens` greedy tokens after `prompt`, counting NaN and inf in each sampled
    step's logits (a sync a step: for checks, not timed runs)."""
    sampler = engine.executor.runner.sampler
    sample = sampler.sample
    steps: list[StepLogits] = []

    def counted(logits, rows, controls=None):
        nan, inf = int(torch.isnan(logits).sum()), int(torch.isinf(logits).sum())
        steps.append(StepLogits(logits.shape[0], nan, inf))
        return sample(logits, rows, controls)

    sampler.sample = counted
    try:
        params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
        engine.generate([prompt], params)
    finally:
        del sampler.sample  # the instance attribute: the class's method again
    return steps


def require_finite(engine, prompt: list[int], what: str) -> None:
    """Raise where a few greedy steps' logits are not finite: `what` names the engine."""
    steps = greedy_step_logits(engine, prompt, 4)
    broken = [step for step in steps if not step.finite]
    if broken:
        raise RuntimeError(
            f"{what}: the logits of {len(broken)} of {len(steps)} greedy steps are not finite "
            f"(first: {broken[0].nan} NaN, {broken[0].inf} inf); timing it would time a broken "
            "model. Find the layer with tools/finite_logits.py"
        )
