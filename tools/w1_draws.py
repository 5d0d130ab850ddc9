"""W1 on nano-vllm's own draws against the draws it ran until 2026-12-07, on one engine, on the
GPU: each side three times in alternating order, medians, appended dated to a file.

    python tools/w1_draws.py [--runs 3] [--record docs/benchmarks.md]

Why: until 2026-12-07 W1 drew its token ids with `randrange(10000)`, where nano-vllm's bench.py
calls `randint(0, 10000)`. One value more a draw moves every later draw, so W1 ran other prompt
and output lengths than nano-vllm's (141,664 prompt and 150,245 output tokens, against the
142,827 and 133,966 its README reports). Every W1 figure before that date is on the old draws;
this says how far they stand from the new.
"""

from __future__ import annotations

import argparse
import random
import statistics

from aioworker.bench import gpu
from aioworker.bench.gpu_run import listed_runs
from aioworker.bench.nano_vllm_draws import Draws, nano_vllm_draws
from aioworker.bench.report import append_to_doc, format_table


def draws_before_2026_12_07() -> Draws:
    """The draws W1 made until 2026-12-07: token ids from random_prompt's randrange(10000)."""
    rng = random.Random(0)
    prompts = [gpu.random_prompt(rng.randint(100, 1024), 10000, rng) for _ in range(256)]
    return Draws(prompts, [rng.randint(100, 1024) for _ in range(256)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs a side, alternating")
    parser.add_argument("--record", help="append the table, dated, to this file")
    args = parser.parse_args()
    sides = {
        "nano-vllm's draws (W1 now)": nano_vllm_draws(),
        "W1's draws before 2026-12-07": draws_before_2026_12_07(),
    }
    limits = gpu.measure_limits()
    engine = gpu.make_engine(gpu.QWEN3_06B, 2048)
    runs: dict[str, list[float]] = {name: [] for name in sides}
    for i in range(args.runs):
        order = list(sides) if i % 2 == 0 else list(reversed(sides))
        for name in order:
            runs[name].append(gpu.w1_tokens_per_s(engine, draws=sides[name])[0])
            print(f"{name}: {runs[name][-1]:,.0f} output tok/s", flush=True)
    gpu.free(engine)
    rows = [
        [
            name,
            f"{sum(map(len, draws.prompts)):,}",
            f"{sum(draws.max_tokens):,}",
            f"{statistics.median(runs[name]):,.0f}",
            listed_runs(runs[name]),
        ]
        for name, draws in sides.items()
    ]
    header = ["W1 (Qwen3-0.6B)", "prompt tokens", "output tokens", "output tok/s (median)", "runs"]
    table = format_table(header, rows)
    new, old = (statistics.median(runs[name]) for name in sides)
    notes = (
        f"{args.runs} runs a side on one engine, alternating (nano-vllm's draws first, then the "
        f"old first), each starting with nothing cached. New against old: {new / old:.3f}. "
        f"Copy bandwidth {limits.copy_bytes_per_s / 1e12:.2f} TB/s in this run."
    )
    print(table, "\n", notes, sep="")
    if args.record:
        append_to_doc(args.record, "W1 on nano-vllm's draws against its old draws", table, notes)


if __name__ == "__main__":
    main()
