"""Releasing memory on the CPU frees the weights (they already live in host memory, so they must
go somewhere else), and resuming restores them bit for bit."""

from __future__ import annotations

import pytest
import torch

from aioworker.core.sampling_params import SamplingParams
from aioworker.core.weights_phase import WeightsPhase
from tests.conftest import make_engine

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
PROBES = [[1, 2, 3, 4], [20, 30, 40]]


@pytest.fixture(scope="module")
def engine(embedded_model_dir):
    # Without packed copies: those are freed with the weights anyway, and would hide weights
    # that stay resident (538 MB of each).
    settings = {"cache.num_blocks": 16, "model.max_model_len": 256}
    engine = make_engine(embedded_model_dir, **settings, **{"device.cpu_packed_weights": False})
    yield engine
    engine.close()


def run(engine, op: str, **fields) -> int:
    return engine.executor.run_weights_phase(WeightsPhase(op=op, **fields)).result()


def test_release_frees_the_weights_and_resume_restores_them(engine) -> None:
    params = dict(engine.executor.weights.model.named_parameters())
    weight_bytes = sum(p.numel() * p.element_size() for p in params.values())
    saved = {name: p.detach().clone() for name, p in params.items()}
    tokens = [c.token_ids for c in engine.generate(PROBES, GREEDY)]

    freed = run(engine, "release", weights=True, kv_cache=False)
    assert freed >= 0.8 * weight_bytes, f"freed {freed} of {weight_bytes} bytes of weights"

    run(engine, "resume")
    assert all(torch.equal(params[name].data, saved[name]) for name in params)
    assert [c.token_ids for c in engine.generate(PROBES, GREEDY)] == tokens
