"""The host KV tier composes: under a device KV cache so small that sequences are swapped out
and back, requests with n samples, logprobs, stop strings and a guided regex, alone and with
n-gram speculation on, give what they give with plenty of device KV and no tier (embedded model,
CPU, float32). Each side runs the same settings otherwise (speculation on or off)."""

from __future__ import annotations

import random

import pytest

from aioworker.core.guided import GuidedParams
from aioworker.core.sampling_params import SamplingParams
from tests.conftest import make_engine
from tests.test_host_kv_tier import HOST_TIER, TINY_DEVICE, random_tokens, stats

pytestmark = pytest.mark.slow
SPECULATION = {"speculative.method": "ngram", "speculative.dynamic": False}


def workload() -> tuple[list, list[SamplingParams]]:
    """Six long greedy requests that overfill the device, and one request of each kind."""
    rng = random.Random(21)
    prompts = [random_tokens(rng, 100 + 7 * i) for i in range(6)]
    params = [SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)] * 6
    # A prompt that repeats itself, so the n-gram drafter finds drafts.
    repeated = random_tokens(rng, 24) * 4
    prompts += [repeated, repeated, "Name three colours.", "Count from one to ten:"]
    params += [
        SamplingParams(temperature=0.8, seed=7, n=3, max_tokens=40, ignore_eos=True),
        SamplingParams(temperature=0.0, logprobs=3, max_tokens=40, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=60, stop=("\n",)),
        SamplingParams(temperature=0.0, max_tokens=40, guided=GuidedParams(regex=r"[0-9, ]{8,30}")),
    ]
    return prompts, params


def served(engine) -> list[tuple]:
    prompts, params = workload()
    return [
        (c.token_ids, c.text, c.finish_reason, [e.logprob for e in c.logprobs or []])
        for c in engine.generate(prompts, params)
    ]


def served_by(model_dir, **settings) -> tuple[list[tuple], dict]:
    engine = make_engine(model_dir, **settings)
    try:
        return served(engine), stats(engine)
    finally:
        engine.close()


@pytest.mark.parametrize("speculation", [False, True])
def test_swapped_requests_of_every_kind_equal_the_tier_off(
    embedded_model_dir, speculation: bool
) -> None:
    drafts = SPECULATION if speculation else {}
    expected, _ = served_by(embedded_model_dir, **drafts, **{"cache.enable_prefix_caching": False})
    tier = {**TINY_DEVICE, **HOST_TIER, "cache.preemption": "swap"}
    got, counts = served_by(embedded_model_dir, **drafts, **tier)
    assert counts["host_kv_swaps_out"] > 0 and counts["host_kv_swaps_in"] > 0
    for ours, theirs in zip(got, expected, strict=True):
        assert ours[:3] == theirs[:3]
        assert ours[3] == pytest.approx(theirs[3], abs=1e-4)
