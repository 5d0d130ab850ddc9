"""A mixture-of-experts model with the rest of the engine, on the CPU: prefix cache hits,
n-gram speculation, logprobs, guided decoding, release and resume, weights updates and
quantized experts. The model is a tiny random Qwen3-MoE over the embedded model's tokenizer
(guided decoding needs one), with sharp distributions so that greedy choices stand clear."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import msgspec
import pytest
import torch
from safetensors.torch import load_file, save_file

from aioworker.core.guided import GuidedParams
from aioworker.core.sampling_params import SamplingParams
from aioworker.core.weights_phase import WeightsPhase
from tests.compute.test_model_parity import prefill_logits, relative_error
from tests.conftest import make_engine
from tests.test_speculation import NGRAM
from tests.tiny_models import build_tiny_model

EMBEDDED_VOCAB = 49152
EOS = 2  # the embedded tokenizer's <|im_end|>
SETTINGS = {"cache.num_blocks": 128, "model.max_model_len": 256}
GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, logprobs=3)
# Repeated runs of tokens: n-gram drafts find them, and the model repeats them as often as not.
PROMPTS = [[700 + i % 9 for i in range(40 + 5 * k)] + [900 + k] for k in range(3)]


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory, embedded_model_dir) -> Path:
    path = tmp_path_factory.mktemp("qwen3_moe")
    build_tiny_model(
        "qwen3_moe", path, logit_scale=4.0, vocab_size=EMBEDDED_VOCAB, eos_token_id=EOS
    )
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (embedded_model_dir / name).is_file():
            shutil.copy(embedded_model_dir / name, path)
    return path


@pytest.fixture(scope="module")
def engine(moe_dir):
    engine = make_engine(moe_dir, **SETTINGS)
    yield engine
    engine.close()


def cold(engine, prompts=PROMPTS, params=GREEDY) -> list:
    engine.core.reset_prefix_cache()
    return engine.generate(prompts, params)


def token_ids(completions) -> list[list[int]]:
    return [c.token_ids for c in completions]


def logprobs_of(completion) -> list[float]:
    return [entry.logprob for entry in completion.logprobs]


def test_prefix_cache_hits_keep_the_tokens_and_logprobs(engine) -> None:
    first = cold(engine)
    again = engine.generate(PROMPTS, GREEDY)
    assert engine.block_manager.num_hit_tokens > 0
    assert token_ids(again) == token_ids(first)
    for a, b in zip(again, first, strict=True):
        assert logprobs_of(a) == pytest.approx(logprobs_of(b), abs=1e-4)
        # The top logprob is the greedy token's own.
        assert all(e.top_token_ids[0] == e.token_id for e in a.logprobs)


def test_ngram_drafts_keep_the_tokens(engine, moe_dir) -> None:
    expected = cold(engine)
    speculating = make_engine(moe_dir, **SETTINGS, **NGRAM)
    try:
        got = speculating.generate(PROMPTS, GREEDY)
        policy = speculating.scheduler.speculator.policy
        assert policy.num_proposed > 0
    finally:
        speculating.close()
    assert token_ids(got) == token_ids(expected)
    for a, b in zip(got, expected, strict=True):
        assert logprobs_of(a) == pytest.approx(logprobs_of(b), abs=1e-4)


def test_guided_outputs_follow_their_grammar(engine) -> None:
    choice = SamplingParams(
        temperature=0.0, max_tokens=16, guided=GuidedParams(choice=["yes", "no"])
    )
    regex = SamplingParams(
        temperature=0.8, seed=1, max_tokens=24, guided=GuidedParams(regex=r"[0-9]{3}-[a-z]{2}")
    )
    completions = engine.generate(PROMPTS[:2], [choice, regex])
    assert completions[0].text in ("yes", "no") and completions[0].finish_reason == "stop"
    assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", completions[1].text)


def run(engine, op: str, **fields) -> int:
    return engine.executor.run_weights_phase(WeightsPhase(op=op, **fields)).result()


def test_release_and_resume_restore_the_experts(engine) -> None:
    before = token_ids(cold(engine))
    experts = next(m for m in engine.executor.weights.model.modules() if hasattr(m, "w13_weight"))
    weights = experts.w13_weight.clone()
    engine.core.reset_prefix_cache()
    run(engine, "release", weights=True, kv_cache=True)
    assert experts.w13_weight.numel() == 0
    run(engine, "resume")
    assert torch.equal(experts.w13_weight, weights)
    assert token_ids(cold(engine)) == before


def test_a_weights_update_reaches_every_expert(engine, moe_dir, tmp_path) -> None:
    before = token_ids(cold(engine))
    tensors = load_file(str(moe_dir / "model.safetensors"))
    changed = {n: t * 3 if ".experts." in n else t for n, t in tensors.items()}
    shutil.copy(moe_dir / "config.json", tmp_path)
    save_file(changed, str(tmp_path / "model.safetensors"))
    for path in (tmp_path, moe_dir):
        run(engine, "stage", path=str(path))
        run(engine, "commit")
        engine.core.reset_prefix_cache()
        after = token_ids(cold(engine))
        assert (after == before) == (path == moe_dir)


def test_int8_experts_stay_close_to_float32(engine, moe_dir) -> None:
    prompt = PROMPTS[2]
    reference = prefill_logits(engine, prompt)
    quantized = make_engine(moe_dir, **SETTINGS, **{"model.quantization": "wint8"})
    try:
        experts = next(
            m for m in quantized.executor.weights.model.modules() if hasattr(m, "w13_weight")
        )
        assert experts.w13_weight.dtype == torch.int8
        assert relative_error(prefill_logits(quantized, prompt), reference) < 0.05
        completions = quantized.generate(PROMPTS, msgspec.structs.replace(GREEDY, logprobs=None))
        assert all(len(c.token_ids) == GREEDY.max_tokens for c in completions)
    finally:
        quantized.close()
