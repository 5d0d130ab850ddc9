"""W4: decode at batch 1 (and 8) beside the weight-read floor, with the small-batch kernels
(device.small_batch_kernels, compute/layers/gemv/) off and on in the same run, for each format
(`aioworker bench --workload w4`). Off is the previous path (cuBLAS, or the format's torch
kernels), so each row prints its baseline beside it. With a candidate (`--candidate KEY=VALUE`)
the baseline is the defaults and the other side the defaults with the candidate's settings: how
a feature not yet on by default is measured on and off.

Each engine loads alone (the previous one freed): dummy weights at configs/models/ shapes,
quantized while loading for a quantized format, CUDA graphs on (captured up to 16 rows: W4 runs
no larger batch), the whole token through the worker's own path. Each engine's logits are
checked finite first (bench/finite.py): a broken engine times like a working one.
"""

from __future__ import annotations

import random
import statistics
from pathlib import Path

from aioworker.bench import finite, gpu, gpu_reference
from aioworker.bench.report import format_table
from aioworker.checkpoint.model_config import load_model_config
from aioworker.compute.layers.linear_method import weight_bytes

# (model, format) -> the goal, ms per token at batch 1 (issues 22 and 23).
GOALS_MS = {
    (gpu.LLAMA_8B, "none"): 4.0,
    (gpu.LLAMA_8B, "fp8"): 2.4,
    (gpu.QWEN3_06B, "none"): 1.0,
    (gpu.LLAMA_8B, "wint8"): 2.6,
    (gpu.LLAMA_8B, "wint4"): 1.6,
    (gpu.QWEN3_06B, "wint4"): 0.9,
}
# Batch 8's ms per token (its step) against batch 1's, with the kernels on.
BATCH_8_GOAL = 1.15
# Tokens of context a sequence has on average over W4's and W5's 128 decode steps (a 1024-token
# prompt each): what a step's attention reads from the KV cache, per sequence.
MEAN_CONTEXT = 1024 + 64
# Settings a format is measured with on both sides: wint4 in groups of 128 inputs, the format
# issue 23's goals and gpt-fast's figure name (and compressed-tensors W4A16 checkpoints hold).
# The engine quantizes bf16 checkpoints in groups of 32 by default, the embedded model's grid;
# a candidate may still set model.int4_group.
FORMAT_SETTINGS = {"wint4": {"model.int4_group": 128}}


def floor_ratio(weight_read: int, kv_token: int) -> float:
    """Batch 8's step against batch 1's at the copy rate: the weights once, and each sequence's
    context from the cache. Where the weights are few (a small or quantized model) the cache
    bounds the ratio a batch-8 goal can ask."""
    return (weight_read + 8 * MEAN_CONTEXT * kv_token) / (weight_read + MEAN_CONTEXT * kv_token)


def measure(model_dir: Path, fmt: str, settings: dict) -> tuple[int, float, float]:
    """(weight bytes read per step, batch-1 ms per token, batch-8 decode step ms)."""
    cfg = load_model_config(model_dir)
    engine = gpu.make_engine(
        model_dir,
        4096,
        **{"model.quantization": fmt, "device.max_capture_batch_size": 16, **settings},
    )
    read = weight_bytes(engine.executor.runner.model)
    prompt = gpu.random_prompt(64, min(cfg.vocab_size, 10000), random.Random(0))
    finite.require_finite(engine, prompt, f"W4 {model_dir.name} {fmt} {settings or 'defaults'}")
    batch_1 = gpu.w4_ms_per_token(engine, cfg.vocab_size)
    batch_8 = gpu.w5_static_batch(engine, 8, cfg.vocab_size).decode_step_ms
    gpu.free(engine)
    print(f"W4 {model_dir.name} {fmt} {settings or 'defaults'}: done", flush=True)
    return read, batch_1, batch_8


def measure_sides(
    model_dir: Path, fmt: str, base: dict, other: dict, repeats: int
) -> tuple[tuple[int, float, float], tuple[int, float, float], str]:
    """Each side measured `repeats` times, the order alternating (off first, then on first, ...)
    so that a drift of the machine falls on both: (off, on) as the medians of batch 1's and batch
    8's times, and the runs' batch-1 times for the notes ('' for one run)."""
    runs: dict[bool, list[tuple[int, float, float]]] = {False: [], True: []}
    for repeat in range(repeats):
        for side in (False, True) if repeat % 2 == 0 else (True, False):
            runs[side].append(measure(model_dir, fmt, other if side else base))

    def median(side: bool) -> tuple[int, float, float]:
        done = runs[side]
        return (
            done[0][0],
            statistics.median(r[1] for r in done),
            statistics.median(r[2] for r in done),
        )

    listed = ""
    if repeats > 1:
        listed = "{} {}: {}".format(
            model_dir.name, fmt,
            "; ".join(" ".join(f"{r[1]:.3f}" for r in runs[side]) for side in (False, True)),
        )  # fmt: skip
    return median(False), median(True), listed


