"""Offline engine against transformers `generate` on the same model, prompts and lengths.

b1:  batch-1 decode tokens/s (decode rate = (N - 1) / (time for N tokens - time for 1 token)).
c16: 16 concurrent requests of 64 prompt / 64 output tokens: output tokens / wall time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from aioworker.core.sampling_params import SamplingParams

B1_PROMPT, B1_TOKENS = 32, 128
C16_REQUESTS, C16_PROMPT, C16_TOKENS = 16, 64, 64


@dataclass
class Row:
    workload: str
    ours: float
    reference: float

    @property
    def ratio(self) -> float:
        return self.ours / self.reference


def random_prompts(num: int, length: int, vocab_size: int, seed: int = 0) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [
        torch.randint(100, min(vocab_size, 40000), (length,), generator=generator).tolist()
        for _ in range(num)
    ]


def _timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def _decode_rate(run: Callable[[int], object], num_tokens: int) -> float:
    run(2)  # warm-up
    first = min(_timed(lambda: run(1)) for _ in range(2))
    total = _timed(lambda: run(num_tokens))
    return (num_tokens - 1) / (total - first)


class OursRunner:
    def __init__(self, engine) -> None:
        self.engine = engine

    def generate(self, prompts: list[list[int]], num_tokens: int) -> list[list[int]]:
        params = SamplingParams(temperature=0.0, max_tokens=num_tokens, ignore_eos=True)
        return [c.token_ids for c in self.engine.generate(prompts, params)]


class TransformersRunner:
    def __init__(self, model_dir, dtype: torch.dtype) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
        self.model.generation_config.eos_token_id = None
        self.model.generation_config.pad_token_id = 0

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], num_tokens: int) -> list[list[int]]:
        # Equal-length prompts: no padding, so both sides compute exactly the same tokens.
        ids = torch.tensor(prompts)
        out = self.model.generate(ids, max_new_tokens=num_tokens, do_sample=False)
        return out[:, ids.shape[1] :].tolist()


def run_b1(runner, vocab_size: int) -> float:
    [prompt] = random_prompts(1, B1_PROMPT, vocab_size, seed=1)
    return _decode_rate(lambda n: runner.generate([prompt], n), B1_TOKENS)


def run_c16(runner, vocab_size: int) -> float:
    prompts = random_prompts(C16_REQUESTS, C16_PROMPT, vocab_size, seed=2)
    runner.generate(prompts[:2], 2)  # warm-up
    seconds = _timed(lambda: runner.generate(prompts, C16_TOKENS))
    return C16_REQUESTS * C16_TOKENS / seconds


def same_tokens(ours, reference, vocab_size: int) -> bool:
    """The two implementations must agree on what they are timing (greedy, same prompts)."""
    prompts = random_prompts(4, C16_PROMPT, vocab_size, seed=3)
    return ours.generate(prompts, 16) == reference.generate(prompts, 16)


WORKLOADS = {"b1": run_b1, "c16": run_c16}
