"""GPU workloads (issue 4), each beside the hardware's limits measured in the same run, and
transformers `generate` on the same configuration with random weights of the same shapes.

W1  nano-vllm's workload on the Qwen3-0.6B shape, its bench.py's own draws
    (nano_vllm_draws.py): 256 sequences, input and output lengths uniform in [100, 1024],
    ignore_eos, temperature 0.6: output tokens/s.
W4  batch-1 decode, 1024 in / 128 out, Llama-3.1-8B and Qwen3-0.6B shapes: ms per output
    token beside the weight-read floor (weight bytes / measured copy bandwidth).
W5  static batches, 1024 in / 128 out, Llama-3.1-8B shape: median decode step, memory
    bandwidth utilisation, prefill tokens/s and its fraction of the measured matmul peak.
"""

from __future__ import annotations

import contextlib
import gc
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from aioworker.bench.nano_vllm_draws import Draws, nano_vllm_draws
from aioworker.bench.step_timeline import StepTimeline
from aioworker.checkpoint.model_config import ModelConfig
from aioworker.config import load_config
from aioworker.core.sampling_params import SamplingParams

MODELS = Path(__file__).resolve().parents[2] / "configs" / "models"
LLAMA_8B, QWEN3_06B = MODELS / "llama-3.1-8b", MODELS / "qwen3-0.6b"
W5_BATCHES = (1, 8, 32, 64, 128, 256)
REFERENCE_BATCHES = (1, 64, 256)


@dataclass(frozen=True)
class Limits:
    copy_bytes_per_s: float  # device-to-device copy, bytes read + written
    matmul_flop_per_s: float  # bf16 8192^3


def _time_cuda(fn, repeats: int) -> float:
    """Median seconds of `fn` timed with CUDA events, after two warm-ups."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1000)
    return statistics.median(times)


def measure_limits() -> Limits:
    return Limits(_copy_bytes_per_s(), _matmul_flop_per_s())


def _copy_bytes_per_s() -> float:
    source = torch.randn(1 << 29, device="cuda", dtype=torch.float32)  # 2 GiB
    target = torch.empty_like(source)
    return 2 * source.numel() * 4 / _time_cuda(lambda: target.copy_(source), 20)


def _matmul_flop_per_s() -> float:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    return 2 * 8192**3 / _time_cuda(lambda: a @ b, 20)


def weight_bytes_per_step(cfg: ModelConfig, element_size: int = 2) -> int:
    """Bytes of weights one forward reads (the embedding table only where it is the LM head)."""
    q, kv, h = cfg.q_size, cfg.kv_size, cfg.hidden_size
    per_layer = h * (q + 2 * kv) + q * h + 3 * h * cfg.intermediate_size + 2 * h
    return element_size * (cfg.num_hidden_layers * per_layer + h + cfg.vocab_size * h)


def matmul_flops_per_token(cfg: ModelConfig) -> int:
    return 2 * (weight_bytes_per_step(cfg, 1) - cfg.hidden_size * (2 * cfg.num_hidden_layers + 1))


def kv_bytes_per_token(cfg: ModelConfig, element_size: int = 2) -> int:
    return 2 * cfg.num_hidden_layers * cfg.kv_size * element_size


def make_engine(model_dir: Path, max_model_len: int, **overrides):
    from aioworker.engine import LLMEngine

    settings = {
        "model.path": str(model_dir),
        "model.load_format": "dummy",
        "model.dtype": "bfloat16",
        "model.max_model_len": max_model_len,
        "device.kind": "cuda",
        "scheduler.max_num_seqs": 256,
        "scheduler.max_num_batched_tokens": 16384,
        **overrides,
    }
    return LLMEngine.from_config(load_config(overrides=settings), progress=False)


def free(engine) -> None:
    layers = engine.executor.runner.model.attention_layers()
    engine.close()  # forgets the runner and weights
    for layer in layers:
        layer.k_cache = layer.v_cache = torch.empty(0)
    gc.collect()
    release_cached_memory()


def release_cached_memory() -> None:
    """Hand freed device memory back, and freed pinned host memory (a host KV tier's pool):
    torch keeps both cached for reuse otherwise, and pinned blocks only for the same size."""
    torch.cuda.empty_cache()
    host_empty_cache = getattr(torch._C, "_host_emptyCache", None)
    if host_empty_cache is not None:
        host_empty_cache()


def random_prompt(length: int, vocab: int, rng: random.Random) -> list[int]:
    return [rng.randrange(vocab) for _ in range(length)]


def _timed_generate(engine, prompts, num_tokens: int) -> float:
    params = SamplingParams(temperature=0.0, max_tokens=num_tokens, ignore_eos=True)
    started = time.perf_counter()
    engine.generate(prompts, params)
    return time.perf_counter() - started


def w4_ms_per_token(engine, vocab: int) -> float:
    prompt = random_prompt(1024, min(vocab, 10000), random.Random(4))
    _timed_generate(engine, [prompt], 4)
    first = min(_timed_generate(engine, [prompt], 1) for _ in range(3))
    total = _timed_generate(engine, [prompt], 128)
    return (total - first) / 127 * 1000


@dataclass
class StaticBatch:
    batch: int
    decode_step_ms: float
    prefill_tokens_per_s: float
    context_tokens: float  # mean context per sequence over the decode steps


def w5_static_batch(engine, batch: int, vocab: int) -> StaticBatch:
    rng = random.Random(batch)
    params = SamplingParams(temperature=0.0, max_tokens=128, ignore_eos=True)
    for _ in range(batch):
        engine.add_request(random_prompt(1024, min(vocab, 10000), rng), params)
    prefill_s, decode_steps = 0.0, []
    while engine.has_unfinished:
        is_prefill = any(s.num_uncomputed_tokens > 1 for s in engine.scheduler.seqs.values())
        started = time.perf_counter()
        engine.step()
        elapsed = time.perf_counter() - started
        if is_prefill:
            prefill_s += elapsed
        else:
            decode_steps.append(elapsed)
    return StaticBatch(
        batch, statistics.median(decode_steps) * 1000, batch * 1024 / prefill_s, 1024 + 64
    )


def w1_tokens_per_s(
    engine,
    logprobs: int | None = None,
    timeline: StepTimeline | None = None,
    draws: Draws | None = None,
) -> tuple[float, int]:
    """nano-vllm's bench.py draws (or `draws`); `logprobs`: each sampled token's logprob and
    top k too; `timeline`: records the timed run's steps (step_timeline.py). The timed run
    starts with nothing in the prefix cache: every run draws the same prompts, so without that
    a run after the first (or after the warm-up, for its prompts) would skip their prefill."""
    draws = draws or nano_vllm_draws()
    prompts = draws.prompts
    params = [
        SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=n, logprobs=logprobs)
        for n in draws.max_tokens
    ]
    # Warm-up, with the same options: the first logprobs step compiles their kernel.
    engine.generate(prompts[:4], SamplingParams(max_tokens=8, logprobs=logprobs))
    engine.core.reset_prefix_cache()
    with timeline if timeline is not None else contextlib.nullcontext():
        started = time.perf_counter()
        engine.generate(prompts, params)
        seconds = time.perf_counter() - started
    total = sum(p.max_tokens for p in params)
    return total / seconds, total
