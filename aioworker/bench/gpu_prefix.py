"""GPU workloads of prefix caching and parallel samples (issue 12), each against caching off in
the same run.

W6  shared prefix: 512 requests, a common 2,048-token prefix plus 32 unique tokens each, 128
    output tokens, Llama-3.1-8B shape: output tokens/s and mean time to first token.
W7  GRPO-like: 64 prompts of 512 tokens, n=16, 256 output tokens, temperature 1.0, Qwen3-0.6B
    shape, against the same 1,024 completions as independent requests with caching off.
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass

import msgspec

from aioworker.bench.gpu import random_prompt
from aioworker.core.sampling_params import SamplingParams


def set_prefix_caching(engine, enabled: bool) -> None:
    """Between runs: forget what the last run cached, and turn caching on or off."""
    engine.core.reset_prefix_cache()
    engine.block_manager.enable_prefix_caching = enabled


@dataclass
class Served:
    output_tokens_per_s: float
    mean_ttft_s: float
    num_output_tokens: int


def serve_all(engine, prompts: list[list[int]], params: list[SamplingParams]) -> Served:
    """Every request added at once; output tokens/s over the whole run, and the mean time from
    the start to each request's (each sample's) first token."""
    started = time.perf_counter()
    for prompt, p in zip(prompts, params, strict=True):
        engine.add_request(prompt, p)
    first: dict[tuple[str, int], float] = {}
    num_tokens = 0
    while engine.has_unfinished:
        for out in engine.step():
            num_tokens += len(out.token_ids)
            first.setdefault((out.request_id, out.sample_index), time.perf_counter() - started)
    elapsed = time.perf_counter() - started
    return Served(num_tokens / elapsed, statistics.mean(first.values()), num_tokens)


def w6_shared_prefix(engine, cached: bool) -> Served:
    rng = random.Random(6)
    prefix = random_prompt(2048, 10000, rng)
    prompts = [prefix + random_prompt(32, 10000, rng) for _ in range(512)]
    params = SamplingParams(temperature=0.0, max_tokens=128, ignore_eos=True)
    set_prefix_caching(engine, cached)
    engine.generate(prompts[:2], msgspec.structs.replace(params, max_tokens=4))  # warm-up
    set_prefix_caching(engine, cached)
    return serve_all(engine, prompts, [params] * len(prompts))


def w7_grpo(engine, parallel: bool) -> Served:
    """`parallel`: 64 requests of n=16 with caching on; else 1,024 requests, caching off."""
    rng = random.Random(7)
    prompts = [random_prompt(512, 10000, rng) for _ in range(64)]
    params = SamplingParams(temperature=1.0, max_tokens=256, ignore_eos=True, seed=0)
    set_prefix_caching(engine, parallel)
    engine.generate(prompts[:2], msgspec.structs.replace(params, max_tokens=4))  # warm-up
    set_prefix_caching(engine, parallel)
    if parallel:
        return serve_all(engine, prompts, [msgspec.structs.replace(params, n=16)] * 64)
    each = [msgspec.structs.replace(params, seed=i) for i in range(16)]
    return serve_all(engine, [p for p in prompts for _ in range(16)], each * 64)
