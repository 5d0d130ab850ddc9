"""The host KV tier on the embedded model, on the CPU (where the "host" tier is a second pool of
blocks): with a device KV cache too small for the work, outputs equal the tier off, and the tier
is really used: evicted history comes back from it, preemption swaps through it, and a weights
update or a reset leaves nothing in it that could serve."""

from __future__ import annotations

import random

import pytest

from aioworker.core.outputs import FinishReason
from aioworker.core.sampling_params import SamplingParams
from tests.conftest import make_engine

pytestmark = pytest.mark.slow
BLOCK = 16
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
# 40 blocks of 16 tokens: one user's history fits, six users' do not.
TINY_DEVICE = {"cache.num_blocks": 40, "model.max_model_len": 640}
HOST_TIER = {"cache.host_kv_bytes": 64 << 20}


@pytest.fixture(scope="module")
def reference(embedded_model_dir):
    engine = make_engine(embedded_model_dir, **{"cache.enable_prefix_caching": False})
    yield engine
    engine.close()


@pytest.fixture
def tiered(embedded_model_dir):
    engine = make_engine(embedded_model_dir, **TINY_DEVICE, **HOST_TIER)
    yield engine
    engine.close()


def random_tokens(rng: random.Random, n: int, vocab: int = 40000) -> list[int]:
    return [rng.randrange(200, vocab) for _ in range(n)]


def chat(
    engine, histories: list[list[int]], turns: int, rng: random.Random, vocab: int = 40000
) -> list[list[int]]:
    """Users take turns; each turn appends the answer and a new message to that user's history,
    and every other user's turn in between pushes it out of the device cache."""
    answers = []
    for _ in range(turns):
        for history in histories:
            (completion,) = engine.generate([history], GREEDY)
            answers.append(completion.token_ids)
            history.extend(completion.token_ids + random_tokens(rng, 5, vocab))
    return answers


def stats(engine) -> dict:
    return engine.scheduler.connector.stats()


def test_a_chat_whose_history_is_evicted_loads_it_back_and_answers_the_same(
    tiered, reference
) -> None:
    users = [random_tokens(random.Random(u), 9 * BLOCK + u) for u in range(6)]
    tiered_answers = chat(tiered, [list(u) for u in users], 2, random.Random(9))
    reference_answers = chat(reference, [list(u) for u in users], 2, random.Random(9))
    assert tiered_answers == reference_answers
    counts = stats(tiered)
    # Each user's second turn found its first turn's prompt in one tier or the other; the
    # device holds two users' histories at most, so most came from the host.
    device_hit_blocks = tiered.block_manager.num_hit_tokens // BLOCK
    assert device_hit_blocks + counts["host_kv_hit_blocks"] >= 6 * 9
    assert counts["host_kv_hit_blocks"] >= 3 * 9
    assert counts["host_kv_saved_blocks"] > 0
    assert counts["host_kv_bytes_loaded"] == counts["host_kv_hit_blocks"] * (
        tiered.loaded.kv_block_bytes
    )


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_preemption_swaps_or_recomputes_as_set_and_answers_the_same(
    embedded_model_dir, reference, mode: str
) -> None:
    rng = random.Random(3)
    prompts = [random_tokens(rng, 100 + 7 * i) for i in range(6)]
    params = SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)
    engine = make_engine(
        embedded_model_dir, **TINY_DEVICE, **HOST_TIER, **{"cache.preemption": mode}
    )
    try:
        got = [c.token_ids for c in engine.generate(prompts, params)]
        counts = stats(engine)
        assert engine.scheduler.num_preemptions > 0
    finally:
        engine.close()
    if mode == "swap":
        assert counts["host_kv_swaps_out"] > 0 and counts["host_kv_swaps_in"] > 0
    else:
        assert counts["host_kv_swaps_out"] == 0
    assert got == [c.token_ids for c in reference.generate(prompts, params)]


def test_a_reset_between_turns_serves_nothing_from_the_host(tiered) -> None:
    rng = random.Random(5)
    users = [random_tokens(rng, 9 * BLOCK) for _ in range(6)]
    chat(tiered, users, 1, rng)
    assert stats(tiered)["host_kv_blocks_cached"] > 0
    tiered.core.reset_prefix_cache()  # what a weights update does before its first step
    assert stats(tiered)["host_kv_blocks_cached"] == 0
    hits_before = stats(tiered)["host_kv_hit_blocks"]
    chat(tiered, users, 1, rng)
    assert stats(tiered)["host_kv_hit_blocks"] == hits_before


def test_a_failed_copy_ends_its_requests_with_one_error_each_and_the_rank_serves_on(
    tiered, reference
) -> None:
    rng = random.Random(11)
    users = [random_tokens(rng, 9 * BLOCK) for _ in range(6)]
    chat(tiered, users, 1, rng)  # their prompts are on the host now
    copier = tiered.executor.runner.kv_copies
    copier.fail_copies = True
    failed = tiered.generate(users, GREEDY)
    copier.fail_copies = False
    lost = [c for c in failed if c.finish_reason is FinishReason.ERROR]
    assert lost and stats(tiered)["host_kv_copy_failures"] > 0
    for completion in lost:
        assert completion.token_ids == [] and "failed copy" in completion.error
    served = [c for c in failed if c.finish_reason is not FinishReason.ERROR]
    expected = {tuple(c.prompt_token_ids): c.token_ids for c in reference.generate(users, GREEDY)}
    assert all(c.token_ids == expected[tuple(c.prompt_token_ids)] for c in served)
    again = tiered.generate(users, GREEDY)
    assert [c.token_ids for c in again] == [expected[tuple(u)] for u in users]


@pytest.mark.gpu
def test_on_the_gpu_with_graphs_a_chat_and_swaps_equal_the_tier_off(tmp_path) -> None:
    from tests.tiny_models import build_tiny_model

    build_tiny_model("qwen3", tmp_path)
    gpu = {"device.kind": "cuda", "model.dtype": "float32", "model.path": str(tmp_path)}
    rng = random.Random(4)
    users = [random_tokens(rng, 9 * BLOCK, 384) for _ in range(6)]
    swap_prompts = [random_tokens(rng, 100 + 7 * i, 384) for i in range(6)]
    long = SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)
    results = {}
    for host_bytes in (0, 64 << 20):
        settings = {**gpu, **TINY_DEVICE, "cache.host_kv_bytes": host_bytes,
                    "cache.preemption": "swap"}  # fmt: skip
        from aioworker.config import load_config
        from aioworker.engine import LLMEngine

        engine = LLMEngine.from_config(load_config(overrides=settings), progress=False)
        try:
            assert engine.executor.runner.graphs is not None
            answers = chat(engine, [list(u) for u in users], 2, random.Random(9), 384)
            swapped = [c.token_ids for c in engine.generate(swap_prompts, long)]
            device_hits = engine.block_manager.num_hit_tokens // BLOCK
            results[host_bytes] = (answers, swapped, stats(engine), device_hits)
        finally:
            engine.close()
    assert results[0][:2] == results[64 << 20][:2]
    counts, device_hits = results[64 << 20][2:]
    assert device_hits + counts["host_kv_hit_blocks"] >= 6 * 9
    assert counts["host_kv_hit_blocks"] >= 3 * 9 and counts["host_kv_swaps_in"] > 0
