"""What operators read from a rank's expert counts: tokens per expert per step per layer, and
the busiest expert over the mean."""

from __future__ import annotations

from aioworker.core.expert_load import ExpertLoad, imbalance, summary, tokens_per_step

LOAD = ExpertLoad("experts 0-3 of 4", 0, (12, 12, 12, 36), num_steps=3, num_layers=2)


def test_tokens_per_expert_per_step_per_layer() -> None:
    assert tokens_per_step(LOAD) == [2.0, 2.0, 2.0, 6.0]


def test_since_an_earlier_reading() -> None:
    earlier = LOAD._replace(tokens=(10, 10, 10, 10), num_steps=2)
    assert tokens_per_step(LOAD, earlier) == [1.0, 1.0, 1.0, 13.0]


def test_imbalance_is_the_busiest_over_the_mean_and_zero_before_any_load() -> None:
    assert imbalance([2.0, 2.0, 2.0, 6.0]) == 2.0
    assert imbalance([0.0, 0.0]) == 0.0
    assert tokens_per_step(ExpertLoad("x", 0, (0, 0), 0, 2)) == [0.0, 0.0]


def test_summary_fields() -> None:
    assert summary(LOAD) == {
        "experts": "experts 0-3 of 4",
        "tokens_per_expert_per_step": {"min": 2.0, "mean": 3.0, "max": 6.0},
        "imbalance": 2.0,
        "steps": 3,
    }
