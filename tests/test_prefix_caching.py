"""Prefix caching on the embedded model: outputs are the same with the cache on and off, and the
cache is actually hit (shared prefixes, a prompt that is a prefix of another, a prompt that ends
on a block boundary, preempted requests)."""

from __future__ import annotations

import random

import msgspec
import pytest

from aioworker.core.sampling_params import SamplingParams
from tests.conftest import make_engine

pytestmark = pytest.mark.slow
BLOCK = 16
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
SEEDED = SamplingParams(temperature=0.9, top_p=0.95, seed=7, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def uncached(embedded_model_dir):
    engine = make_engine(embedded_model_dir, **{"cache.enable_prefix_caching": False})
    yield engine
    engine.close()


@pytest.fixture
def cached(embedded_model_dir):
    """A fresh engine per test: its hit counts are the test's alone."""
    engine = make_engine(embedded_model_dir)
    yield engine
    engine.close()


def tokens(engine, prompts, params) -> list[list[int]]:
    return [c.token_ids for c in engine.generate(prompts, params)]


def random_tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(200, 40000) for _ in range(n)]


def test_a_batch_sharing_a_prefix_hits_and_answers_the_same(cached, uncached) -> None:
    rng = random.Random(1)
    system = random_tokens(rng, 5 * BLOCK + 3)
    prompts = [system + random_tokens(rng, rng.randint(1, 40)) for _ in range(6)]
    params = [GREEDY if i % 2 else msgspec.structs.replace(SEEDED, seed=i) for i in range(6)]
    warm = tokens(cached, prompts[:1], params[:1])  # the first fills the cache
    assert warm + tokens(cached, prompts[1:], params[1:]) == tokens(uncached, prompts, params)
    blocks = cached.block_manager
    # Each of the other five found the system prompt's five full blocks.
    assert blocks.num_hit_tokens >= 5 * 5 * BLOCK


def test_a_prompt_that_is_a_prefix_of_another(cached, uncached) -> None:
    rng = random.Random(2)
    long = random_tokens(rng, 4 * BLOCK + 9)
    short = long[: 2 * BLOCK + 5]
    for prompts in ([long, short], [short, long]):
        got = [tokens(cached, [p], GREEDY)[0] for p in prompts]
        assert got == tokens(uncached, prompts, GREEDY)
    assert cached.block_manager.num_hit_tokens >= 2 * BLOCK * 3


def test_a_prompt_ending_on_a_block_boundary_computes_its_last_block_again(
    cached, uncached
) -> None:
    prompt = random_tokens(random.Random(3), 3 * BLOCK)
    first = tokens(cached, [prompt], SEEDED)
    hits_before = cached.block_manager.num_hit_tokens
    again = tokens(cached, [prompt], SEEDED)
    # Two of three blocks hit: the last token is computed, and with it its whole block.
    assert cached.block_manager.num_hit_tokens - hits_before == 2 * BLOCK
    assert first == again == tokens(uncached, [prompt], SEEDED)


def test_preempted_requests_hit_their_own_blocks_and_answer_the_same(
    embedded_model_dir, uncached
) -> None:
    rng = random.Random(4)
    prompts = [random_tokens(rng, rng.randint(20, 70)) for _ in range(6)]
    params = msgspec.structs.replace(GREEDY, max_tokens=40)
    small = make_engine(embedded_model_dir, **{"cache.num_blocks": 16, "model.max_model_len": 256})
    try:
        got = tokens(small, prompts, params)
        assert small.scheduler.num_preemptions > 0
        assert small.block_manager.num_hit_tokens > 0  # recomputed from its own cached blocks
    finally:
        small.close()
    assert got == tokens(uncached, prompts, params)


def test_requests_admitted_in_the_same_step_share_what_the_first_computes(cached, uncached) -> None:
    """The second reads the first's prefix in the very step that writes it: every layer writes
    the whole batch's keys and values before any attention reads them."""
    rng = random.Random(6)
    system = random_tokens(rng, 4 * BLOCK)
    prompts = [system + random_tokens(rng, 10 + i) for i in range(4)]
    assert tokens(cached, prompts, GREEDY) == tokens(uncached, prompts, GREEDY)
    assert cached.block_manager.num_hit_tokens == 3 * 4 * BLOCK


def test_chunked_prompts_start_after_their_cached_prefix(embedded_model_dir, uncached) -> None:
    rng = random.Random(7)
    system = random_tokens(rng, 6 * BLOCK)
    prompts = [system + random_tokens(rng, 50) for _ in range(3)]
    chunked = make_engine(embedded_model_dir, **{"scheduler.max_num_batched_tokens": 40})
    try:
        got = [tokens(chunked, [p], SEEDED)[0] for p in prompts]
        assert chunked.block_manager.num_hit_tokens >= 2 * 6 * BLOCK
    finally:
        chunked.close()
    assert got == tokens(uncached, prompts, SEEDED)
