"""The sampler's cost per step on the GPU: torch's draw (a generator per seeded row) against the
one-pass Triton draw, seeded rows at temperature 1.0, as in GRPO rollouts. Wall time per call,
host work and GPU work together (synchronised after each call); 3 runs per side, alternating,
medians.

    python tools/bench_sampler.py [--rows 256] [--vocab 151936] [--record docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from aioworker.bench.report import append_to_doc, format_table
from aioworker.compute.sampling.sampler import Sampler, SampleRow
from aioworker.core.plan import SamplingSettings


def time_calls(sampler: Sampler, logits: torch.Tensor, rows: list[SampleRow], calls: int) -> float:
    sampler(logits, rows)  # warm-up (and the kernel's compile)
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(calls):
        sampler(logits, rows)
        torch.cuda.synchronize()
    return (time.perf_counter() - started) / calls * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--record", metavar="FILE", help="append a dated section to FILE")
    args = parser.parse_args()
    device = torch.device("cuda")
    logits = torch.randn(args.rows, args.vocab, device=device, dtype=torch.bfloat16) * 3
    settings = [SamplingSettings(1.0, 0, 1.0, seed, 0, []) for seed in range(args.rows)]
    rows = [SampleRow(s, 600, 88) for s in settings]
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(3):
        for one_pass in (False, True):
            sampler = Sampler(0, device, one_pass=one_pass)
            times[one_pass].append(time_calls(sampler, logits, rows, args.calls))
    rows_out = [
        [name, f"{statistics.median(times[one_pass]):.3f}", ", ".join(f"{t:.3f}" for t in times[one_pass])]
        for one_pass, name in ((False, "torch, a generator per seeded row"), (True, "one pass (Triton)"))
    ]  # fmt: skip
    title = f"{args.rows} seeded rows x {args.vocab:,} tokens, temperature 1.0"
    table = format_table([title, "ms per step (median)", "runs"], rows_out)
    print(table)
    if args.record:
        append_to_doc(args.record, "Sampler, one pass against torch", table)


if __name__ == "__main__":
    main()
