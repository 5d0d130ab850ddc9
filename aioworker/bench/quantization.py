"""`aioworker bench --workload quant`: quantized weights beside unquantized on the CPU, in the
same run: the formats in turn (the order reversed every repeat), each loaded into an engine of
its own, measured and closed before the next loads (three engines held at once in one process
slowed the unquantized one's batch-1 decode from 25.6 to 17.8 tok/s), medians of REPEATS runs.

b1:  batch 1, greedy decode of DECODE_TOKENS tokens after a short prompt: output tok/s.
c16: 16 requests at once, DECODE_TOKENS tokens each: output tok/s.
"""

from __future__ import annotations

import statistics
import time

from aioworker.bench.report import format_table
from aioworker.core.sampling_params import SamplingParams

FORMATS = ("none", "wint8", "wint4")
REPEATS = 3
DECODE_TOKENS = 128
PROMPT = "Explain, in a short paragraph, why servers batch requests together."


def _rate(engine, prompts: list[list[int]]) -> float:
    params = SamplingParams(temperature=0.0, max_tokens=DECODE_TOKENS, ignore_eos=True)
    started = time.perf_counter()
    completions = engine.generate(prompts, params)
    return sum(len(c.token_ids) for c in completions) / (time.perf_counter() - started)


def run(make_engine) -> tuple[dict[str, dict[str, list[float]]], dict[str, int]]:
    """({workload: {format: [tok/s per run]}}, {format: weight bytes read per token});
    `make_engine(format)` loads one."""
    rates: dict[str, dict[str, list[float]]] = {"b1": {}, "c16": {}}
    weight_bytes = {}
    for repeat in range(REPEATS):
        for fmt in FORMATS if repeat % 2 == 0 else FORMATS[::-1]:
            with make_engine(fmt) as engine:
                prompt = engine.encode(PROMPT, chat=True)
                _rate(engine, [prompt])  # warm-up
                for name, prompts in (("b1", [prompt]), ("c16", [prompt] * 16)):
                    rates[name].setdefault(fmt, []).append(_rate(engine, prompts))
                weight_bytes[fmt] = weights_read_per_token(engine)
    for by_format in rates.values():  # rows in FORMATS order
        for fmt in FORMATS:
            by_format[fmt] = by_format.pop(fmt)
    return rates, weight_bytes


def table(rates: dict[str, dict[str, list[float]]], weight_bytes: dict[str, int]) -> str:
    rows = []
    for fmt in next(iter(rates.values())):
        row = [fmt, f"{weight_bytes[fmt] / 2**20:,.0f}"]
        for by_format in rates.values():
            median = statistics.median(by_format[fmt])
            base = statistics.median(by_format["none"])
            runs = ", ".join(f"{r:.1f}" for r in by_format[fmt])
            row.append(f"{median:.1f} ({runs}) {median / base:.2f}x")
        rows.append(row)
    header = ["format", "weights a b1 step reads, MiB", "b1 tok/s (runs) vs none", "c16 tok/s"]
    return format_table(header, rows)


def weights_read_per_token(engine) -> int:
    """Bytes of the weights a decode step multiplies by: each projection in its format, the LM
    head dense (embeddings are looked up, not read whole)."""
    from aioworker.compute.layers.linear_method import weight_bytes

    return weight_bytes(engine.executor.runner.model)
