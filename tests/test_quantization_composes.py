"""Quantized weights with the rest of the engine, on the CPU: prefix cache hits, logprobs,
parallel samples, stop strings, release and resume, weights updates and their rollback, and
speculative decoding (through preemption and chunking) keep the embedded model's greedy tokens.
Each runs for the CPU's weight-only int4 (a dense copy beside the quantized one) and for the
GPU's int4 forced onto the CPU ("wint4-on-load": quantized values only, tiled after loading).
Tensor parallelism: tests/runtime/test_runtime.py; CUDA graphs need a GPU.

Both formats multiply a few rows by the int4 kernel in bfloat16, and more rows another way, so
two computations of one sequence (cold or from cached blocks, alone or in another batch,
verified as drafts) round differently: logprobs move by up to 0.05 here, and a near tie may
flip. Where the computations differ, the prompts are ones whose greedy choices stand well clear
of the runner-up; where they are the same (after release and resume, after an update to the
same weights), the tokens are compared cold, and must be equal whatever the prompt. The
embedded model's weights lie on the int4 grid, where even a product by the original dense
weight would agree with int4; a tiny random model, off the grid, checks that many rows and few
read the same quantized values (last).
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import msgspec
import pytest
import torch
from safetensors.torch import load_file, save_file

from aioworker.compute import build_rank, draft_builder
from aioworker.compute.layers.linear_method import LinearMethods
from aioworker.compute.layers.weight_only import WINT4
from aioworker.compute.loader import WeightsError
from aioworker.compute.model_loading import ON_LOAD
from aioworker.core.guided import GuidedParams
from aioworker.core.sampling_params import SamplingParams
from aioworker.core.weights_phase import WeightsPhase
from aioworker.engine import LLMEngine
from tests.conftest import make_engine
from tests.guided_schemas import PERSON
from tests.guided_schemas import PROMPTS as GUIDED_PROMPTS
from tests.test_speculation import METHODS, NGRAM, copy_prompts
from tests.tiny_models import build_tiny_model

pytestmark = pytest.mark.slow
PROJECTIONS = {"wint4": WINT4, "wint4-on-load": ON_LOAD["wint4"]}
GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
SHORT = msgspec.structs.replace(GREEDY, max_tokens=8)
# Greedy choices at least 0.19 nats clear of the runner-up over 16 tokens, in both formats (this
# small model's chat answers are full of near ties).
QUESTIONS = (
    "Name three fruits.",
    "Who wrote Hamlet?",
    "Spell the word cat.",
    "What color is the sky?",
)
# Paragraphs to copy (tests/test_speculation.py) whose 16 greedy tokens stand 0.26 nats clear.
COPIED = [1, 6]


@contextlib.contextmanager
def forced(fmt: str) -> Iterator[None]:
    """With "wint4-on-load", what is built inside (the target and a separate draft) takes the
    GPU's int4 method on the CPU."""
    with pytest.MonkeyPatch.context() as patch:
        if fmt == "wint4-on-load":
            methods = LinearMethods(PROJECTIONS[fmt])
            for module in (build_rank, draft_builder):
                patch.setattr(module, "linear_methods", lambda cfg, config, device: methods)
        yield


def quantized_engine(model_dir: Path, fmt: str, **overrides) -> LLMEngine:
    with forced(fmt):
        return make_engine(model_dir, **{"model.quantization": "wint4"}, **overrides)


def first_projection(model: torch.nn.Module) -> torch.nn.Module:
    return next(m for m in model.modules() if hasattr(m, "linear_method"))


class Engines(dict):
    """One quantized engine per format, built when a test first asks for it."""

    def __init__(self, model_dir: Path) -> None:
        super().__init__()
        self.model_dir = model_dir

    def __missing__(self, fmt: str) -> LLMEngine:
        engine = self[fmt] = quantized_engine(self.model_dir, fmt)
        assert first_projection(engine.executor.weights.model).linear_method is PROJECTIONS[fmt]
        return engine


@pytest.fixture(scope="module")
def engines(embedded_model_dir):
    engines = Engines(embedded_model_dir)
    yield engines
    for engine in engines.values():
        engine.close()


@pytest.fixture(scope="module")
def prompts(engines) -> list[list[int]]:
    return [engines["wint4"].encode(q, chat=True) for q in QUESTIONS]


def tokens(engine, prompts, params: SamplingParams | list[SamplingParams] = GREEDY) -> list:
    return [c.token_ids for c in engine.generate(prompts, params)]


def cold(engine, prompts, params: SamplingParams | list[SamplingParams] = SHORT) -> list:
    """`tokens` computed from the prompts alone, no cached block read: the same computation
    each time (compared exactly, so a few tokens do)."""
    engine.core.reset_prefix_cache()
    return tokens(engine, prompts, params)


