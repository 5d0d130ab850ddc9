"""The benchmarks' finiteness check (bench/finite.py) on the embedded model: a working engine's
greedy steps count no NaN or inf and pass; an engine whose logits are NaN is refused by name,
before anything is timed; the sampler is left as it was."""

from __future__ import annotations

import pytest

from aioworker.bench.finite import greedy_step_logits, require_finite


def test_a_working_engines_steps_are_finite_and_the_sampler_is_restored(embedded_engine):
    sampler = embedded_engine.executor.runner.sampler
    steps = greedy_step_logits(embedded_engine, [1, 2, 3, 4, 5], 3)
    assert len(steps) == 3 and all(step.finite and step.rows == 1 for step in steps)
    assert "sample" not in vars(sampler)  # the class's method again
    require_finite(embedded_engine, [1, 2, 3], "the embedded model")


def test_nan_logits_are_refused_naming_the_engine(embedded_engine, monkeypatch):
    model = embedded_engine.executor.runner.model
    real = model.compute_logits
    monkeypatch.setattr(model, "compute_logits", lambda hidden: real(hidden) * float("nan"))
    with pytest.raises(RuntimeError, match=r"W4 test engine: the logits of 4 of 4 greedy steps"):
        require_finite(embedded_engine, [1, 2, 3], "W4 test engine")
    steps = greedy_step_logits(embedded_engine, [7, 8], 1)
    assert steps[0].nan == steps[0].rows * model.lm_head.vocab_size and steps[0].inf == 0
