"""Logit controls through the offline engine on a tiny random Llama (float32, CPU): greedy with
repetition_penalty and bad words equal transformers' `generate`; presence/frequency equal a
plain-Python reference over the model's own logits; and the controls give the same tokens
across preemption, chunked prefill, prefix caching, parallel samples and two tensor-parallel
ranks."""

from __future__ import annotations

import asyncio
import random

import msgspec
import pytest
import torch

from aioworker.core.sampling_params import SamplingParams
from tests.conftest import make_engine
from tests.tiny_models import build_tiny_model

pytestmark = pytest.mark.slow
VOCAB = 384
SETTINGS = {"model.dtype": "float32", "cache.num_blocks": 256, "model.max_model_len": 256}
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The reference model (transformers) and our engine over the same weights."""
    path = tmp_path_factory.mktemp("tiny-llama")
    reference = build_tiny_model("llama", path, logit_scale=4.0)
    engine = make_engine(path, **SETTINGS)
    yield path, reference, engine
    engine.close()


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(VOCAB) for _ in range(rng.randint(6, 60))] for _ in range(n)]


def hf_generate(reference, prompt: list[int], num_tokens: int, **settings) -> list[int]:
    ids = torch.tensor([prompt], device=reference.device)
    # An explicit mask: generate() would take token 0 (the tiny models' pad id) for padding.
    out = reference.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=num_tokens,
        do_sample=False,
        **settings,
    )
    return out[0, len(prompt) :].tolist()


def tokens(engine, batch, params) -> list[list[int]]:
    return [c.token_ids for c in engine.generate(batch, params)]


@pytest.mark.parametrize("penalty", [1.4, 0.8])
def test_greedy_with_repetition_penalty_equals_transformers(tiny, penalty: float) -> None:
    _, reference, engine = tiny
    batch = prompts(4)
    params = msgspec.structs.replace(GREEDY, repetition_penalty=penalty)
    got = tokens(engine, batch, params)
    assert got == [hf_generate(reference, p, 24, repetition_penalty=penalty) for p in batch]
    assert got != tokens(engine, batch, GREEDY)  # the penalty changed something


def test_greedy_with_bad_words_equals_transformers(tiny) -> None:
    """Words taken from the free run, so they would appear: a two-token and a three-token word
    (banned where the output ends with their prefix) and a one-token word (banned everywhere)."""
    _, reference, engine = tiny
    prompt = prompts(1, seed=3)[0]
    free = tokens(engine, [prompt], GREEDY)[0]
    words = [free[2:4], free[6:9], [free[12]]]
    # transformers matches against the prompt too; ours against the output only (the prompt
    # does not end with a word's prefix here, so both ban the same tokens).
    assert all(prompt[-1] != word[0] for word in words)
    params = msgspec.structs.replace(GREEDY, bad_words_token_ids=tuple(map(tuple, words)))
    [got] = tokens(engine, [prompt], params)
    assert got == hf_generate(reference, prompt, 24, bad_words_ids=words)
    assert got != free and free[12] not in got


def penalised_reference(reference, prompt, outputs, presence, frequency) -> list[list[float]]:
    """The model's logits before each output token, less OpenAI's penalties on the outputs
    before it (teacher-forced with our outputs)."""
    with torch.no_grad():
        ids = torch.tensor([prompt + outputs], device=reference.device)
        logits = reference(ids).logits[0, len(prompt) - 1 : -1].float()
    rows = []
    for i, row in enumerate(logits.tolist()):
        for token in set(outputs[:i]):
            count = outputs[:i].count(token)
            row[token] -= presence * (count > 0) + frequency * count
        rows.append(row)
    return rows


def test_presence_and_frequency_equal_a_plain_reference(tiny) -> None:
    _, reference, engine = tiny
    batch = prompts(3, seed=4)
    params = msgspec.structs.replace(GREEDY, presence_penalty=0.7, frequency_penalty=0.9)
    got = tokens(engine, batch, params)
    for prompt, outputs in zip(batch, got, strict=True):
        rows = penalised_reference(reference, prompt, outputs, 0.7, 0.9)
        assert [max(range(VOCAB), key=row.__getitem__) for row in rows] == outputs
    assert got != tokens(engine, batch, GREEDY)


CONTROLLED = [
    msgspec.structs.replace(GREEDY, repetition_penalty=1.3, presence_penalty=0.5),
    SamplingParams(
        temperature=0.9, seed=5, max_tokens=24, ignore_eos=True, frequency_penalty=0.8,
        min_p=0.05, logit_bias={7: 3.0, 8: -50.0},
    ),
    SamplingParams(
        temperature=1.0, seed=6, max_tokens=24, ignore_eos=True, repetition_penalty=1.2,
        bad_words_token_ids=((7, 8), (9,)), allowed_token_ids=tuple(range(0, VOCAB, 3)),
    ),
    SamplingParams(temperature=0.8, top_p=0.9, seed=7, max_tokens=24, ignore_eos=True),
]  # fmt: skip


def cramped_engine(path, settings: dict):
    """A cache too small for 16 prompts (sequences are preempted midway) and a 32-token budget
    (prompts are chunked)."""
    cramped = {"cache.num_blocks": 16, "model.max_model_len": 128}
    return make_engine(path, **{**settings, **cramped, "scheduler.max_num_batched_tokens": 32})


def test_controls_give_the_same_tokens_through_preemption_and_chunking(tiny) -> None:
    """A cache too small for the batch preempts sequences midway, a 32-token budget chunks the
    prompts; every sequence's tokens equal the roomy run's, so the counts and windows a
    re-admitted sequence starts from are those it had."""
    path, _, roomy = tiny
    batch = prompts(16, seed=5)
    params = [CONTROLLED[i % 4] for i in range(16)]
    expected = tokens(roomy, batch, params)
    small = cramped_engine(path, SETTINGS)
    preempted = []
    original = small.scheduler._preempt
    small.scheduler._preempt = lambda seq: (
        preempted.append((seq.params, seq.num_output_tokens)),
        original(seq),
    )
    try:
        assert tokens(small, batch, params) == expected
    finally:
        small.close()
    midway = [p for p, num_outputs in preempted if 0 < num_outputs < 24]
    assert {CONTROLLED.index(p) for p in midway} >= {0, 1, 2}
    assert expected != tokens(roomy, batch, [CONTROLLED[3]] * 16)


def check_a_cached_prompt_is_penalised(path, cached, settings: dict) -> int:
    """Three prompts sharing 96 tokens under repetition_penalty, the first alone (so the others
    hit its blocks): the same tokens as with the prefix cache off. Returns the tokens hit."""
    system = prompts(1, seed=6)[0][:48] * 2
    batch = [system + tail for tail in prompts(3, seed=7)]
    params = msgspec.structs.replace(GREEDY, repetition_penalty=1.5)
    hits_before = cached.block_manager.num_hit_tokens
    got = tokens(cached, batch[:1], params) + tokens(cached, batch[1:], params)
    uncached = make_engine(path, **{**settings, "cache.enable_prefix_caching": False})
    try:
        assert got == tokens(uncached, batch, params)
    finally:
        uncached.close()
    return cached.block_manager.num_hit_tokens - hits_before


def check_samples_equal_requests_with_consecutive_seeds(engine) -> None:
    prompt = prompts(1, seed=8)[0]
    params = CONTROLLED[1]
    singles = [msgspec.structs.replace(params, seed=5 + i) for i in range(3)]
    samples = tokens(engine, [prompt], msgspec.structs.replace(params, n=3))
    assert samples == tokens(engine, [prompt] * 3, singles)
    assert len(set(map(tuple, samples))) == 3


def test_repetition_penalty_counts_a_cached_prompt(tiny) -> None:
    """The prompt's cached blocks are never in a plan's inputs: the penalty must still see
    them. Same tokens with the prefix cache on (and hit) as off."""
    path, _, cached = tiny
    assert check_a_cached_prompt_is_penalised(path, cached, SETTINGS) >= 2 * 96  # 6 blocks each


def test_n_samples_with_penalties_equal_requests_with_consecutive_seeds(tiny) -> None:
    check_samples_equal_requests_with_consecutive_seeds(tiny[2])


def test_logprobs_are_those_of_the_controlled_logits(tiny) -> None:
    """Logit bias and penalties come before the logprobs; min_p (a truncation) after them."""
    _, reference, engine = tiny
    prompt = prompts(1, seed=9)[0]
    params = msgspec.structs.replace(
        GREEDY, presence_penalty=1.0, logit_bias={5: 2.0}, logprobs=2, max_tokens=8
    )
    [completion] = engine.generate([prompt], params)
    rows = penalised_reference(reference, prompt, completion.token_ids, 1.0, 0.0)
    for row, entry in zip(rows, completion.logprobs, strict=True):
        row[5] += 2.0
        expected = torch.log_softmax(torch.tensor(row), dim=-1)
        assert entry.logprob == pytest.approx(expected[entry.token_id].item(), abs=1e-4)
        assert list(entry.top_token_ids) == expected.topk(2).indices.tolist()


def test_two_tensor_parallel_ranks_equal_one(tiny) -> None:
    """Only the driver keeps the controls' state and samples; the peer runs the same plans (with
    their controls and seen tokens) and takes the driver's tokens."""
    from aioworker.wire.client import Client
    from tests.workers import deployment, running

    path, _, engine = tiny
    batch = prompts(4, seed=10)
    params = [CONTROLLED[i % 4] for i in range(4)]
    expected = tokens(engine, batch, params)
    config, set_args = deployment(
        **{"model.path": str(path), **SETTINGS, "parallel.tensor_parallel_size": 2}
    )

    async def scenario():
        async with Client.from_config(config) as client:
            return await asyncio.gather(
                *(client.generate(p, s) for p, s in zip(batch, params, strict=True))
            )

    with running(config, set_args):
        completions = asyncio.run(scenario())
    assert [c.token_ids for c in completions] == expected
