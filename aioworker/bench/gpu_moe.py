"""MoE on the GPU (`aioworker bench --workload moe`; dummy weights at the real shapes of
configs/models/): the fused expert kernel against the per-expert loop at decode and prefill
token counts, batch-1 decode beside the active-weight floor, and W1's throughput on
Qwen3-30B-A3B beside the dense Qwen3-8B, all in one run."""

from __future__ import annotations

import random

import torch

from aioworker.bench import gpu
from aioworker.bench.report import format_table
from aioworker.checkpoint.model_config import ModelConfig, load_model_config
from aioworker.compute.layers.moe.reference import reference_experts
from aioworker.compute.layers.moe.routing import route

QWEN3_30B_A3B = gpu.MODELS / "qwen3-30b-a3b"
ERNIE_21B_A3B = gpu.MODELS / "ernie-4.5-21b-a3b"
QWEN3_8B = gpu.MODELS / "qwen3-8b"
KERNEL_TOKENS = (1, 64, 256, 4096)


def active_bytes_per_token(cfg: ModelConfig, element_size: int = 2) -> int:
    """Weight bytes one token's forward reads: attention, each layer's router, its top-k
    experts and shared experts (or its dense MLP), the final norm and the LM head."""
    moe, h = cfg.moe, cfg.hidden_size
    attention = h * (cfg.q_size + 2 * cfg.kv_size) + cfg.q_size * h + 2 * h
    total = 0
    for layer in range(cfg.num_hidden_layers):
        if moe is not None and layer in moe.sparse_layers:
            experts = moe.top_k * moe.intermediate_size + moe.shared_intermediate_size
            total += attention + moe.num_experts * h + 3 * h * experts
        else:
            total += attention + 3 * h * cfg.intermediate_size
    return element_size * (total + h + cfg.vocab_size * h)


def kernel_table() -> tuple[str, str]:
    """One Qwen3-30B-A3B layer's experts, routed by random logits through its real router."""
    from aioworker.compute.layers.moe.triton_experts import fused_experts

    cfg = load_model_config(QWEN3_30B_A3B)
    moe, h = cfg.moe, cfg.hidden_size
    g = torch.Generator(device="cuda").manual_seed(0)
    w13 = torch.randn(moe.num_experts, 2 * moe.intermediate_size, h, device="cuda", generator=g)
    w13 = (w13 * 0.02).bfloat16()
    w2 = (
        torch.randn(moe.num_experts, h, moe.intermediate_size, device="cuda", generator=g) * 0.02
    ).bfloat16()
    rows = []
    for tokens in KERNEL_TOKENS:
        x = torch.randn(tokens, h, device="cuda", generator=g).bfloat16()
        weights, ids = route(torch.randn(tokens, moe.num_experts, device="cuda", generator=g), moe)
        args = (x, w13, w2, ids, weights)
        loop = gpu._time_cuda(lambda args=args: reference_experts(*args), 10)
        fused = gpu._time_cuda(lambda args=args: fused_experts(*args), 20)
        active = len(torch.unique(ids))
        bytes_read = active * 3 * h * moe.intermediate_size * 2
        rows.append([
            str(tokens), str(active), f"{loop * 1e3:.3f}", f"{fused * 1e3:.3f}",
            f"{loop / fused:.1f}x", f"{bytes_read / fused / 1e12:.2f}",
        ])  # fmt: skip
    header = [
        "tokens", "experts hit", "per-expert loop ms", "fused ms", "speed-up", "fused TB/s of experts read",
    ]  # fmt: skip
    notes = (
        "One Qwen3-30B-A3B MoE layer (128 experts of 768, top 8, hidden 2048, bf16), routed by "
        "its router over random logits. The loop is the CPU path run on the GPU (a product per "
        "expert hit, each waiting on the host); the fused path is two Triton grouped GEMMs over "
        "tokens sorted by expert and a combine."
    )
    return format_table(header, rows), notes


def fp8_active_bytes(cfg: ModelConfig) -> int:
    """active_bytes_per_token with every projection and expert in fp8 and the LM head kept in
    bf16 (model.quantization "fp8")."""
    return active_bytes_per_token(cfg, 1) + cfg.vocab_size * cfg.hidden_size


DECODE_RUNS = (
    (QWEN3_30B_A3B, "none", active_bytes_per_token),
    (QWEN3_30B_A3B, "fp8", fp8_active_bytes),
    (ERNIE_21B_A3B, "none", active_bytes_per_token),
)


def decode_table(limits: gpu.Limits) -> tuple[str, str]:
    rows = []
    for model_dir, quantization, active_bytes in DECODE_RUNS:
        cfg = load_model_config(model_dir)
        floor_ms = active_bytes(cfg) / limits.copy_bytes_per_s * 1000
        engine = gpu.make_engine(model_dir, 4096, **{"model.quantization": quantization})
        ours = gpu.w4_ms_per_token(engine, cfg.vocab_size)
        gpu.free(engine)
        rows.append([
            f"{model_dir.name}, {'bf16' if quantization == 'none' else quantization}",
            f"{active_bytes(cfg) / 2**30:.2f}", f"{ours:.3f}", f"{floor_ms:.3f}",
            f"{ours / floor_ms:.2f}x",
        ])  # fmt: skip
        print(f"moe decode {model_dir.name} {quantization}: {ours:.3f} ms", flush=True)
    header = [
        "batch-1 decode",
        "active GiB/token",
        "ms/token",
        "floor ms",
        "of floor (goal <= 1.5x)",
    ]
    notes = (
        "Floor: the weight bytes one token reads (top-k and shared experts, attention, LM head) "
        "/ the copy bandwidth measured in this run. fp8: experts and projections in e4m3 with "
        "per-channel scales (experts through the same fused kernels), the LM head in bf16."
    )
    return format_table(header, rows), notes


def w1_table() -> tuple[str, str]:
    rows = []
    for model_dir in (QWEN3_30B_A3B, QWEN3_8B):
        engine = gpu.make_engine(model_dir, 2048)
        tokens_per_s, total = gpu.w1_tokens_per_s(engine)
        gpu.free(engine)
        rows.append([model_dir.name, f"{tokens_per_s:,.0f}", f"{total:,}"])
        print(f"moe w1 {model_dir.name}: {tokens_per_s:,.0f} tok/s", flush=True)
    header = ["W1 (256 seqs, 100-1,024 in and out)", "output tok/s", "output tokens"]
    notes = "nano-vllm's draws (bench/gpu.py), one run each, one GPU, bf16, CUDA graphs."
    return format_table(header, rows), notes


def run(limits: gpu.Limits) -> tuple[str, str]:
    random.seed(0)
    parts = [kernel_table(), decode_table(limits), w1_table()]
    return "\n\n".join(t for t, _ in parts), "\n\n".join(n for _, n in parts)
