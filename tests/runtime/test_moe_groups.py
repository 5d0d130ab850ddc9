"""MoE models across a tensor-parallel group of two processes (gloo): experts split like a
dense MLP (expert_parallel_size 1) and whole experts per rank, tokens sent to them by
all_to_all (expert_parallel_size 2), each equal to one rank under concurrent requests; an
expert-parallel group's weights updates and memory release reach every rank's experts, and a
lost rank is noticed as in any group."""

from __future__ import annotations

import asyncio
import random
import signal
import time

import pytest

from aioworker.core.sampling_params import SamplingParams
from aioworker.runtime.state import ExitCode
from aioworker.wire.client import Client
from tests.conftest import make_engine
from tests.runtime.test_reliability import failed_at
from tests.tiny_models import build_tiny_model, scaled_checkpoint
from tests.workers import admin, deployment, kill, running

SETTINGS = {"model.dtype": "float32", "cache.num_blocks": 256, "model.max_model_len": 256}
NUM_REQUESTS = 8


def requests(vocab_size: int) -> tuple[list[list[int]], list[SamplingParams]]:
    rng = random.Random(7)
    prompts = [
        [rng.randrange(vocab_size) for _ in range(rng.randint(3, 40))] for _ in range(NUM_REQUESTS)
    ]
    params = [
        SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
        if i % 2
        else SamplingParams(temperature=0.9, seed=i, max_tokens=12, ignore_eos=True)
        for i in range(NUM_REQUESTS)
    ]
    return prompts, params


@pytest.fixture(scope="module", params=["qwen3_moe", "ernie4_5_moe"])
def moe_model(request, tmp_path_factory):
    """A tiny MoE checkpoint, and one rank's tokens for the requests."""
    path = tmp_path_factory.mktemp(request.param)
    # Sharp distributions: two ranks' partial sums round differently from one rank's sum, and a
    # near tie would flip on that alone.
    hf = build_tiny_model(request.param, path, logit_scale=4.0)
    prompts, params = requests(hf.config.vocab_size)
    engine = make_engine(path, **SETTINGS)
    try:
        expected = [c.token_ids for c in engine.generate(prompts, params)]
    finally:
        engine.close()
    return path, prompts, params, expected


async def generate_concurrently(config, prompts, params) -> list[list[int]]:
    async with Client.from_config(config) as client:
        done = await asyncio.gather(
            *(client.generate(p, s) for p, s in zip(prompts, params, strict=True))
        )
    return [c.token_ids for c in done]


def status_once_counted(config) -> dict:
    """`admin status` once every rank's beats carry its experts' counts (a peer's come with
    its next beat)."""
    deadline = time.monotonic() + 15
    while True:
        reply = admin(config, "status")  # None: no answer within 5 s (a busy machine)
        status = reply.data if reply is not None else {"expert_load_per_rank": []}
        ranks = status["expert_load_per_rank"]
        if len(ranks) == 2 and all(r["steps"] > 0 for r in ranks) or time.monotonic() > deadline:
            return status
        time.sleep(config.runtime.heartbeat_interval_s / 2)


@pytest.mark.parametrize("expert_parallel", [1, 2])
def test_two_ranks_equal_one(moe_model, expert_parallel: int) -> None:
    path, prompts, params, expected = moe_model
    config, set_args = deployment(
        **{"model.path": str(path), **SETTINGS, "parallel.tensor_parallel_size": 2},
        **{"parallel.expert_parallel_size": expert_parallel},
    )
    with running(config, set_args):
        got = asyncio.run(generate_concurrently(config, prompts, params))
        status = status_once_counted(config)
    assert got == expected
    layouts = [rank["experts"] for rank in status["expert_load_per_rank"]]
    if expert_parallel == 2:
        assert layouts == [
            "experts 0-3 of 8 (expert parallel)",
            "experts 4-7 of 8 (expert parallel)",
        ]
    else:
        assert layouts == ["all 8 experts, hidden slice 0+20", "all 8 experts, hidden slice 20+20"]
    for rank in status["expert_load_per_rank"]:
        # Tokens went through each rank's experts, and the busiest is not below the mean.
        assert rank["steps"] > 0 and rank["tokens_per_expert_per_step"]["mean"] > 0
        assert rank["imbalance"] >= 1.0


@pytest.mark.parametrize("moe_model", ["ernie4_5_moe"], indirect=True)
def test_an_expert_parallel_group_updates_releases_and_notices_a_lost_rank(
    moe_model, tmp_path
) -> None:
    """Each rank loads its own experts from an update (the other rank's are not its concern),
    and releases and restores them; then a lost rank is noticed within 3 beats, as in any group."""
    path, prompts, params, expected = moe_model
    config, set_args = deployment(
        **{"model.path": str(path), **SETTINGS, "runtime.log_format": "json"},
        **{"parallel.tensor_parallel_size": 2, "parallel.expert_parallel_size": 2},
    )
    greedy = [p for p, s in zip(prompts, params, strict=True) if s.temperature == 0][:2]
    greedy_params = [s for s in params if s.temperature == 0][:2]
    want = [t for t, s in zip(expected, params, strict=True) if s.temperature == 0][:2]
    with running(config, set_args) as (driver, peer):
        assert admin(
            config,
            "update-weights",
            str(scaled_checkpoint(path, tmp_path / "new", ".experts.")),
            timeout=60,
        ).ok
        assert asyncio.run(generate_concurrently(config, greedy, greedy_params)) != want
        assert admin(config, "update-weights", str(path), timeout=60).ok
        assert admin(config, "release-memory", timeout=60).ok
        assert admin(config, "resume-memory", timeout=60).ok
        assert asyncio.run(generate_concurrently(config, greedy, greedy_params)) == want
        time.sleep(2 * config.runtime.heartbeat_interval_s)
        kill(peer, signal.SIGKILL)
        lost_at = time.time()
        code = driver.wait(10)
    assert code == ExitCode.PEER_LOST
    interval = config.runtime.heartbeat_interval_s
    assert failed_at(driver) - lost_at <= 3 * interval + interval
