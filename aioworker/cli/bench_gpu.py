"""`aioworker bench` on a GPU: the workloads of docs/benchmarks.md that need one (W1, W4-W9,
MoE), their arguments checked before anything loads, each table printed with its notes and, with
--record, appended dated."""

from __future__ import annotations

import argparse
from typing import NamedTuple

from aioworker.cli.common import fail, parse_settings
from aioworker.config import ConfigError

W4_FORMATS = ("none", "fp8", "wint8", "wint4")
W4_MODELS = ("llama-3.1-8b", "qwen3-0.6b")  # configs/models/ directories W4 measures


class W4Choice(NamedTuple):
    """What W4 measures: formats, models (configs/models/ names), runs a side."""

    formats: tuple[str, ...]
    models: tuple[str, ...]
    repeats: int


def run_gpu_workloads(args: argparse.Namespace) -> int:
    """Check the GPU workloads' arguments, naming a bad one and its fix, then run them."""
    if args.w9_users < 1:
        return fail(f"--w9-users is {args.w9_users}; give 1 or more (128 by default)")
    formats = tuple(f for f in args.w4_formats.split(",") if f)
    unknown = sorted(set(formats) - set(W4_FORMATS))
    if unknown:
        return fail(f"--w4-formats names {', '.join(unknown)}; give {', '.join(W4_FORMATS)}")
    models = tuple(m for m in args.w4_models.split(",") if m) or W4_MODELS
    unknown = sorted(set(models) - set(W4_MODELS))
    if unknown:
        return fail(f"--w4-models names {', '.join(unknown)}; give {', '.join(W4_MODELS)}")
    if args.w4_repeats < 1:
        return fail(f"--w4-repeats is {args.w4_repeats}; give 1 or more (3 to decide)")
    try:
        candidate = parse_settings(args.candidate, "--candidate") or None
    except ConfigError as exc:
        return fail(str(exc))
    w4 = W4Choice(formats, models, args.w4_repeats)
    return run_gpu(args.workload, not args.no_reference, args.record, args.w9_users, w4, candidate)


def run_gpu(
    workloads: list[str],
    with_reference: bool,
    record: str | None,
    w9_users: int,
    w4: W4Choice,
    candidate: dict | None,
) -> int:
    from aioworker.bench import (
        gpu,
        gpu_decode_floor,
        gpu_host_tier,
        gpu_host_tier_run,
        gpu_moe,
        gpu_quant,
        gpu_run,
    )
    from aioworker.bench.report import publish

    limits = gpu.measure_limits()
    print(
        f"measured: copy {limits.copy_bytes_per_s / 1e12:.2f} TB/s, bf16 matmul {limits.matmul_flop_per_s / 1e12:.0f} TFLOP/s",
        flush=True,
    )
    runners = {
        "w4": lambda: gpu_decode_floor.run(
            limits, with_reference, w4.formats, candidate, w4.models, w4.repeats
        ),
        "w5": lambda: gpu_run.run_w5(limits, with_reference),
        "w1": lambda: gpu_run.run_w1(limits, candidate),
        "w6": lambda: gpu_run.run_w6(limits),
        "w7": lambda: gpu_run.run_w7(limits),
        "w8": lambda: gpu_quant.run(limits),
        "w9": lambda: gpu_host_tier_run.run(gpu_host_tier.ChatScale(num_users=w9_users)),
        "moe": lambda: gpu_moe.run(limits),
    }
    for name in workloads:
        table, notes = runners[name]()
        publish(record, f"GPU workload {name.upper()}", table, notes)
    return 0
