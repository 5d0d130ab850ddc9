"""The Prometheus view of expert load: per rank, a histogram with one observation per expert
(tokens per step per layer) and the busiest expert over the mean; nothing for a dense model."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from aioworker.core.expert_load import ExpertLoad
from aioworker.runtime.metrics import ExpertLoadCollector

LOADS = {
    0: ExpertLoad("experts 0-3 of 8", 0, (4, 4, 4, 20), num_steps=2, num_layers=2),
    1: ExpertLoad("experts 4-7 of 8", 4, (0, 0, 0, 0), num_steps=2, num_layers=2),
}


def exposition(loads) -> str:
    registry = CollectorRegistry()
    registry.register(ExpertLoadCollector("0", lambda: loads))
    return generate_latest(registry).decode()


def test_each_rank_gets_a_histogram_of_its_experts_and_an_imbalance() -> None:
    text = exposition(LOADS)
    # Rank 0: 1, 1, 1 and 5 tokens per step per layer.
    assert 'aioworker:expert_tokens_per_step_bucket{group="0",le="1",rank="0"} 3.0' in text
    assert 'aioworker:expert_tokens_per_step_bucket{group="0",le="10",rank="0"} 4.0' in text
    assert 'aioworker:expert_tokens_per_step_count{group="0",rank="0"} 4.0' in text
    assert 'aioworker:expert_tokens_per_step_sum{group="0",rank="0"} 8.0' in text
    assert 'aioworker:expert_load_imbalance{group="0",rank="0"} 2.5' in text
    assert 'aioworker:expert_load_imbalance{group="0",rank="1"} 0.0' in text


def test_a_dense_model_exposes_nothing() -> None:
    assert "expert" not in exposition({})
