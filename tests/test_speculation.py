"""Speculative decoding end to end on the offline engine: greedy outputs equal decoding one token
at a time (n-gram drafts, preemption and chunking, parallel samples, stop strings, prefix cache
hits, logprobs), seeded samples reproduce, a draft equal to the target is accepted, and sampled
outputs keep the target's distribution."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest
import torch

from aioworker.config import ConfigError, load_config
from aioworker.core.sampling_params import SamplingParams
from tests.conftest import make_engine
from tests.logprob_checks import assert_logprobs_close
from tests.tiny_models import build_tiny_model

NGRAM = {"speculative.method": "ngram", "speculative.num_tokens": 4, "speculative.dynamic": False}
# The embedded model's first 24 of 30 layers as its draft: strong enough to be accepted often.
SELF_DRAFT = {**NGRAM, "speculative.method": "draft", "speculative.draft_layers": 24}
# The embedded model drafting for itself, with its own weights and cache: a draft equal to the
# target.
SEPARATE_DRAFT = {**NGRAM, "speculative.method": "draft", "speculative.model": "embedded"}
METHODS = {"ngram": NGRAM, "self-draft": SELF_DRAFT, "separate-draft": SEPARATE_DRAFT}
DOCS = Path(__file__).resolve().parents[1] / "docs"


def copy_prompts(engine, count: int) -> list[list[int]]:
    """Copy-heavy chat prompts over paragraphs of the docs: n-gram drafts find matches."""
    paragraphs = [p for p in (DOCS / "operations.md").read_text().split("\n\n") if len(p) > 300]
    return [
        engine.encode(f"Repeat this paragraph exactly:\n\n{paragraphs[i]}", chat=True)
        for i in range(count)
    ]


@pytest.fixture(scope="module", params=list(METHODS))
def speculating(request, embedded_model_dir):
    engine = make_engine(embedded_model_dir, **METHODS[request.param])
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def greedy_case(embedded_engine):
    """Greedy requests over copy prompts (plain, n=2 with logprobs, stop strings) and what the
    engine without speculation answers: decoded once for every method."""
    prompts = copy_prompts(embedded_engine, 3)
    greedy = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    params = [
        greedy,
        msgspec.structs.replace(greedy, n=2, logprobs=3),
        msgspec.structs.replace(greedy, stop=["the", "The"], ignore_eos=False),
    ]
    return prompts, params, embedded_engine.generate(prompts, params)


def test_greedy_outputs_equal_decoding_one_token_at_a_time(greedy_case, speculating) -> None:
    prompts, params, expected = greedy_case
    got = speculating.generate(prompts, params)
    assert [c.token_ids for c in got] == [c.token_ids for c in expected]
    assert [c.text for c in got] == [c.text for c in expected]
    assert [c.finish_reason for c in got] == [c.finish_reason for c in expected]
    assert_logprobs_close(got[1].logprobs, expected[1].logprobs)
    policy = speculating.scheduler.speculator.policy
    assert policy.num_accepted > 20, "speculation never accepted a draft"
    # The same prompts again: prefix cache hits, and the same tokens.
    hits_before = speculating.block_manager.num_hit_tokens
    again = speculating.generate(prompts[:1], params[0])
    assert again[0].token_ids == expected[0].token_ids
    assert speculating.block_manager.num_hit_tokens > hits_before


@pytest.fixture(scope="module")
def cramped_case(embedded_engine):
    """Four greedy copy requests and their tokens without speculation, decoded once."""
    prompts = copy_prompts(embedded_engine, 4)
    greedy = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    return prompts, greedy, [c.token_ids for c in embedded_engine.generate(prompts, greedy)]


@pytest.mark.parametrize("method", list(METHODS))
def test_preemption_and_chunking_keep_the_tokens(
    embedded_model_dir, cramped_case, method: str
) -> None:
    prompts, greedy, expected = cramped_case
    cramped = make_engine(
        embedded_model_dir,
        **METHODS[method],
        **{"cache.num_blocks": 40, "model.max_model_len": 512},
        **{"scheduler.max_num_batched_tokens": 64},
    )
    try:
        assert [c.token_ids for c in cramped.generate(prompts, greedy)] == expected
        assert cramped.scheduler.num_preemptions > 0
        assert cramped.scheduler.speculator.policy.num_accepted > 0
    finally:
        cramped.close()


def test_seeded_samples_reproduce(embedded_engine, speculating) -> None:
    prompts = copy_prompts(embedded_engine, 2)
    seeded = SamplingParams(temperature=0.7, top_p=0.9, seed=11, max_tokens=32, ignore_eos=True)
    first = [c.token_ids for c in speculating.generate(prompts, seeded)]
    assert [c.token_ids for c in speculating.generate(prompts[::-1], seeded)] == first[::-1]


class ReplayProposer:
    """Proposes the continuation a plain run produced: a draft equal to the target."""

    def __init__(self, prompt: list[int], continuation: list[int]) -> None:
        self.tokens = prompt + continuation

    def propose(self, token_ids: list[int], max_tokens: int) -> list[int]:
        return self.tokens[len(token_ids) : len(token_ids) + max_tokens]


def test_a_draft_equal_to_the_target_is_accepted(embedded_engine, speculating) -> None:
    speculator = speculating.scheduler.speculator
    if speculator.drafts_on_executor:
        if not speculating.executor.runner.draft.owns_cache:
            pytest.skip("a self-draft is not the target")
        [prompt] = copy_prompts(embedded_engine, 1)
        proposed_before, accepted_before = (
            speculator.policy.num_proposed,
            speculator.policy.num_accepted,
        )
        speculating.generate([prompt], SamplingParams(temperature=0.0, max_tokens=64))
        proposed = speculator.policy.num_proposed - proposed_before
        accepted = speculator.policy.num_accepted - accepted_before
        assert proposed > 0 and accepted / proposed >= 0.99
        return
    [prompt] = copy_prompts(embedded_engine, 1)
    greedy = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    [expected] = embedded_engine.generate([prompt], greedy)
    ngram, policy_before = speculator.proposer, speculator.policy.num_proposed
    accepted_before = speculator.policy.num_accepted
    speculator.proposer = ReplayProposer(prompt, expected.token_ids)
    try:
        [got] = speculating.generate([prompt], greedy)
    finally:
        speculator.proposer = ngram
    proposed = speculator.policy.num_proposed - policy_before
    accepted = speculator.policy.num_accepted - accepted_before
    assert got.token_ids == expected.token_ids
    assert proposed > 0 and accepted / proposed >= 0.99


# -- the distribution ---------------------------------------------------------------------------

VOCAB = 12
NUM_SAMPLES = 20_000


class BigramProposer:
    """A draft unlike the target: always the likeliest follower of the last token, as counted
    in samples of the target (the target itself samples)."""

    def __init__(self, prompt: list[int], samples: list[int]) -> None:
        counts = torch.zeros(VOCAB, VOCAB)
        for sample in samples:
            first, second, third = sample // VOCAB**2, sample // VOCAB % VOCAB, sample % VOCAB
            for before, after in ((prompt[-1], first), (first, second), (second, third)):
                counts[before, after] += 1
        self.likeliest = counts.argmax(dim=1).tolist()

    def propose(self, token_ids: list[int], max_tokens: int) -> list[int]:
        drafts = [self.likeliest[token_ids[-1]]]
        while len(drafts) < max_tokens:
            drafts.append(self.likeliest[drafts[-1]])
        return drafts


def next_three(engine, prompt: list[int]) -> list[int]:
    """NUM_SAMPLES independent (unseeded) samples of the next three tokens, each as one number."""
    params = SamplingParams(temperature=1.0, max_tokens=3, ignore_eos=True)
    completions = engine.generate([prompt] * NUM_SAMPLES, params)
    return [(c.token_ids[0] * VOCAB + c.token_ids[1]) * VOCAB + c.token_ids[2] for c in completions]


def chi_square_p(a: list[int], b: list[int], cells: int) -> float:
    """Two-sample chi-square test of homogeneity; cells expected below 5 are pooled."""
    counts = torch.zeros(2, cells, dtype=torch.float64)
    counts[0] += torch.bincount(torch.tensor(a), minlength=cells)
    counts[1] += torch.bincount(torch.tensor(b), minlength=cells)
    totals = counts.sum(dim=0)
    expected = totals / 2
    small = expected < 5
    kept = torch.cat([counts[:, ~small], counts[:, small].sum(dim=1, keepdim=True)], dim=1)
    kept = kept[:, kept.sum(dim=0) > 0]
    expected = kept.sum(dim=0, keepdim=True) / 2
    statistic = ((kept - expected) ** 2 / expected).sum()
    dof = kept.shape[1] - 1
    return torch.special.gammaincc(torch.tensor(dof / 2.0), statistic / 2).item()


@pytest.fixture(scope="module")
def tiny_vocab_model(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tiny-vocab")
    build_tiny_model("llama", path, logit_scale=2.0, vocab_size=VOCAB)
    return path


SMALL = {
    "model.dtype": "float32",
    "cache.num_blocks": 2048,
    "model.max_model_len": 64,
    "scheduler.max_waiting": NUM_SAMPLES,
}


def test_sampled_tokens_keep_the_targets_distribution(tiny_vocab_model) -> None:
    prompt = [1, 5, 2, 7]
    plain = make_engine(tiny_vocab_model, **SMALL)
    try:
        expected = next_three(plain, prompt)
    finally:
        plain.close()
    speculating = make_engine(tiny_vocab_model, **SMALL, **{**NGRAM, "speculative.num_tokens": 2})
    speculating.scheduler.speculator.proposer = BigramProposer(prompt, expected)
    try:
        got = next_three(speculating, prompt)
        policy = speculating.scheduler.speculator.policy
    finally:
        speculating.close()
    assert 0.2 < policy.num_accepted / policy.num_proposed < 0.8  # drafts both kept and not
    assert chi_square_p(expected, got, VOCAB**3) > 0.01


def test_bad_speculative_settings_stop_start_up_naming_the_key() -> None:
    with pytest.raises(ConfigError, match="speculative.num_tokens is 9"):
        load_config(overrides={"speculative.method": "ngram", "speculative.num_tokens": 9})
    with pytest.raises(ConfigError, match="speculative.ngram_min is 3"):
        load_config(overrides={"speculative.ngram_min": 3, "speculative.ngram_max": 2})
    with pytest.raises(ConfigError, match="speculative.method"):
        load_config(overrides={"speculative.method": "medusa"})


# Drafts from the model itself, a whole copy on each rank: every rank drafts the same tokens.
WHOLE_DRAFT_ON_EACH_RANK = {
    **NGRAM,
    "speculative.method": "draft",
    "speculative.draft_tensor_parallel_size": 1,
}


@pytest.mark.slow
@pytest.mark.parametrize("drafts", ["ngram", "separate-draft"])
def test_two_tensor_parallel_ranks_verify_the_same_plans(tiny_vocab_model, drafts: str) -> None:
    from aioworker.wire.client import Client
    from tests.workers import admin, deployment, running

    prompts = [[1, 5, 2, 7, 1, 5, 2], [3, 3, 3, 3], [9, 1, 9, 1, 9]]
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    seeded = SamplingParams(temperature=1.0, seed=5, max_tokens=24, ignore_eos=True)
    speculative = NGRAM
    if drafts == "separate-draft":
        speculative = {**WHOLE_DRAFT_ON_EACH_RANK, "speculative.model": str(tiny_vocab_model)}
    # Seeded samples are the same on one rank speculating alike (rejection sampling draws
    # its own numbers from the seed).
    one_rank = make_engine(tiny_vocab_model, **SMALL, **speculative)
    try:
        expected = [c.token_ids for c in one_rank.generate(prompts, greedy)]
        expected += [c.token_ids for c in one_rank.generate(prompts, seeded)]
        assert one_rank.scheduler.speculator.policy.num_accepted > 0
    finally:
        one_rank.close()
    config, set_args = deployment(
        **{"model.path": str(tiny_vocab_model), **SMALL, **speculative},
        **{"parallel.tensor_parallel_size": 2},
    )

    async def scenario():
        async with Client.from_config(config) as client:
            runs = [client.generate(p, greedy) for p in prompts]
            runs += [client.generate(p, seeded) for p in prompts]
            return await asyncio.gather(*runs)

    with running(config, set_args):
        completions = asyncio.run(scenario())
        status = admin(config, "status").data
    assert [c.token_ids for c in completions] == expected
    accepted = sum(c.num_accepted_tokens for c in completions)
    assert accepted > 0 and status["spec_accepted_tokens"] == accepted
    assert status["spec_draft_tokens"] == sum(c.num_draft_tokens for c in completions)
    assert status["spec_mean_accepted_length"] > 1
