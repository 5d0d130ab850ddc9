"""Where a decode step's time goes on the GPU: wall time per step, kernels launched per step and
their GPU time, the top kernels, and the host-side split (scheduler vs executor).

    python tools/profile_step.py [--model qwen3-0.6b|llama-3.1-8b] [--batch 1]
        [--prompt-tokens 1024] [--quantization fp8] [--small-batch-kernels]
        [--set device.pdl=true ...]

W1's large decode steps are about --batch 200 --prompt-tokens 800 on qwen3-0.6b (docs/
benchmarks.md, "Where W1's time goes").

    python tools/profile_step.py --prefill-host [--batch 256] [--prompt-tokens 560]

instead profiles W1-sized prefill steps, whose executor launch took 28-47 ms on an H100
(docs/benchmarks.md, 2026-12-07): over one batch of `--batch` prompts each,
  - cProfile of the launches, the functions by their own and by cumulative time (Python 3.12's
    cProfile sees every thread, so the engine thread's scheduling shows there too);
  - the launches timed with no profiler;
  - torch's profiler: the GPU's kernel time a prefill step against the launch's, the host calls
    by their own time (a blocking CUDA call shows there) and the kernels by device time.
A first batch of as many prompts (others: none is cached) runs before, so that compiles are not
counted; every batch asks for one token, so its steps are all prefill.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import pstats
import random
import time

import torch
from torch.profiler import ProfilerActivity, profile

from aioworker.bench.gpu import MODELS, make_engine, random_prompt
from aioworker.bench.gpu_spec import replay_ms
from aioworker.cli.common import parse_settings
from aioworker.compute.layers import pdl
from aioworker.core.sampling_params import SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="qwen3-0.6b")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--prompt-tokens", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--quantization", default="none")
    parser.add_argument("--small-batch-kernels", action="store_true")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="any config key"
    )
    parser.add_argument("--prefill-host", action="store_true", help="see the module's doc")
    args = parser.parse_args()
    engine = make_engine(
        MODELS / args.model,
        4096,
        **{
            "model.quantization": args.quantization,
            "device.small_batch_kernels": args.small_batch_kernels,
            **parse_settings(args.set, "--set"),
        },
    )
    if args.prefill_host:
        return profile_prefill_launches(engine, args.batch, args.prompt_tokens)
    rng = random.Random(0)
    params = SamplingParams(temperature=0.0, max_tokens=10_000, ignore_eos=True)
    for _ in range(args.batch):
        engine.add_request(random_prompt(args.prompt_tokens, 10000, rng), params)
    seqs = engine.scheduler.seqs.values
    while any(s.num_uncomputed_tokens > 1 for s in seqs()):  # the prefill, in its steps
        engine.step()
    for _ in range(3):  # warm-up decodes
        engine.step()
    schedule_s = execute_s = update_s = 0.0
    started = time.perf_counter()
    for _ in range(args.steps):
        t0 = time.perf_counter()
        plan = engine.scheduler.schedule()
        t1 = time.perf_counter()
        result = engine.executor.submit(plan).result()
        t2 = time.perf_counter()
        engine.scheduler.update(plan, result)
        t3 = time.perf_counter()
        schedule_s, execute_s, update_s = (
            schedule_s + t1 - t0,
            execute_s + t2 - t1,
            update_s + t3 - t2,
        )
    wall = (time.perf_counter() - started) / args.steps
    n = args.steps
    print(
        f"{args.model} batch {args.batch}: {wall * 1e3:.3f} ms/step; schedule {schedule_s / n * 1e3:.3f} ms, executor {execute_s / n * 1e3:.3f} ms, update {update_s / n * 1e3:.3f} ms"
    )

    graph_ms = engine.executor.call(lambda: graph_replay_ms(engine, args.batch)).result()
    if graph_ms is not None:
        print(f"the decode graph alone: {graph_ms:.3f} ms a replay (CUDA events, no host work)")

    def steps() -> None:
        for _ in range(args.steps):
            plan = engine.scheduler.schedule()
            engine.scheduler.update(plan, engine.executor.submit(plan).result())

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        engine.executor.call(lambda: None).result()
        steps()
        torch.cuda.synchronize()
    kernels = sum(
        e.count
        for e in prof.key_averages()
        if getattr(e, "device_time_total", 0) > 0 and e.cpu_time_total == 0
    )
    total_gpu_us = sum(getattr(e, "self_device_time_total", 0) for e in prof.key_averages())
    print(
        f"GPU time per step {total_gpu_us / n / 1e3:.3f} ms; kernels per step (approx) {kernels / n:.0f}"
    )
    print(prof.key_averages().table(sort_by="self_device_time_total", row_limit=15))
    if pdl.switched_on():
        print(
            "device.pdl is on: a kernel launched with PDL starts before the one ahead of it ends "
            "and waits inside (griddepcontrol.wait), so its time above includes that wait and "
            "the kernels' sum can exceed the wall time. For kernel costs: --set device.pdl=false"
        )
    engine.close()


def graph_replay_ms(engine, batch: int, replays: int = 20) -> float | None:
    """The device time of the decode graph that serves `batch` sequences, replayed alone with
    its last inputs (it writes the same KV slots again), between two CUDA events on the
    executor's stream; None where such a batch runs eagerly. Run on the executor thread."""
    graphs = engine.executor.runner.graphs
    if graphs is None or batch > graphs.max_batch:
        return None
    return replay_ms(graphs.graphs[graphs.size_for(batch)], replays)


def profile_prefill_launches(engine, batch: int, prompt_tokens: int) -> None:
    """The prefill steps' launches of four batches of `batch` prompts: the first compiles,
    then cProfile, no profiler, torch's profiler (see the module's doc)."""
    runner = engine.core.executor.runner
    launch, launches = runner.launch, []
    rng = random.Random(0)
    params = SamplingParams(temperature=0.6, max_tokens=1, ignore_eos=True)

    def run_batch(around) -> list[float]:
        """One batch, each launch inside `around` (a context manager factory) and timed."""
        launches.clear()

        def timed(plan):
            started = time.perf_counter()
            with around():
                handle = launch(plan)
            launches.append(time.perf_counter() - started)
            return handle

        runner.launch = timed
        try:
            engine.generate(
                [random_prompt(prompt_tokens, 10000, rng) for _ in range(batch)], params
            )
        finally:
            del runner.launch
        return list(launches)

    run_batch(contextlib.nullcontext)
    profiler = cProfile.Profile()
    profiled = run_batch(lambda: profiler)
    plain = run_batch(contextlib.nullcontext)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        traced = run_batch(contextlib.nullcontext)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    print(
        f"{len(plain)} prefill launches a batch: {_ms(plain)} ms each with no profiler, "
        f"{_ms(profiled)} under cProfile, {_ms(traced)} under torch's profiler"
    )
    events = prof.key_averages()
    device_us = sum(getattr(e, "self_device_time_total", 0) for e in events)
    print(f"GPU kernel time a prefill step: {device_us / len(traced) / 1e3:.2f} ms")
    for order in ("tottime", "cumulative"):
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats(order).print_stats(20)
        print(text.getvalue())
    print(events.table(sort_by="self_cpu_time_total", row_limit=25))
    print(events.table(sort_by="self_device_time_total", row_limit=20))
    engine.close()


def _ms(seconds: list[float]) -> str:
    return f"{1e3 * sum(seconds) / max(len(seconds), 1):.2f}"


if __name__ == "__main__":
    main()
