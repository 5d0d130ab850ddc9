"""Our model against transformers on the same weights: greedy tokens and prefill logits."""

from __future__ import annotations

import pytest
import torch

from aioworker.compute.sampling import logprobs as logprobs_module
from aioworker.core.sampling_params import SamplingParams
from tests.conftest import make_engine
from tests.logprob_checks import assert_entry_matches
from tests.plans import prefill_plan
from tests.tiny_models import build_tiny_model

NUM_NEW_TOKENS = 32
PROMPT_LENGTHS = (3, 11, 29, 64)


def prefill_logits(engine, token_ids: list[int]) -> torch.Tensor:
    """Logits at every prompt position, computed by the engine's own model and KV cache."""
    runner = engine.executor.runner
    num_blocks = -(-len(token_ids) // engine.loaded.block_size)
    plan = prefill_plan(token_ids, list(range(num_blocks)))

    @torch.inference_mode()
    def run() -> torch.Tensor:
        runner.apply_plan_state(plan)
        inputs = runner.prepare_inputs(plan)
        hidden = runner.model(inputs.token_ids, inputs.positions, inputs.attn)
        del runner.seqs[-1]
        return runner.model.compute_logits(hidden)

    return engine.executor.call(run).result()


def relative_error(ours: torch.Tensor, reference: torch.Tensor) -> float:
    return ((ours - reference).abs().max() / reference.abs().max()).item()


def hf_greedy(model, prompt: list[int], num_tokens: int) -> list[int]:
    output = model.generate(torch.tensor([prompt]), max_new_tokens=num_tokens, do_sample=False)
    return output[0, len(prompt) :].tolist()


@pytest.mark.parametrize(
    "arch",
    [
        "llama",
        "mistral",
        "qwen2",
        "qwen3",
        "ernie4_5",
        "qwen3_moe",
        "qwen2_moe",
        "mixtral",
        "ernie4_5_moe",
    ],
)
def test_tiny_model_matches_transformers(arch: str, tmp_path) -> None:
    hf_model = build_tiny_model(arch, tmp_path)
    vocab_size = hf_model.config.vocab_size
    generator = torch.Generator().manual_seed(1)
    prompts = [
        torch.randint(0, vocab_size, (n,), generator=generator).tolist() for n in PROMPT_LENGTHS
    ]
    engine = make_engine(tmp_path, **{"cache.num_blocks": 64, "model.max_model_len": 256})
    try:
        completions = engine.generate(
            prompts, SamplingParams(temperature=0.0, max_tokens=NUM_NEW_TOKENS, ignore_eos=True)
        )
        for prompt, completion in zip(prompts, completions, strict=True):
            assert completion.token_ids == hf_greedy(hf_model, prompt, NUM_NEW_TOKENS)
        with torch.no_grad():
            reference = hf_model(torch.tensor([prompts[-1]])).logits[0]
        assert relative_error(prefill_logits(engine, prompts[-1]), reference) <= 1e-4
    finally:
        engine.close()


CHAT_PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers and explain why they are prime.",
]


@pytest.fixture(scope="module")
def hf_embedded(embedded_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(embedded_model_dir, dtype=torch.float32)
    model.generation_config.eos_token_id = None
    return model.eval()


def test_embedded_model_matches_transformers(embedded_engine, hf_embedded) -> None:
    prompts = [embedded_engine.encode(text, chat=True) for text in CHAT_PROMPTS]
    completions = embedded_engine.generate(
        prompts, SamplingParams(temperature=0.0, max_tokens=NUM_NEW_TOKENS, ignore_eos=True)
    )
    for prompt, completion in zip(prompts, completions, strict=True):
        assert completion.token_ids == hf_greedy(hf_embedded, prompt, NUM_NEW_TOKENS)
    with torch.no_grad():
        reference = hf_embedded(torch.tensor([prompts[0]])).logits[0]
    assert relative_error(prefill_logits(embedded_engine, prompts[0]), reference) <= 1e-4


def reference_logprobs(hf_model, tokens: list[int], temperature: float) -> torch.Tensor:
    """log_softmax(logits / T) at every position of `tokens`, by transformers."""
    with torch.no_grad():
        logits = hf_model(torch.tensor([tokens])).logits[0].float()
    return torch.log_softmax(logits / temperature, dim=-1)


@pytest.mark.parametrize(("temperature", "rows_per_pass"), [(0.0, 256), (0.7, 7)])
def test_logprobs_match_transformers_log_softmax(
    embedded_engine, hf_embedded, temperature: float, rows_per_pass: int, monkeypatch
) -> None:
    """Sampled tokens with their top 5, and prompt tokens with theirs, under the distribution
    sampled from: logits / temperature (1 when greedy), before top-k and top-p. The prompt is
    scored in one pass, or in passes of 7 rows."""
    monkeypatch.setattr(logprobs_module, "PROMPT_ROWS_PER_PASS", rows_per_pass)
    prompt = embedded_engine.encode(CHAT_PROMPTS[1], chat=True)
    params = SamplingParams(
        temperature=temperature,
        top_p=0.9,
        seed=7,
        max_tokens=12,
        ignore_eos=True,
        logprobs=5,
        prompt_logprobs=5,
    )
    [completion] = embedded_engine.generate([prompt], params)
    reference = reference_logprobs(hf_embedded, prompt + completion.token_ids, temperature or 1.0)
    assert len(completion.logprobs) == len(completion.token_ids) == 12
    for i, (entry, token) in enumerate(zip(completion.logprobs, completion.token_ids, strict=True)):
        assert_entry_matches(entry, reference[len(prompt) - 1 + i], token, 5)
    assert len(completion.prompt_logprobs) == len(prompt) - 1
    for j, entry in enumerate(completion.prompt_logprobs):
        assert_entry_matches(entry, reference[j], prompt[j + 1], 5)
