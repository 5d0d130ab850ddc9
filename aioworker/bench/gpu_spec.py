"""`aioworker bench --workload spec` on a GPU: speculative decoding on the H200 shapes.

verify cost  Llama-3.1-8B shape, batch 1, 1024 in / 128 out: a plain decode step against a step
             verifying 4 drafts (5 positions), with the target as its own draft (every draft
             accepted), so the figure is the verify step's cost and the best speed-up.
never slower Qwen3-0.6B shape, 128 in / 64 out at concurrency 1, 4, 16, 64, 256: n-gram drafts
             with the dynamic policy against no speculation, alternating, medians.
Dummy weights at real shapes: greedy tokens are what those weights give.
"""

from __future__ import annotations

import random
import statistics
import time

from aioworker.bench import gpu
from aioworker.bench.report import format_table
from aioworker.checkpoint.model_config import load_model_config
from aioworker.core.sampling_params import SamplingParams

K = 4
DECODE_TOKENS = 128
CONCURRENCY = (1, 4, 16, 64, 256)
REPEATS = 3


class Replay:
    """The target's own continuation as its draft: every draft is accepted."""

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = tokens

    def propose(self, token_ids: list[int], max_tokens: int) -> list[int]:
        return self.tokens[len(token_ids) : len(token_ids) + max_tokens]


def _generate_s(engine, prompt: list[int], num_tokens: int) -> tuple[float, list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=num_tokens, ignore_eos=True)
    started = time.perf_counter()
    [completion] = engine.generate([prompt], params)
    return time.perf_counter() - started, completion.token_ids


def _decode_ms_per_token(engine, prompt: list[int]) -> tuple[float, list[int]]:
    _generate_s(engine, prompt, 4)
    first = min(_generate_s(engine, prompt, 1)[0] for _ in range(3))
    total, tokens = _generate_s(engine, prompt, DECODE_TOKENS)
    return (total - first) / (DECODE_TOKENS - 1) * 1000, tokens


def verify_cost() -> tuple[str, str]:
    cfg = load_model_config(gpu.LLAMA_8B)
    prompt = gpu.random_prompt(1024, min(cfg.vocab_size, 10000), random.Random(4))
    speculative = {
        "speculative.method": "ngram",
        "speculative.num_tokens": K,
        "speculative.dynamic": False,
    }
    engine = gpu.make_engine(gpu.LLAMA_8B, 4096, **speculative)
    speculator = engine.scheduler.speculator
    engine.scheduler.speculator = None
    plain_ms, tokens = _decode_ms_per_token(engine, prompt)
    engine.scheduler.speculator = speculator
    speculator.proposer = Replay(prompt + tokens)
    policy = speculator.policy
    spec_ms, spec_tokens = _decode_ms_per_token(engine, prompt)
    per_step = 1 + policy.num_accepted / max(1, policy.num_verified)
    gpu.free(engine)
    verify_step_ms = spec_ms * per_step
    rows = [
        ["plain decode", f"{plain_ms:.3f}", "1.00", f"{plain_ms:.3f}", "1.00x"],
        [
            f"target as its own draft, k={K}",
            f"{spec_ms:.3f}",
            f"{per_step:.2f}",
            f"{verify_step_ms:.3f} ({verify_step_ms / plain_ms:.2f}x a decode step)",
            f"{plain_ms / spec_ms:.2f}x",
        ],
    ]
    header = ["Llama-3.1-8B shape, batch 1", "ms/token", "tokens/step", "step ms", "speed-up"]
    notes = (
        f"1024 prompt tokens, {DECODE_TOKENS} greedy tokens, dummy weights, bf16; the same "
        f"tokens with speculation: {spec_tokens == tokens}. Verify steps replay CUDA graphs of "
        "5 query slots per sequence; their attention reads the paged KV through the decode "
        "kernel, all 5 queries of a sequence in one program."
    )
    return format_table(header, rows), notes


def never_slower() -> tuple[str, str]:
    cfg = load_model_config(gpu.QWEN3_06B)
    engine = gpu.make_engine(gpu.QWEN3_06B, 1024, **{"speculative.method": "ngram"})
    speculator = engine.scheduler.speculator
    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    rng = random.Random(0)
    rows = []
    for concurrency in CONCURRENCY:
        prompts = [gpu.random_prompt(128, cfg.vocab_size, rng) for _ in range(concurrency)]
        engine.generate(prompts, params)  # warm-up at this size
        rates: dict[bool, list[float]] = {False: [], True: []}
        for repeat in range(REPEATS):
            for on in (False, True) if repeat % 2 == 0 else (True, False):
                engine.scheduler.speculator = speculator if on else None
                started = time.perf_counter()
                completions = engine.generate(prompts, params)
                tokens = sum(len(c.token_ids) for c in completions)
                rates[on].append(tokens / (time.perf_counter() - started))
        off, on = statistics.median(rates[False]), statistics.median(rates[True])
        rows.append([str(concurrency), f"{off:,.0f}", f"{on:,.0f}", f"{on / off:.2f}x"])
    engine.scheduler.speculator = speculator
    policy = speculator.policy
    gpu.free(engine)
    header = ["Qwen3-0.6B shape, concurrency", "off tok/s", "n-gram, dynamic tok/s", "on / off"]
    notes = (
        f"128 random prompt tokens, 64 greedy tokens, dummy weights; medians of {REPEATS} runs "
        f"per side, alternating. Drafts verified {policy.num_proposed}, accepted "
        f"{policy.num_accepted}; measured host gap {policy.host_gap_s * 1e3:.2f} ms."
    )
    return format_table(header, rows), notes
