"""`aioworker bench --workload quant`: quantized weights beside unquantized on the CPU, in
float32 and bfloat16, in the same run: the variants in turn (the order reversed every repeat),
each loaded into an engine of its own, measured and closed before the next loads (three
engines held at once in one process slowed the unquantized one's batch-1 decode from 25.6 to
17.8 tok/s), medians of REPEATS runs; float32 unquantized is the baseline.

b1:  batch 1, greedy decode of DECODE_TOKENS tokens after a short prompt: output tok/s.
c16: 16 requests at once, DECODE_TOKENS tokens each: output tok/s.
"""

from __future__ import annotations

import statistics
import time

from aioworker.bench.report import format_table
from aioworker.core.sampling_params import SamplingParams

FORMATS = ("none", "wint8", "wint4")
DTYPES = ("float32", "bfloat16")
VARIANTS = tuple(f"{fmt} {dtype}" for dtype in DTYPES for fmt in FORMATS)  # "none float32" first
REPEATS = 3
DECODE_TOKENS = 128
PROMPT = "Explain, in a short paragraph, why servers batch requests together."


def _rate(engine, prompts: list[list[int]]) -> float:
    params = SamplingParams(temperature=0.0, max_tokens=DECODE_TOKENS, ignore_eos=True)
    started = time.perf_counter()
    completions = engine.generate(prompts, params)
    return sum(len(c.token_ids) for c in completions) / (time.perf_counter() - started)


def run(make_engine) -> tuple[dict[str, dict[str, list[float]]], dict[str, int]]:
    """({workload: {variant: [tok/s per run]}}, {variant: weight bytes read per token});
    `make_engine(format, dtype)` loads one."""
    rates: dict[str, dict[str, list[float]]] = {"b1": {}, "c16": {}}
    weight_bytes = {}
    for repeat in range(REPEATS):
        for variant in VARIANTS if repeat % 2 == 0 else VARIANTS[::-1]:
            with make_engine(*variant.split()) as engine:
                prompt = engine.encode(PROMPT, chat=True)
                _rate(engine, [prompt])  # warm-up
                for name, prompts in (("b1", [prompt]), ("c16", [prompt] * 16)):
                    rates[name].setdefault(variant, []).append(_rate(engine, prompts))
                weight_bytes[variant] = weights_read_per_token(engine)
    for by_variant in rates.values():  # rows in VARIANTS order
        for variant in VARIANTS:
            by_variant[variant] = by_variant.pop(variant)
    return rates, weight_bytes


def table(rates: dict[str, dict[str, list[float]]], weight_bytes: dict[str, int]) -> str:
    rows = []
    for variant in next(iter(rates.values())):
        row = [variant, f"{weight_bytes[variant] / 2**20:,.0f}"]
        for by_variant in rates.values():
            median = statistics.median(by_variant[variant])
            base = statistics.median(by_variant[VARIANTS[0]])
            runs = ", ".join(f"{r:.1f}" for r in by_variant[variant])
            row.append(f"{median:.1f} ({runs}) {median / base:.2f}x")
        rows.append(row)
    header = [
        "format, dtype",
        "weights a b1 step reads, MiB",
        f"b1 tok/s (runs) vs {VARIANTS[0]}",
        "c16 tok/s",
    ]
    return format_table(header, rows)


def weights_read_per_token(engine) -> int:
    """Bytes of the weights a decode step multiplies by: each projection in its format, the LM
    head dense (embeddings are looked up, not read whole)."""
    from aioworker.compute.layers.linear_method import weight_bytes

    return weight_bytes(engine.executor.runner.model)
