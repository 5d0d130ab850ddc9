"""Releasing memory on the CPU frees the weights (they already live in host memory, so they must
go somewhere else), and resuming restores them bit for bit; releasing the cache frees the
sequences' sampler state too."""

from __future__ import annotations

import msgspec
import pytest
import torch

from aioworker.core.plan import LogitControls, NewSeq
from aioworker.core.sampling_params import SamplingParams
from aioworker.core.weights_phase import WeightsPhase
from tests.conftest import make_engine
from tests.plans import GREEDY as GREEDY_SETTINGS

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


def test_releasing_the_cache_frees_the_state_of_logit_controls(engine) -> None:
    """The sequences go with the cache (preempted, rebuilt when re-admitted); a release of the
    weights alone keeps them running, state and all."""
    controls = engine.executor.runner.controls
    settings = msgspec.structs.replace(GREEDY_SETTINGS, controls=LogitControls(min_p=0.1))
    admit = engine.executor.call(lambda: controls.admit(NewSeq(-7, 1, settings, [1])))
    admit.result()
    run(engine, "release", weights=True, kv_cache=False)
    run(engine, "resume")
    assert len(controls) == 1
    run(engine, "release", weights=False, kv_cache=True)
    run(engine, "resume")
    assert len(controls) == 0 and controls.kinds[-1].pool.tensors == {}
