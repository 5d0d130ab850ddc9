"""W8: quantized weights on the Llama-3.1-8B shape (dummy weights), every format beside bf16 in
the same run (`aioworker bench --workload w8`): batch-1 decode beside each format's weight-read
floor, the decode step at larger batches, and prefill tokens/s. Each format loads alone (the
previous engine freed), quantizing its dense draws while loading as a checkpoint would be."""

from __future__ import annotations

from aioworker.bench import gpu
from aioworker.bench.report import format_table
from aioworker.checkpoint.model_config import load_model_config
from aioworker.compute.layers.linear_method import weight_bytes

FORMATS = ("none", "fp8", "wint8", "wint4")
BATCHES = (1, 8, 64, 256)


def run(limits: gpu.Limits) -> tuple[str, str]:
    cfg = load_model_config(gpu.LLAMA_8B)
    results = {}
    for fmt in FORMATS:
        engine = gpu.make_engine(gpu.LLAMA_8B, 2048, **{"model.quantization": fmt})
        read = weight_bytes(engine.executor.runner.model)
        batches = [gpu.w5_static_batch(engine, batch, cfg.vocab_size) for batch in BATCHES]
        gpu.free(engine)
        results[fmt] = (read, batches)
        print(f"W8 {fmt}: done", flush=True)
    base_read, base = results["none"]
    rows = []
    for fmt, (read, batches) in results.items():
        floor_ms = read / limits.copy_bytes_per_s * 1000
        first = batches[0]
        row = [fmt, f"{read / 2**30:.2f}", f"{first.decode_step_ms:.3f}", f"{floor_ms:.3f}"]
        for r, b in zip(batches[1:], base[1:], strict=True):
            row.append(f"{r.decode_step_ms:.2f} ({b.decode_step_ms / r.decode_step_ms:.2f}x)")
        last, last_base = batches[-1], base[-1]
        row.append(
            f"{last.prefill_tokens_per_s:,.0f} "
            f"({last.prefill_tokens_per_s / last_base.prefill_tokens_per_s:.2f}x)"
        )
        rows.append(row)
    header = [
        "W8 format (Llama-3.1-8B)",
        "GiB read/step",
        "batch 1 ms/token",
        "its floor ms",
        *(f"batch {b} step ms (vs none)" for b in BATCHES[1:]),
        f"prefill tok/s, {BATCHES[-1]} x 1024 (vs none)",
    ]
    notes = (
        "Static batches of 1024-token prompts, 128 greedy tokens each (W5's draws); the step is "
        "the median decode step. Floor: the format's weight bytes read per step (linear layers "
        "and LM head, which stays bf16) / the copy bandwidth measured in this run "
        f"({limits.copy_bytes_per_s / 1e12:.2f} TB/s). fp8: W8A8, activations quantized per "
        "token by one Triton kernel, torch._scaled_mm; wint4: torch's tinygemm up to 16 rows, "
        "a Triton dequantization then the bf16 GEMM above; wint8: dequantize-then-GEMM at "
        "every batch (torch's CUDA int8 kernel took 62 ms a token)."
    )
    return format_table(header, rows), notes
