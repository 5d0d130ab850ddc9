"""Run the GPU workloads and format their tables (used by `aioworker bench --workload w1|w5|w6|w7`)."""

from __future__ import annotations

import statistics

from aioworker.bench import gpu, gpu_prefix, gpu_reference
from aioworker.bench.report import format_table
from aioworker.bench.step_timeline import StepTimeline
from aioworker.checkpoint.model_config import load_model_config


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


# W1 runs this many times in each variant, alternating; the table gives medians.
W1_REPEATS = 3
# name -> (logprobs, prefix caching)
W1_VARIANTS = {
    "aioworker": (None, True),
    "aioworker, logprobs=5": (5, True),
    "aioworker, prefix caching off": (None, False),
}


def run_w1(limits: gpu.Limits, candidate: dict | None = None) -> tuple[str, str]:
    if candidate:
        return run_w1_candidate(limits, candidate)
    cfg = load_model_config(gpu.QWEN3_06B)
    engine = gpu.make_engine(gpu.QWEN3_06B, 2048)
    runs: dict[str, list[float]] = {name: [] for name in W1_VARIANTS}
    breakdowns: list[str] = []  # the plain runs', in order
    for _ in range(W1_REPEATS):
        for name, (logprobs, cached) in W1_VARIANTS.items():
            gpu_prefix.set_prefix_caching(engine, cached)
            timeline = StepTimeline(engine)  # every variant, so that each pays its few us
            tokens_per_s, total = gpu.w1_tokens_per_s(engine, logprobs, timeline)
            runs[name].append(tokens_per_s)
            if name == "aioworker":
                breakdowns.append(timeline.summary())
    gpu.free(engine)
    median = {name: statistics.median(values) for name, values in runs.items()}
    rows = [[name, f"{median[name]:,.0f}", listed_runs(runs[name]), f"{total:,}"] for name in runs]
    header = ["W1 (nano-vllm, Qwen3-0.6B)", "output tok/s (median)", "runs", "output tokens"]
    plain = median["aioworker"]
    notes = (
        f"Logprobs cost {1 - median['aioworker, logprobs=5'] / plain:.1%} of the throughput; "
        f"prefix caching on (nothing to share; the cache reset before each run) against off: "
        f"{plain / median['aioworker, prefix caching off'] - 1:+.1%} ({W1_REPEATS} runs each, "
        f"alternating). Copy bandwidth {limits.copy_bytes_per_s / 1e12:.2f} TB/s, bf16 matmul "
        f"{limits.matmul_flop_per_s / 1e12:.0f} TFLOP/s in this run; KV bytes per token "
        f"{gpu.kv_bytes_per_token(cfg):,}. Where the last plain run's time went, by kind of "
        f"step (host: the engine thread scheduling and taking results; waiting: on the "
        f"executor, the device's step and the executor thread's work): {breakdowns[-1]}. "
        f"The first run on the new engine, for what it pays to warm up: {breakdowns[0]}."
    )
    return format_table(header, rows), notes


