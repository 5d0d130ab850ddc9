"""`aioworker bench`: measure the engine beside a baseline from the same run, print a table, and
optionally append it, dated, to docs/benchmarks.md."""

from __future__ import annotations

import argparse

from aioworker.cli.bench_gpu import W4_FORMATS, W4_MODELS, run_gpu_workloads
from aioworker.cli.common import add_config_arguments, config_from_args, fail
from aioworker.config import ConfigError

CPU_WORKLOADS = ("b1", "c16")
GPU_WORKLOADS = ("w1", "w4", "w5", "w6", "w7", "w8", "w9", "moe")
WORKLOAD_HELP = (
    "b1: batch-1 decode tokens/s; c16: 16 concurrent 64-in/64-out requests (both against "
    "transformers, the default); control: the control plane alone, with an executor that "
    "returns at once, against echo baselines; api: the HTTP gateway against the raw client, "
    "fake executor; chat: a 4-turn chat, prefix caching on against off (embedded model, CPU); "
    "serve: the whole service under a streamed load, quiet and beside a busy process, against "
    "the offline engine (CPU; --dtype picks the precision); spec: speculative decoding on "
    "against off, a copy-heavy task at batch 1 and questions at concurrency 1 to 256 (n-gram, "
    "k=4 unless [speculative] says otherwise); quant: model.quantization none, wint8 and wint4, "
    "each in float32 and bfloat16, side by side at batch 1 and 16 (CPU); w1, w5, w6, w7: "
    "the GPU workloads of docs/benchmarks.md; w4: batch-1 decode beside its weight-read floor "
    "with the small-batch kernels off and on (bf16, fp8, wint8, wint4: --w4-formats); w8: quantized formats beside bf16 (GPU); w9: a "
    "multi-turn chat (128 users x 8 turns, Llama-3.1-8B shape, device KV a quarter of the "
    "working set) with the host KV tier off against on, the tier's copy rates beside plain "
    "pinned copies, and W1 with the tier on against off (GPU); moe: the fused expert kernel "
    "against the "
    "per-expert loop, batch-1 decode beside its floor on the Qwen3-30B-A3B and ERNIE-4.5-21B-A3B "
    "shapes, and W1 on Qwen3-30B-A3B beside dense Qwen3-8B (GPU); "
    "guided: a 10-field JSON schema against the same requests unguided, per-step time and "
    "compile times (batch 8 on the CPU; 1 and 64 on a GPU, where --set model.path gives a "
    "directory with config.json and tokenizer.json, and model.load_format=dummy); ep: a MoE "
    "model's experts split across two CPU ranks both ways (expert_parallel_size 1 and 2)"
)
ALONE = ("control", "api", "chat", "serve", "spec", "quant", "guided", "ep")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--workload",
        action="append",
        choices=[*CPU_WORKLOADS, *ALONE, *GPU_WORKLOADS],
        help=WORKLOAD_HELP,
    )
    parser.add_argument(
        "--no-reference", action="store_true", help="GPU workloads: skip the transformers baseline"
    )
    parser.add_argument(
        "--w9-users",
        type=int,
        default=128,
        metavar="N",
        help="GPU workload w9: this many users (default 128, the issue's; fewer run faster)",
    )
    parser.add_argument(
        "--w4-formats",
        default=",".join(W4_FORMATS),
        metavar="LIST",
        help="GPU workload w4: the weight formats to measure, comma-separated (default: all four; "
        "wint4 in groups of 128 inputs, the issue's format)",
    )
    parser.add_argument(
        "--w4-models",
        default="",
        metavar="LIST",
        help="GPU workload w4: only these models, comma-separated "
        f"({', '.join(W4_MODELS)}; default: both)",
    )
    parser.add_argument(
        "--w4-repeats",
        type=int,
        default=1,
        metavar="N",
        help="GPU workload w4: measure each side N times in alternating order and report "
        "medians (default 1; 3 to decide whether a candidate pays)",
    )
    parser.add_argument(
        "--candidate",
        "--w4-candidate",
        dest="candidate",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="GPU workloads w4 and w1: measure the defaults against the defaults with this "
        "setting (repeatable; e.g. device.pdl=true); w4 otherwise measures the small-batch "
        "kernels off against on",
    )
    parser.add_argument(
        "--record",
        metavar="FILE",
        help="append the table, dated, to FILE (e.g. docs/benchmarks.md)",
    )
    add_config_arguments(parser)


def run(args: argparse.Namespace) -> int:
    if args.workload and all(w in GPU_WORKLOADS for w in args.workload):
        return run_gpu_workloads(args)
    if args.workload == ["control"]:
        return run_control_plane(args.record)
    if args.workload == ["api"]:
        return run_api(args.record)
    if args.workload == ["chat"]:
        return run_chat(args)
    if args.workload == ["serve"]:
        return run_serve(args)
    if args.workload == ["spec"]:
        return run_spec(args)
    if args.workload == ["quant"]:
        return run_quant(args)
    if args.workload == ["guided"]:
        return run_guided(args)
    if args.workload == ["ep"]:
        return run_expert_parallel(args)
    if args.workload and set(ALONE) & set(args.workload):
        return fail(
            "run --workload control, api, chat, serve, spec, quant, guided or ep on its own"
        )
    return run_offline(args)


