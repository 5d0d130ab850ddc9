"""Parallel samples on the embedded model: `n` samples of one prompt equal n requests seeded
seed..seed+n-1, hold the prompt's full blocks once, end together on abort, and survive the
preemption of some of them."""

from __future__ import annotations

import random

import msgspec
import pytest

from aioworker.core.sampling_params import SamplingParams
from tests.conftest import make_engine

pytestmark = pytest.mark.slow
BLOCK = 16
PROMPT = [random.Random(5).randrange(200, 40000) for _ in range(3 * BLOCK + 5)]
SAMPLED = SamplingParams(temperature=0.9, top_p=0.95, seed=11, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def engine(embedded_model_dir):
    engine = make_engine(embedded_model_dir)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def singles(engine) -> list[list[int]]:
    params = [msgspec.structs.replace(SAMPLED, seed=11 + i) for i in range(4)]
    return [c.token_ids for c in engine.generate([PROMPT] * 4, params)]


def test_n_samples_equal_requests_with_consecutive_seeds(engine, singles) -> None:
    samples = engine.generate([PROMPT], msgspec.structs.replace(SAMPLED, n=4))
    assert [c.token_ids for c in samples] == singles
    assert len(set(map(tuple, singles))) > 1  # they are different samples


def test_the_prompt_blocks_are_held_once(engine) -> None:
    engine.core.reset_prefix_cache()
    request_id = engine.add_request(PROMPT, msgspec.structs.replace(SAMPLED, n=4, max_tokens=8))
    started: set[int] = set()
    while len(started) < 4:
        started |= {out.sample_index for out in engine.step()}
    [samples] = [engine.scheduler.seqs_by_request[request_id]]
    shared = samples[0].block_table[:3]
    # Three full prompt blocks, shared by all four; each sample's own last block (53 + 8 < 64).
    assert all(s.block_table[:3] == shared for s in samples)
    assert [engine.block_manager.ref_counts[b] for b in shared] == [4, 4, 4]
    assert engine.block_manager.num_used_blocks == 3 + 4
    assert [s.num_cached_tokens for s in samples] == [0, 48, 48, 48]
    list(engine.stream())
    assert engine.block_manager.num_used_blocks == 0


def test_abort_ends_every_sample(engine) -> None:
    request_id = engine.add_request(PROMPT, msgspec.structs.replace(SAMPLED, n=3, max_tokens=50))
    engine.step()
    assert engine.abort(request_id).finish_reason == "abort"
    assert request_id not in engine.scheduler.seqs_by_request
    list(engine.stream())  # steps in flight drain
    assert not engine.has_unfinished and engine.block_manager.num_used_blocks == 0


def test_preempted_samples_lose_nothing(embedded_model_dir, singles) -> None:
    longer = msgspec.structs.replace(SAMPLED, max_tokens=40)
    small = make_engine(embedded_model_dir, **{"cache.num_blocks": 12, "model.max_model_len": 128})
    try:
        samples = small.generate([PROMPT], msgspec.structs.replace(longer, n=4))
        assert small.scheduler.num_preemptions > 0
    finally:
        small.close()
    # Sampling depends only on a sequence's own tokens and seed: the first 8 tokens match.
    assert [c.token_ids[:8] for c in samples] == singles
    assert all(len(c.token_ids) == 40 for c in samples)
