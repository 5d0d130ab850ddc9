"""Run the GPU workloads and format their tables (used by `aioworker bench --workload w1|w4|w5`)."""

from __future__ import annotations

import statistics

from aioworker.bench import gpu, gpu_reference
from aioworker.bench.report import format_table
from aioworker.checkpoint.model_config import load_model_config


def run_w4(limits: gpu.Limits, with_reference: bool) -> tuple[str, str]:
    rows = []
    for model_dir in (gpu.LLAMA_8B, gpu.QWEN3_06B):
        cfg = load_model_config(model_dir)
        floor_ms = gpu.weight_bytes_per_step(cfg) / limits.copy_bytes_per_s * 1000
        engine = gpu.make_engine(model_dir, 4096)
        ours = gpu.w4_ms_per_token(engine, cfg.vocab_size)
        gpu.free(engine)
        reference = "-"
        if with_reference:
            model = gpu_reference.load(model_dir)
            ref_ms, _ = gpu_reference.decode_and_prefill(model, 1, cfg.vocab_size)
            gpu_reference.free(model)
            reference = f"{ref_ms:.2f} ({ref_ms / ours:.1f}x)"
        rows.append(
            [model_dir.name, f"{ours:.3f}", f"{floor_ms:.3f}", f"{ours / floor_ms:.2f}x", reference]
        )
    header = [
        "W4 batch-1 decode",
        "aioworker ms/token",
        "weight-read floor ms",
        "of floor",
        "transformers ms/token (speed-up)",
    ]
    notes = "Floor: bf16 weight bytes read per step / the copy bandwidth measured in this run."
    return format_table(header, rows), notes


def run_w5(limits: gpu.Limits, with_reference: bool) -> tuple[str, str]:
    cfg = load_model_config(gpu.LLAMA_8B)
    engine = gpu.make_engine(gpu.LLAMA_8B, 2048)
    results = [gpu.w5_static_batch(engine, batch, cfg.vocab_size) for batch in gpu.W5_BATCHES]
    gpu.free(engine)
    reference = {}
    if with_reference:
        model = gpu_reference.load(gpu.LLAMA_8B)
        reference = {
            b: gpu_reference.decode_and_prefill(model, b, cfg.vocab_size)
            for b in gpu.REFERENCE_BATCHES
        }
        gpu_reference.free(model)
    rows = []
    for r in results:
        step_bytes = gpu.weight_bytes_per_step(
            cfg
        ) + r.batch * r.context_tokens * gpu.kv_bytes_per_token(cfg)
        bandwidth = step_bytes / (r.decode_step_ms / 1000) / limits.copy_bytes_per_s
        prefill_flops = r.prefill_tokens_per_s * gpu.matmul_flops_per_token(cfg)
        ref = reference.get(r.batch)
        ref_text = f"{ref[0]:.2f} ({ref[0] / r.decode_step_ms:.1f}x)" if ref else "-"
        rows.append([
            str(r.batch), f"{r.decode_step_ms:.2f}", f"{bandwidth:.0%}",
            f"{r.prefill_tokens_per_s:,.0f}", f"{prefill_flops / limits.matmul_flop_per_s:.0%}", ref_text,
        ])  # fmt: skip
    header = [
        "W5 batch (Llama-3.1-8B)",
        "decode step ms",
        "bandwidth of copy",
        "prefill tok/s",
        "of matmul peak",
        "transformers step ms (speed-up)",
    ]
    notes = (
        "Bandwidth: (weight bytes + KV bytes of the mean context) per step / step time / copy "
        "bandwidth. Prefill: linear-layer FLOPs only (attention excluded) / measured bf16 peak."
    )
    return format_table(header, rows), notes


# W1 runs this many times with and without logprobs, alternating; the table gives medians.
W1_REPEATS = 3


def run_w1(limits: gpu.Limits) -> tuple[str, str]:
    cfg = load_model_config(gpu.QWEN3_06B)
    engine = gpu.make_engine(gpu.QWEN3_06B, 2048)
    runs: dict[int | None, list[float]] = {None: [], 5: []}
    for _ in range(W1_REPEATS):
        for logprobs in runs:
            tokens_per_s, total = gpu.w1_tokens_per_s(engine, logprobs)
            runs[logprobs].append(tokens_per_s)
    gpu.free(engine)
    plain, scored = statistics.median(runs[None]), statistics.median(runs[5])
    table = format_table(
        ["W1 (nano-vllm, Qwen3-0.6B)", "output tok/s (median)", "runs", "output tokens"],
        [
            ["aioworker", f"{plain:,.0f}", _runs(runs[None]), f"{total:,}"],
            ["aioworker, logprobs=5", f"{scored:,.0f}", _runs(runs[5]), f"{total:,}"],
        ],
    )
    notes = (
        f"Logprobs cost {1 - scored / plain:.1%} of the throughput ({W1_REPEATS} runs each, "
        f"alternating). Copy bandwidth {limits.copy_bytes_per_s / 1e12:.2f} TB/s, bf16 matmul "
        f"{limits.matmul_flop_per_s / 1e12:.0f} TFLOP/s in this run; KV bytes per token "
        f"{gpu.kv_bytes_per_token(cfg):,}."
    )
    return table, notes


def _runs(values: list[float]) -> str:
    return ", ".join(f"{v:,.0f}" for v in values)