def run_expert_parallel(args: argparse.Namespace) -> int:
    from aioworker.bench import moe_parallel
    from aioworker.bench.report import append_to_doc

    table, notes = moe_parallel.run()
    print(table, notes, sep="\n")
    if args.record:
        append_to_doc(args.record, "MoE experts across two CPU ranks (ep)", table, notes)
    return 0


def run_control_plane(record: str | None) -> int:
    from aioworker.bench import control_plane
    from aioworker.bench.report import append_to_doc, format_table

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
    print(table)
    print(notes)
    if record:
        append_to_doc(record, "Control plane (fake executor, loopback ipc)", table, notes)
    return 0


def run_api(record: str | None) -> int:
    import statistics

    from aioworker.bench import api
    from aioworker.bench.report import append_to_doc, format_table

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
    print(table, notes, sep="\n")
    if record:
        append_to_doc(record, "HTTP gateway against the raw client (fake executor)", table, notes)
    return 0


def run_chat(args: argparse.Namespace) -> int:
    from aioworker.bench import chat_turns
    from aioworker.bench.report import append_to_doc, format_table
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
    print(table, notes, sep="\n")
    if args.record:
        append_to_doc(args.record, "Prefix caching: a 4-turn chat (embedded model)", table, notes)
    return 0


def run_spec(args: argparse.Namespace) -> int:
    import msgspec

    from aioworker.bench import speculation
    from aioworker.bench.report import append_to_doc
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
    print(*tables, notes, sep="\n\n")
    if args.record:
        append_to_doc(
            args.record, "Speculative decoding, n-gram (embedded model)", "\n\n".join(tables), notes
        )
    return 0


def run_quant(args: argparse.Namespace) -> int:
    import msgspec

    from aioworker.bench import quantization
    from aioworker.bench.report import append_to_doc
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
    print(table, notes, sep="\n\n")
    if args.record:
        append_to_doc(args.record, "Quantized weights on the CPU", table, notes)
    return 0


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def run_guided(args: argparse.Namespace) -> int:
    from aioworker.bench import guided
    from aioworker.bench.report import append_to_doc
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
    print(table, notes, sep="\n\n")
    if args.record:
        append_to_doc(args.record, "Guided decoding: per-step cost", table, notes)
    return 0


def run_spec_gpu(record: str | None) -> int:
    from aioworker.bench import gpu_spec
    from aioworker.bench.report import append_to_doc

    for title, measure in (
        ("Speculative decoding: the verify step (GPU)", gpu_spec.verify_cost),
        ("Speculative decoding: a 2-layer self-draft's costs (GPU)", gpu_spec.self_draft_cost),
        ("Speculative decoding: projections at 1 and 5 rows (GPU)", gpu_spec.projection_rows_cost),
        ("Speculative decoding never slower (GPU)", gpu_spec.never_slower),
    ):
        table, notes = measure()
        print(table, notes, sep="\n", flush=True)
        if record:
            append_to_doc(record, title, table, notes)
    return 0


def run_serve(args: argparse.Namespace) -> int:
    from aioworker.bench import serving
    from aioworker.bench.report import append_to_doc, format_table
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
    print(table, notes, sep="\n")
    if args.record:
        append_to_doc(args.record, f"Serving on the CPU, {dtype}", table, notes)
    return 0


def run_offline(args: argparse.Namespace) -> int:
    try:
        config = config_from_args(args)
    except ConfigError as exc:
        return fail(str(exc))
    try:
        import transformers  # noqa: F401
    except ImportError:
        return fail("the baseline needs transformers: pip install -e '.[dev]'")
    from aioworker.bench import cpu_offline
    from aioworker.bench.report import append_to_doc, format_table
    from aioworker.compute.build_rank import _DTYPES
    from aioworker.engine import LLMEngine

    engine = LLMEngine.from_config(config)
    vocab_size = engine.loaded.vocab_size
    workloads = args.workload or list(CPU_WORKLOADS)
    with engine:
        ours = cpu_offline.OursRunner(engine)
        # Ours first, then the baseline: running transformers first was seen to slow what ran
        # after it in the same process, which would flatter neither side consistently.
        ours_rates = {name: cpu_offline.WORKLOADS[name](ours, vocab_size) for name in workloads}
        reference = cpu_offline.TransformersRunner(
            engine.loaded.model_dir, _DTYPES[engine.loaded.dtype]
        )
        rows = [
            cpu_offline.Row(
                name, ours_rates[name], cpu_offline.WORKLOADS[name](reference, vocab_size)
            )
            for name in workloads
        ]
        agree = cpu_offline.same_tokens(ours, reference, vocab_size)
    header = ["workload", "aioworker tok/s", "transformers tok/s", "ratio"]
    table = format_table(
        header,
        [[r.workload, f"{r.ours:.1f}", f"{r.reference:.1f}", f"{r.ratio:.2f}x"] for r in rows],
    )
    notes = (
        f"Model {engine.loaded.model_dir.name}, dtype {engine.loaded.dtype}, greedy. "
        f"Greedy tokens identical to transformers on 4 prompts x 16 tokens: {'yes' if agree else 'NO'}."
    )
    print(table)
    print(notes)
    if args.record:
        append_to_doc(args.record, "Offline engine vs transformers generate", table, notes)
    return 0