def run_w1_candidate(limits: gpu.Limits, candidate: dict) -> tuple[str, str]:
    """W1 on the defaults against the defaults with `candidate`'s settings. Settings such as
    device.pdl shape what the graphs capture, so each side is an engine of its own: the two do
    not fit in memory together, so the runs cannot alternate; the defaults run first. The
    defaults' first and last runs' breakdowns are printed as the plain W1 prints them, so that a
    call measuring a candidate also shows where the defaults' time went."""
    runs: dict[str, list[float]] = {}
    breakdowns: list[str] = []  # the defaults' runs', in order
    for name, settings in (("defaults", {}), ("candidate", candidate)):
        engine = gpu.make_engine(gpu.QWEN3_06B, 2048, **settings)
        runs[name] = []
        for _ in range(W1_REPEATS):
            timeline = StepTimeline(engine)
            runs[name].append(gpu.w1_tokens_per_s(engine, timeline=timeline)[0])
            if name == "defaults":
                breakdowns.append(timeline.summary())
        gpu.free(engine)
    median = {name: statistics.median(values) for name, values in runs.items()}
    rows = [[name, f"{median[name]:,.0f}", listed_runs(runs[name])] for name in runs]
    header = ["W1 (nano-vllm, Qwen3-0.6B)", "output tok/s (median)", "runs"]
    named = ", ".join(f"{key}={value}" for key, value in candidate.items())
    notes = (
        f"Defaults: this commit's defaults; candidate: the defaults with {named}; "
        f"candidate / defaults = {median['candidate'] / median['defaults']:.3f}. "
        f"{W1_REPEATS} runs each on an engine of its own, the defaults first. Copy bandwidth "
        f"{limits.copy_bytes_per_s / 1e12:.2f} TB/s in this run. Where the defaults' last run's "
        f"time went, by kind of step (host: the engine thread scheduling and taking results; "
        f"waiting: on the executor): {breakdowns[-1]}. Their first run, for what it pays to "
        f"warm up: {breakdowns[0]}."
    )
    return format_table(header, rows), notes


def run_w6(limits: gpu.Limits) -> tuple[str, str]:
    engine = gpu.make_engine(gpu.LLAMA_8B, 2304)
    off = gpu_prefix.w6_shared_prefix(engine, cached=False)
    on = gpu_prefix.w6_shared_prefix(engine, cached=True)
    gpu.free(engine)
    rows = [
        ["prefix caching off", f"{off.output_tokens_per_s:,.0f}", f"{off.mean_ttft_s:.2f}"],
        ["prefix caching on", f"{on.output_tokens_per_s:,.0f}", f"{on.mean_ttft_s:.2f}"],
    ]
    header = ["W6 (512 x 2,048 shared + 32, Llama-3.1-8B)", "output tok/s", "mean TTFT s"]
    notes = (
        f"Caching on: {on.output_tokens_per_s / off.output_tokens_per_s:.1f}x the output tokens/s "
        f"(goal 4x), mean time to first token {off.mean_ttft_s / on.mean_ttft_s:.1f}x lower "
        f"(goal 5x). One run each, off first; {on.num_output_tokens:,} output tokens."
    )
    return format_table(header, rows), notes


# W7 runs at the scheduler's default cap, as every workload here. (A cap of 1,024, which fits
# every sample at once, was measured on 2026-11-30 and gave a lower ratio: docs/benchmarks.md.)
W7_MAX_NUM_SEQS = (256,)


def run_w7(limits: gpu.Limits) -> tuple[str, str]:
    rows, ratios = [], []
    for max_num_seqs in W7_MAX_NUM_SEQS:
        engine = gpu.make_engine(gpu.QWEN3_06B, 1024, **{"scheduler.max_num_seqs": max_num_seqs})
        off = gpu_prefix.w7_grpo(engine, parallel=False)
        on = gpu_prefix.w7_grpo(engine, parallel=True)
        gpu.free(engine)
        ratios.append(f"{on.output_tokens_per_s / off.output_tokens_per_s:.2f}x at {max_num_seqs}")
        for name, served in (("1,024 requests, caching off", off), ("64 x n=16, caching on", on)):
            rows.append([
                f"{name}, max_num_seqs {max_num_seqs}",
                f"{served.output_tokens_per_s:,.0f}",
                f"{served.mean_ttft_s:.2f}",
            ])  # fmt: skip
    header = ["W7 (GRPO-like, 64 x 512 in, 256 out, Qwen3-0.6B)", "output tok/s", "mean TTFT s"]
    notes = (
        f"n=16 with caching against independent requests without it: {', '.join(ratios)} "
        f"(goal 1.5x). One run each; {on.num_output_tokens:,} output tokens."
    )
    return format_table(header, rows), notes


def listed_runs(values: list[float]) -> str:
    return ", ".join(f"{v:,.0f}" for v in values)
