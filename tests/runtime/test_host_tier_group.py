"""The host KV tier in a tensor-parallel group of two processes (gloo): each rank keeps its own
shard of every block and the driver decides for both. A chat whose history is pushed out of a
tiny device cache between turns, with a weights update between the turns, answers as one rank
without a tier does on the same weights: no stale block is served after the update."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

from aioworker.core.sampling_params import SamplingParams
from aioworker.wire.client import Client
from tests.conftest import make_engine
from tests.tiny_models import build_tiny_model, scaled_checkpoint
from tests.workers import admin, deployment, running

SETTINGS = {"model.dtype": "float32", "model.max_model_len": 256}
# 24 blocks of 16 tokens: two users' histories fit, six do not.
TIERED = {"cache.num_blocks": 24, "cache.host_kv_bytes": 8 << 20, "cache.preemption": "swap"}
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
NUM_USERS = 6


def next_turn(histories: list[list[int]], answers: list[list[int]], rng, vocab: int) -> None:
    for history, answer in zip(histories, answers, strict=True):
        history.extend(answer + [rng.randrange(vocab) for _ in range(5)])


async def turn(config, histories: list[list[int]]) -> list[list[int]]:
    async with Client.from_config(config) as client:
        done = await asyncio.gather(*(client.generate(h, GREEDY) for h in histories))
    return [c.token_ids for c in done]


def one_rank(path: Path, histories: list[list[int]]) -> list[list[int]]:
    engine = make_engine(path, **SETTINGS, **{"cache.num_blocks": 256})
    try:
        return [c.token_ids for c in engine.generate(histories, GREEDY)]
    finally:
        engine.close()


def test_two_ranks_with_a_host_tier_equal_one_rank_without(tmp_path) -> None:
    hf = build_tiny_model("qwen3", tmp_path / "model", logit_scale=4.0)
    path, vocab = tmp_path / "model", hf.config.vocab_size
    updated = scaled_checkpoint(path, tmp_path / "updated", "down_proj")
    rng = random.Random(3)
    histories = [[rng.randrange(vocab) for _ in range(100 + u)] for u in range(NUM_USERS)]
    config, set_args = deployment(
        **{"model.path": str(path), **SETTINGS, **TIERED, "parallel.tensor_parallel_size": 2}
    )
    with running(config, set_args):
        first = asyncio.run(turn(config, histories))
        assert first == one_rank(path, histories)
        next_turn(histories, first, rng, vocab)
        second = asyncio.run(turn(config, histories))  # history from the host
        status = admin(config, "status").data
        assert second == one_rank(path, histories)
        next_turn(histories, second, rng, vocab)
        assert admin(config, "update-weights", str(updated), timeout=60).ok
        third = asyncio.run(turn(config, histories))
    assert status["host_kv_hit_blocks"] >= NUM_USERS * 5
    assert third == one_rank(updated, histories)
