"""`aioworker bench`'s workloads that run on their own (`--workload NAME` alone): each measures
one part of the service beside a baseline from the same run, prints its table and, with
--record, appends it dated to the document."""

from __future__ import annotations

import argparse

from aioworker.bench.report import format_table, publish
from aioworker.cli.common import config_from_args, fail
from aioworker.config import ConfigError


def run_control_plane(args: argparse.Namespace) -> int:
    from aioworker.bench import control_plane

    result = control_plane.run()
    ours, event, poll = result["latency"], result["echo_event"], result["echo_poll"]
    rows = [
        ["aioworker (fake executor)", f"{ours.p50_ms:.3f}", f"{ours.p99_ms:.3f}"],
        ["echo, waits on socket (floor)", f"{event.p50_ms:.3f}", f"{event.p99_ms:.3f}"],
        ["echo, polls with 1 ms sleep (classic)", f"{poll.p50_ms:.3f}", f"{poll.p99_ms:.3f}"],
    ]
    table = format_table(["submit -> first output", "p50 ms", "p99 ms"], rows)
    notes = (
        f"Requests/s ingested (burst of 20,000, one token each, submit to terminal output): "
        f"{result['requests_per_s']:,.0f}. Driver loop time per step at "
        f"{result['num_running']} running requests (scheduling, plan, outputs; no model): "
        f"{result['loop_us_per_step'] / 1000:.3f} ms wall, "
        f"{result['loop_cpu_us_per_step'] / 1000:.3f} ms of the loop thread's CPU."
    )
    publish(args.record, "Control plane (fake executor, loopback ipc)", table, notes)
    return 0


def run_api(args: argparse.Namespace) -> int:
    import statistics

    from aioworker.bench import api

    runs = api.run()
    median = {key: statistics.median(values) for key, values in runs.items()}

    def listed(key: str, form: str) -> str:
        return ", ".join(format(v, form) for v in runs[key])

    rows = [
        [
            "first token p50, ms (1 token, one at a time)",
            f"{median['raw_ms']:.3f} ({listed('raw_ms', '.3f')})",
            f"{median['api_ms']:.3f} ({listed('api_ms', '.3f')})",
            f"+{median['api_ms'] - median['raw_ms']:.3f} ms",
        ],
        [
            f"streamed requests/s ({api.STREAM_TOKENS} tokens, {api.CONCURRENCY} connections)",
            f"{median['raw_rps']:,.0f} ({listed('raw_rps', ',.0f')})",
            f"{median['api_rps']:,.0f} ({listed('api_rps', ',.0f')})",
            f"{median['api_rps'] / median['raw_rps']:.2f}x",
        ],
    ]
    header = ["fake executor, loopback", "raw client (runs)", "HTTP gateway (runs)", "gateway"]
    table = format_table(header, rows)
    notes = (
        f"Medians of {api.REPEATS} runs per side, alternating. The gateway: one `aioworker api` "
        "process; the load: a lean keep-alive HTTP client reading the server-sent events; both "
        "sides and the worker share this machine's cores. The fake worker steps as fast as it "
        "can; outputs of one request that arrive while the gateway is still writing are sent in "
        "one write (every token still reaches the client, as its own event)."
    )
    publish(args.record, "HTTP gateway against the raw client (fake executor)", table, notes)
    return 0


def run_chat(args: argparse.Namespace) -> int:
    from aioworker.bench import chat_turns
    from aioworker.engine import LLMEngine

    try:
        engine = LLMEngine.from_config(config_from_args(args))
    except (ConfigError, ValueError) as exc:
        return fail(str(exc))
    with engine:
        runs = chat_turns.run(engine)
        system = [{"role": "system", "content": chat_turns.SYSTEM}]
        num_system = len(engine.tokenizer.encode_chat(system))
    off, on = chat_turns.medians(runs[False]), chat_turns.medians(runs[True])
    rows = [
        [
            f"turn {turn + 1}",
            f"{off[turn] * 1e3:.1f}",
            f"{on[turn] * 1e3:.1f}",
            f"{off[turn] / on[turn]:.1f}x",
        ]
        for turn in range(len(off))
    ]
    table = format_table(["4-turn chat, TTFT ms", "caching off", "caching on", "speed-up"], rows)
    turn4 = ", ".join(
        f"{r[-1] * 1e3:.1f}/{c[-1] * 1e3:.1f}" for r, c in zip(runs[False], runs[True], strict=True)
    )
    notes = (
        f"Medians of {chat_turns.REPEATS} conversations per side, alternating (turn 4, off/on, "
        f"each run: {turn4} ms). A system prompt of {num_system} tokens, greedy replies of up to "
        f"{chat_turns.REPLY.max_tokens} tokens added to the history."
    )
    publish(args.record, "Prefix caching: a 4-turn chat (embedded model)", table, notes)
    return 0