def run(engine, op: str, **fields) -> int:
    return engine.executor.run_weights_phase(WeightsPhase(op=op, **fields)).result()


# -- prefix caching, logprobs, samples, stop strings (the CPU's format) --------------------------


def test_prefix_cache_hits_keep_the_tokens_and_logprobs(engines, prompts) -> None:
    engine, params = engines["wint4"], msgspec.structs.replace(GREEDY, logprobs=3)
    engine.core.reset_prefix_cache()
    computed = engine.generate(prompts[:2], params)
    hits_before = engine.block_manager.num_hit_tokens
    hit = engine.generate(prompts[:2], params)
    assert engine.block_manager.num_hit_tokens - hits_before == 2 * 2 * 16  # two blocks each
    assert [c.token_ids for c in hit] == [c.token_ids for c in computed]
    for got, expected in zip(hit, computed, strict=True):
        assert [e.top_token_ids[0] for e in got.logprobs] == got.token_ids  # greedy: the argmax
        logprobs = torch.tensor([[e.logprob for e in c.logprobs] for c in (got, expected)])
        assert logprobs.isfinite().all() and (logprobs <= 0).all()
        assert (logprobs[0] - logprobs[1]).abs().max() < 0.1  # rounded otherwise (see above)


def test_n_samples_share_the_prompt(engines, prompts) -> None:
    engine = engines["wint4"]
    [alone] = tokens(engine, prompts[:1])
    assert tokens(engine, prompts[:1], msgspec.structs.replace(GREEDY, n=2)) == [alone, alone]
    sampled = SamplingParams(temperature=0.9, seed=11, n=2, max_tokens=12, ignore_eos=True)
    samples = tokens(engine, prompts[:1], sampled)
    assert samples[0] != samples[1] and all(len(s) == 12 for s in samples)


def test_a_stop_string_ends_the_text_before_it(engines, prompts) -> None:
    engine = engines["wint4"]
    [full] = engine.generate(prompts[3:], GREEDY)
    stop = full.text.split()[2]
    [stopped] = engine.generate(prompts[3:], msgspec.structs.replace(GREEDY, stop=[stop]))
    assert stopped.finish_reason == "stop"
    assert stopped.text == full.text[: full.text.index(stop)]


def test_guided_outputs_with_int4_weights_validate(engines, prompts) -> None:
    """Guidance on quantized weights, with n-gram drafts checked against the grammar: sampled
    outputs all validate, and greedy ones equal decoding without drafts."""
    engine = engines["wint4"]
    guided = GuidedParams(json_schema=PERSON)
    asks = [engine.encode(p, chat=True) for p in GUIDED_PROMPTS[:4]]
    sampled = [
        SamplingParams(max_tokens=200, temperature=1.0, seed=i, guided=guided) for i in range(4)
    ]
    for completion in engine.generate(asks, sampled):
        jsonschema.validate(json.loads(completion.text), PERSON)
    greedy = SamplingParams(max_tokens=120, temperature=0.0, guided=guided)
    expected = [c.token_ids for c in engine.generate(asks[:2], greedy)]
    with quantized_engine(engines.model_dir, "wint4", **NGRAM) as speculating:
        assert [c.token_ids for c in speculating.generate(asks[:2], greedy)] == expected


# -- release and resume ------------------------------------------------------------------------


def decode_state(layer) -> dict[str, torch.Tensor]:
    """The layer's parameters and what its method derived from them (int4 copies, tiles), as far
    as it holds them now."""
    derived = ("int4_weight", "int4_scales_and_zeros", "int4_tiled", "int4_scales_and_offsets")
    tensors = {name: getattr(layer, name, None) for name in derived}
    tensors |= dict(layer.named_parameters(recurse=False))
    return {name: t for name, t in tensors.items() if t is not None}


@pytest.mark.parametrize("fmt", list(PROJECTIONS))
def test_release_and_resume_keep_the_tokens(engines, prompts, fmt: str) -> None:
    """The on-load format holds no dense copy: release offloads its int4 values and scales, and
    resume tiles them for the kernel again."""
    engine = engines[fmt]
    before = cold(engine, prompts)
    layer = first_projection(engine.executor.weights.model)
    state = {name: t.clone() for name, t in decode_state(layer).items()}
    engine.core.reset_prefix_cache()  # as the runtime does: the cache's memory goes
    run(engine, "release", weights=True, kv_cache=True)
    released = decode_state(layer)
    assert set(released) < set(state) and all(t.numel() == 0 for t in released.values())
    run(engine, "resume")
    resumed = decode_state(layer)
    assert set(resumed) == set(state)
    assert all(torch.equal(resumed[name], state[name]) for name in state)
    assert cold(engine, prompts) == before