def run(
    limits: gpu.Limits,
    with_reference: bool,
    formats: tuple[str, ...],
    candidate: dict | None = None,
    models: tuple[str, ...] | None = None,
    repeats: int = 1,
) -> tuple[str, str]:
    """Rows for the (model, format) pairs of GOALS_MS whose format is in `formats` (and whose
    model directory's name is in `models`, where given): the kernels off against on, or with
    `candidate`, the defaults against the defaults with its settings; `repeats` runs a side."""
    base, other = ({"device.small_batch_kernels": False}, {"device.small_batch_kernels": True})
    if candidate:
        base, other = {}, candidate
    rows, runs = [], []
    for (model_dir, fmt), goal in GOALS_MS.items():
        if fmt not in formats or (models is not None and model_dir.name not in models):
            continue
        fixed = FORMAT_SETTINGS.get(fmt, {})
        off, on, listed = measure_sides(
            model_dir, fmt, {**fixed, **base}, {**fixed, **other}, repeats
        )
        runs += [listed] if listed else []
        floor_ms = on[0] / limits.copy_bytes_per_s * 1000
        reference = "-"
        if with_reference and fmt == "none":
            model = gpu_reference.load(model_dir)
            ref_ms, _ = gpu_reference.decode_and_prefill(
                model, 1, load_model_config(model_dir).vocab_size
            )
            gpu_reference.free(model)
            reference = f"{ref_ms:.2f}"
        rows.append([
            f"{model_dir.name} {fmt}", f"{off[1]:.3f}", f"{on[1]:.3f}", f"{off[1] / on[1]:.2f}x",
            f"{floor_ms:.3f}", f"{on[1] / floor_ms:.2f}x", f"<= {goal}",
            f"{off[2] / off[1]:.2f} / {on[2] / on[1]:.2f} (<= {BATCH_8_GOAL})",
            f"{floor_ratio(on[0], gpu.kv_bytes_per_token(load_model_config(model_dir))):.2f}", reference,
        ])  # fmt: skip
    header, notes = _header_and_notes(limits, candidate, repeats)
    if runs:
        notes += " Batch 1's runs (ms/token; off, then on): " + ", ".join(runs) + "."
    return format_table(header, rows), notes


def _header_and_notes(
    limits: gpu.Limits, candidate: dict | None, repeats: int
) -> tuple[list[str], str]:
    off_name, on_name = (
        ("kernels off", "kernels on") if not candidate else ("defaults", "candidate")
    )
    header = [
        "W4 batch-1 decode",
        f"{off_name} ms/token",
        f"{on_name} ms/token",
        "speed-up",
        "weight-read floor ms",
        f"{on_name}, of floor",
        "goal ms",
        f"batch 8 step / batch 1, {off_name} / {on_name}",
        "batch 8 / batch 1 at the floor",
        "transformers ms/token",
    ]
    compared = (
        "Kernels off: torch's products (cuBLAS; fp8: a per-token quantization then "
        "torch._scaled_mm; wint8: dequantize then cuBLAS; wint4: torch's tinygemm), the "
        "previous path; on: device.small_batch_kernels."
    )
    if candidate:
        named = ", ".join(f"{key}={value}" for key, value in candidate.items())
        compared = f"Defaults: this commit's defaults; candidate: the defaults with {named}."
    notes = (
        f"{compared} Floor: the "
        "format's weight bytes read per step (linear layers and LM head) / the copy bandwidth "
        f"measured in this run ({limits.copy_bytes_per_s / 1e12:.2f} TB/s). Batch 8: W5's "
        "static batch of 8 x 1024-token prompts, the median decode step; at the floor: batch 8's "
        "step against batch 1's at the copy rate, the weights read once and each sequence's "
        f"{MEAN_CONTEXT} tokens of bfloat16 KV cache (its mean context). wint4: groups of 128 "
        "inputs (model.int4_group=128), the issue's format. "
        + (
            "One run each, off first."
            if repeats == 1
            else f"{repeats} runs each in alternating order (off first, then on first), medians."
        )
    )
    return header, notes
