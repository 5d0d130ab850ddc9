"""`aioworker bench`: measure the engine beside a baseline from the same run, print a table, and
optionally append it, dated, to docs/benchmarks.md."""

from __future__ import annotations

import argparse

from aioworker.cli.bench_alone import RUNS as ALONE
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
    if args.workload and len(args.workload) == 1 and args.workload[0] in ALONE:
        return ALONE[args.workload[0]](args)
    if args.workload and set(ALONE) & set(args.workload):
        *others, last = ALONE
        return fail(f"run --workload {', '.join(others)} or {last} on its own")
    return run_offline(args)


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
    from aioworker.bench.report import format_table, publish
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
    publish(args.record, "Offline engine vs transformers generate", table, notes)
    return 0
