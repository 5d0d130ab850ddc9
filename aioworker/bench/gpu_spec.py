"""`aioworker bench --workload spec` on a GPU: speculative decoding on the H200 shapes.

verify cost  Llama-3.1-8B shape, batch 1, 1024 in / 128 out: a plain decode step against a step
             verifying 4 drafts (5 positions), with the target as its own draft (every draft
             accepted), so the figure is the verify step's cost and the best speed-up.
self-draft   the same shape and prompt, drafting with the target's first 2 layers (k = 4): the
             cost of a step that verifies 4 drafts and drafts 4 more, of one draft step, and
             the speed-up those costs give at a per-draft acceptance of 0.6 and 0.8.
projections  the 8B shape's projections at 1 and 5 rows (cuBLAS): how much of a verify step's
             extra cost its matrix products account for.
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
RUN_SECONDS = 1.5
# The verify step's cost, measured by verify_cost for self_draft_cost (run after it).
_VERIFY_STEP_MS: dict[str, float] = {}


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


def _plain_then_speculating(speculative: dict, prompt: list[int]):
    """An engine of the 8B shape speculating with k = K always, and its plain ms/token and
    tokens, measured first with speculation off: (engine, speculator, ms, tokens)."""
    settings = {"speculative.num_tokens": K, "speculative.dynamic": False, **speculative}
    engine = gpu.make_engine(gpu.LLAMA_8B, 4096, **settings)
    speculator = engine.scheduler.speculator
    engine.scheduler.speculator = None
    plain_ms, tokens = _decode_ms_per_token(engine, prompt)
    engine.scheduler.speculator = speculator
    return engine, speculator, plain_ms, tokens


def verify_cost() -> tuple[str, str]:
    cfg = load_model_config(gpu.LLAMA_8B)
    prompt = gpu.random_prompt(1024, min(cfg.vocab_size, 10000), random.Random(4))
    engine, speculator, plain_ms, tokens = _plain_then_speculating(
        {"speculative.method": "ngram"}, prompt
    )
    speculator.proposer = Replay(prompt + tokens)
    policy = speculator.policy
    spec_ms, spec_tokens = _decode_ms_per_token(engine, prompt)
    per_step = 1 + policy.num_accepted / max(1, policy.num_verified)
    runner = engine.executor.runner
    # The graphs of batch 1 replayed as the last step left their inputs (a ~1,150-token
    # context): the device's time alone, without the host's between steps.
    decode_device_ms = replay_ms(runner.graphs.graphs[1])
    verify_device_ms = replay_ms(runner.verify_graphs.graphs[1])
    gpu.free(engine)
    verify_step_ms = spec_ms * per_step
    _VERIFY_STEP_MS["ms"] = verify_step_ms
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
        f"tokens with speculation: {spec_tokens == tokens}. Step ms is wall time per step, the "
        "host's work between lockstep steps included; on the device alone (a graph of batch 1 "
        f"replayed) a decode step takes {decode_device_ms:.3f} ms and a verify step "
        f"{verify_device_ms:.3f} ms ({verify_device_ms / decode_device_ms:.2f}x). Verify steps replay CUDA graphs of "
        "5 query slots per sequence; their attention reads the paged KV through the decode "
        "kernel, all 5 queries of a sequence in one program."
    )
    return format_table(header, rows), notes


def _self_draft_step_ms(prompt: list[int], layers: int) -> tuple[float, float, float]:
    """(plain ms/token, ms per target step with drafts, tokens per step) with a self-draft of
    `layers` layers; every step drafts k and verifies the previous k."""
    speculative = {"speculative.method": "draft", "speculative.draft_layers": layers}
    engine, speculator, plain_ms, _ = _plain_then_speculating(speculative, prompt)
    policy = speculator.policy
    _generate_s(engine, prompt, 8)  # warm-up: the draft graphs' first replays
    verified_before, accepted_before = policy.num_verified, policy.num_accepted
    first = min(_generate_s(engine, prompt, 1)[0] for _ in range(3))
    total, _ = _generate_s(engine, prompt, DECODE_TOKENS)
    gpu.free(engine)
    steps = policy.num_verified - verified_before
    per_step = 1 + (policy.num_accepted - accepted_before) / max(1, steps)
    return plain_ms, (total - first) / max(1, steps) * 1000, per_step


def _tokens_per_step(acceptance: float) -> float:
    """Expected tokens a step keeps with K drafts each accepted with this probability (the
    first rejection ends the run, and the target's own token follows)."""
    return (1 - acceptance ** (K + 1)) / (1 - acceptance)


def self_draft_cost() -> tuple[str, str]:
    cfg = load_model_config(gpu.LLAMA_8B)
    prompt = gpu.random_prompt(1024, min(cfg.vocab_size, 10000), random.Random(4))
    plain_ms, step_ms, per_step = _self_draft_step_ms(prompt, 2)
    verify_ms = _VERIFY_STEP_MS.get("ms", float("nan"))
    draft_ms = (step_ms - verify_ms) / K
    rows = [["plain decode step", f"{plain_ms:.3f}", "", ""]]
    rows.append(["verify step (k+1 = 5), from the verify table", f"{verify_ms:.3f}", "", ""])
    rows.append([f"verify + {K} draft steps (2-layer self-draft)", f"{step_ms:.3f}", "", ""])
    rows.append(["one draft step, by difference", f"{draft_ms:.3f}", "", ""])
    for acceptance in (0.6, 0.8):
        tokens = _tokens_per_step(acceptance)
        speed_up = tokens * plain_ms / step_ms
        rows.append(
            [f"implied at acceptance {acceptance}", "", f"{tokens:.2f}", f"{speed_up:.2f}x"]
        )
    header = ["Llama-3.1-8B shape, batch 1", "ms", "tokens/step", "speed-up"]
    notes = (
        f"1024 prompt tokens, {DECODE_TOKENS} greedy tokens, dummy weights, bf16, k = {K}. "
        f"Measured tokens per step with these random weights: {per_step:.2f} (a random "
        "model's first layers do not predict it); the implied rows take the measured step cost "
        "and the expected tokens per step at that per-draft acceptance, (1 - a^(k+1)) / (1 - a)."
    )
    return format_table(header, rows), notes


def projection_rows_cost() -> tuple[str, str]:
    """Where a verify step's extra time could go: the Llama-3.1-8B shape's projections (one
    decoder layer's four and the LM head) at 1 row, a decode step at batch 1, and at 5 rows,
    a verify step of 4 drafts."""
    import torch

    cfg = load_model_config(gpu.LLAMA_8B)
    hidden, inter = cfg.hidden_size, cfg.intermediate_size
    kv = cfg.num_key_value_heads * cfg.head_dim
    shapes = {
        "qkv": (hidden, hidden + 2 * kv),
        "o": (hidden, hidden),
        "gate_up": (hidden, 2 * inter),
        "down": (inter, hidden),
        "lm_head": (hidden, cfg.vocab_size),
    }
    weights = {
        name: torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        for name, (k, n) in shapes.items()
    }
    times = {}
    for rows in (1, 5):
        for name, (k, _) in shapes.items():
            x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
            times[name, rows] = _gpu_ms(lambda x=x, w=weights[name]: x @ w.t())
    layers = cfg.num_hidden_layers

    def step_ms(rows: int) -> float:
        per_layer = sum(times[n, rows] for n in shapes if n != "lm_head")
        return per_layer * layers + times["lm_head", rows]

    table_rows = [
        [name, f"{times[name, 1] * 1e3:.1f}", f"{times[name, 5] * 1e3:.1f}"] for name in shapes
    ]
    table_rows.append([f"{layers} layers + LM head, ms", f"{step_ms(1):.3f}", f"{step_ms(5):.3f}"])
    header = ["Llama-3.1-8B shape, bf16 x @ W^T", "1 row, us", "5 rows, us"]
    notes = (
        "torch matmul (cuBLAS) on random weights, each captured 20 times in a CUDA graph and "
        "timed over 20 replays with CUDA events; "
        f"5 rows cost {step_ms(5) / step_ms(1):.2f}x 1 row over a whole step's projections."
    )
    return format_table(header, table_rows), notes


def _gpu_ms(call, repeats: int = 20, replays: int = 20) -> float:
    """Device time of one `call`, captured `repeats` times in a CUDA graph and replayed: how
    the model runs them. (Timed eagerly, a 14 us product measures the launch gap instead.)"""
    import torch

    for _ in range(3):
        call()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(repeats):
            call()
    return replay_ms(graph, replays) / repeats


def replay_ms(graph, replays: int = 20) -> float:
    """Mean device time of a captured graph's replay."""
    import torch

    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / replays


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
        # Each run repeats the batch for at least RUN_SECONDS: one batch of 64-token requests
        # lasts about 0.1 s, too short to tell 3% from noise.
        rates: dict[bool, list[float]] = {False: [], True: []}
        for repeat in range(REPEATS):
            for on in (False, True) if repeat % 2 == 0 else (True, False):
                engine.scheduler.speculator = speculator if on else None
                started = time.perf_counter()
                tokens = 0
                while time.perf_counter() - started < RUN_SECONDS:
                    completions = engine.generate(prompts, params)
                    tokens += sum(len(c.token_ids) for c in completions)
                rates[on].append(tokens / (time.perf_counter() - started))
        off, on = statistics.median(rates[False]), statistics.median(rates[True])
        rows.append([str(concurrency), f"{off:,.0f}", f"{on:,.0f}", f"{on / off:.2f}x"])
    engine.scheduler.speculator = speculator
    policy = speculator.policy
    chosen = ", ".join(f"{row['batch']}: {row['k']}" for row in policy.table())
    gpu.free(engine)
    header = ["Qwen3-0.6B shape, concurrency", "off tok/s", "n-gram, dynamic tok/s", "on / off"]
    notes = (
        f"128 random prompt tokens, 64 greedy tokens, dummy weights; each run repeats the "
        f"batch for at least {RUN_SECONDS} s; medians of {REPEATS} runs per side, alternating. "
        f"Drafts verified {policy.num_proposed}, accepted {policy.num_accepted}; measured "
        f"host gap {policy.host_gap_s * 1e3:.2f} ms, proposal rate "
        f"{policy.proposal_rate:.3f}; k the policy chooses by batch at the end: {chosen}."
    )
    return format_table(header, rows), notes