def run_serve(args: argparse.Namespace) -> int:
    from aioworker.bench import serving
    from aioworker.cli.serve import worker_config_argv
    from aioworker.engine import LLMEngine

    try:
        config = config_from_args(args)
    except ConfigError as exc:
        return fail(str(exc))
    for name in ("tp", "dp"):
        setattr(args, name, None)  # one rank: what the offline baseline runs
    with LLMEngine.from_config(config) as engine:
        tokenizer = engine.tokenizer
        dtype = engine.loaded.dtype
        offline = serving.run_offline(engine, tokenizer)
    runs = serving.run_serving(worker_config_argv(args), tokenizer, ["completions", "chat"])
    header, rows, notes = serving.report(runs, offline)
    table = format_table(header, rows)
    publish(args.record, f"Serving on the CPU, {dtype}", table, notes)
    return 0


def run_spec(args: argparse.Namespace) -> int:
    import msgspec

    from aioworker.bench import speculation
    from aioworker.config import SpeculativeOptions
    from aioworker.engine import LLMEngine

    try:
        config = config_from_args(args)
        if config.device.kind != "cpu" and _has_cuda():
            return run_spec_gpu(args.record)
        if not config.speculative.method:
            ngram = SpeculativeOptions(method="ngram", num_tokens=4)
            config = msgspec.structs.replace(config, speculative=ngram)
        engine = LLMEngine.from_config(config)
    except (ConfigError, ValueError) as exc:
        return fail(str(exc))
    with engine:
        result = speculation.run(engine)
    tables, notes = speculation.tables(result, config.speculative)
    title = "Speculative decoding, n-gram (embedded model)"
    publish(args.record, title, "\n\n".join(tables), notes)
    return 0


def run_spec_gpu(record: str | None) -> int:
    from aioworker.bench import gpu_spec

    for title, measure in (
        ("Speculative decoding: the verify step (GPU)", gpu_spec.verify_cost),
        ("Speculative decoding: a 2-layer self-draft's costs (GPU)", gpu_spec.self_draft_cost),
        ("Speculative decoding: projections at 1 and 5 rows (GPU)", gpu_spec.projection_rows_cost),
        ("Speculative decoding never slower (GPU)", gpu_spec.never_slower),
    ):
        table, notes = measure()
        publish(record, title, table, notes)
    return 0


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def run_quant(args: argparse.Namespace) -> int:
    import msgspec

    from aioworker.bench import quantization
    from aioworker.engine import LLMEngine

    try:
        config = config_from_args(args)
    except ConfigError as exc:
        return fail(str(exc))

    def make_engine(fmt: str, dtype: str) -> LLMEngine:
        model = msgspec.structs.replace(config.model, quantization=fmt, dtype=dtype)
        return LLMEngine.from_config(msgspec.structs.replace(config, model=model), False)

    try:
        rates, weight_bytes = quantization.run(make_engine)
    except (ConfigError, ValueError) as exc:
        return fail(str(exc))
    table = quantization.table(rates, weight_bytes)
    notes = (
        f"Each variant loaded alone, in turn (order reversed every repeat); "
        f"{quantization.DECODE_TOKENS} greedy tokens a request; medians of "
        f"{quantization.REPEATS} runs. Quantized: the decoder's projections, weight-only, their "
        "products in bfloat16; the LM head dense, in the model's dtype."
    )
    publish(args.record, "Quantized weights on the CPU", table, notes)
    return 0


def run_guided(args: argparse.Namespace) -> int:
    from aioworker.bench import guided
    from aioworker.engine import LLMEngine

    try:
        engine = LLMEngine.from_config(config_from_args(args))
    except (ConfigError, ValueError) as exc:
        return fail(str(exc))
    with engine:
        if engine.loaded.grammars is None:
            return fail(f"{engine.loaded.model_dir} has no tokenizer.json: nothing to guide with")
        on_gpu = engine.loaded.device.startswith("cuda")
        results, compile_ms = guided.run(engine, (1, 64) if on_gpu else (8,))
        where = f"{engine.loaded.model_dir.name}, {engine.loaded.device}, {engine.loaded.dtype}"
    table, notes = guided.table(results, compile_ms, where)
    publish(args.record, "Guided decoding: per-step cost", table, notes)
    return 0


def run_expert_parallel(args: argparse.Namespace) -> int:
    from aioworker.bench import moe_parallel

    table, notes = moe_parallel.run()
    publish(args.record, "MoE experts across two CPU ranks (ep)", table, notes)
    return 0


# In the order `--help` lists them.
RUNS = {
    "control": run_control_plane,
    "api": run_api,
    "chat": run_chat,
    "serve": run_serve,
    "spec": run_spec,
    "quant": run_quant,
    "guided": run_guided,
    "ep": run_expert_parallel,
}