# -- weights updates ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def updates(embedded_model_dir, tmp_path_factory) -> tuple[Path, Path]:
    """A trainer's bfloat16 weights (every layer's down projection scaled by 1.5), and the same
    with one NaN in layer 3's query projection."""
    tensors = load_file(str(embedded_model_dir / "model.safetensors"))
    new = {name: t.to(torch.bfloat16) for name, t in tensors.items()}
    for name in new:
        if name.endswith("mlp.down_proj.weight"):
            new[name] *= 1.5
    query = "model.layers.3.self_attn.q_proj.weight"
    bad = {**new, query: new[query].clone()}
    bad[query][7, 100] = float("nan")
    root = tmp_path_factory.mktemp("updates")
    for directory, weights in ((root / "new", new), (root / "bad", bad)):
        directory.mkdir()
        shutil.copy(embedded_model_dir / "config.json", directory)
        save_file(weights, str(directory / "model.safetensors"))
    return root / "new", root / "bad"


def update(engine, path: Path) -> None:
    """As the runtime updates: stage, then commit or roll back; the prefix cache is forgotten."""
    try:
        run(engine, "stage", path=str(path))
    except WeightsError:
        run(engine, "rollback")
        raise
    run(engine, "commit")
    engine.core.reset_prefix_cache()


@pytest.mark.parametrize("fmt", list(PROJECTIONS))
def test_an_update_is_quantized_while_staging_and_a_bad_one_rolls_back(
    embedded_model_dir, engines, prompts, updates, fmt: str
) -> None:
    """An engine started on the trainer's bfloat16 weights: a NaN is found in what staging
    quantized (the on-load format stages int4 values and scales: the NaN shows in a scale), and
    the weights stay; then an update to the embedded model's weights serves what an engine
    started on them serves."""
    new, bad = updates
    expected = cold(engines[fmt], prompts[:2])
    updated = quantized_engine(new, fmt)
    try:
        before = cold(updated, prompts[:2])
        assert before != expected
        with pytest.raises(WeightsError, match=r"layers\.3\.self_attn\.qkv_proj.*NaN"):
            update(updated, bad)
        assert cold(updated, prompts[:2]) == before
        update(updated, embedded_model_dir)
        assert cold(updated, prompts[:2]) == expected
    finally:
        updated.close()


# -- speculative decoding, preemption, chunking --------------------------------------------------

# Blocks for one of the two paragraphs and its answer at a time (14 blocks each), and 256 tokens
# a step: the second prompt is prefilled in chunks, beside the first.
CRAMPED = {"cache.num_blocks": 20, "model.max_model_len": 320}


@pytest.mark.parametrize(
    ("fmt", "method"),
    [("wint4", "separate-draft"), ("wint4-on-load", "ngram")],
)
def test_drafts_keep_the_tokens_through_preemption_and_chunking(
    embedded_model_dir, engines, fmt: str, method: str
) -> None:
    """Greedy verification keeps the target's argmax: the same tokens as without drafts. The
    separate draft (the classic pairing with a quantized target) is quantized as the target."""
    engine = engines[fmt]
    prompts = [copy_prompts(engine, max(COPIED) + 1)[i] for i in COPIED]
    expected = tokens(engine, prompts)
    drafting = quantized_engine(embedded_model_dir, fmt, **METHODS[method], **CRAMPED)
    try:
        assert tokens(drafting, prompts) == expected
        assert drafting.scheduler.speculator.policy.num_accepted > 0
        assert drafting.scheduler.num_preemptions > 0
        draft = drafting.executor.runner.draft
        if draft is not None:
            assert first_projection(draft.model).linear_method is PROJECTIONS[fmt]
    finally:
        drafting.close()


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    """Random weights, off any int4 grid; a sharp LM head, so that greedy choices stand clear."""
    path = tmp_path_factory.mktemp("tiny")
    build_tiny_model("llama", path, logit_scale=2.0)
    return path


@pytest.mark.parametrize("fmt", ["wint4", "wint4-on-load"])
def test_ngram_drafts_keep_the_tokens_of_weights_off_the_int4_grid(tiny_model, fmt: str) -> None:
    """Verifying drafts multiplies 5 rows a sequence, decoding one: both must read the same
    (quantized) values, or drafts change greedy tokens on weights off the int4 grid (any bf16
    checkpoint; the embedded model's lie on it, which hides the difference)."""
    settings = {"cache.num_blocks": 64, "model.max_model_len": 256}
    prompts = [[1, 5, 2, 7, 1, 5, 2], [3, 3, 3, 3], [9, 1, 9, 1, 9]]  # three: 15 rows verified
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    plain = quantized_engine(tiny_model, fmt, **settings)
    try:
        expected = tokens(plain, prompts, params)
    finally:
        plain.close()
    drafting = quantized_engine(tiny_model, fmt, **settings, **NGRAM)
    try:
        got = tokens(drafting, prompts, params)
        assert drafting.scheduler.speculator.policy.num_accepted > 0
    finally:
        drafting.close()
    assert got == expected
