"""Tile sweep for the small-rows product kernels (compute/layers/gemv/) on the GPU: for each
projection shape of the W4 models and each weight format, candidate tilings are timed against
the product the format's own method computes (the path the kernels replace: cuBLAS, fp8's
`_scaled_mm`, wint8's dequantize-then-GEMM, wint4's tinygemm), with the device's copy bandwidth
measured in the same run. Each layer is built by the format's real linear method, so the
kernels read what a loaded model holds. GPU only (`--smoke` runs two tiny shapes on the CPU
under TRITON_INTERPRET=1, to check the tool itself).

Timing: a CUDA graph runs the product over enough copies of the layer that they do not fit in
L2, back to back, as a decode step's layers do; time per product = graph time / copies.
Rows: one row sweeps every candidate; 8 rows times the best dot tilings of one row and the rule.

    python tools/gemv_tune.py --json $OUT/gemv_tune.json [--budget-s 360] [--write-table]
                              [--refine] [--pdl]

--write-table writes the winners to compute/layers/gemv/tuned_tiles.json, the table the method
reads: per shape, format, gating and row class, the best tiles, or null where the format's own
product was faster. Keys the sweep did not reach keep the entry they had.

--refine tries, per key, only the table's tiles and their neighbours (splits and channels per
program halved and doubled, K per step halved and doubled, each option of the format toggled),
and the rule's: a fraction of the full sweep's candidates, for a short GPU session after a
kernel change.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import torch
from torch import nn
from triton.runtime.errors import OutOfResources

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gemv_candidates import candidates, refined  # noqa: E402

from aioworker.compute.layers import pdl  # noqa: E402
from aioworker.compute.layers.gemv import method as small_rows  # noqa: E402
from aioworker.compute.layers.gemv.choice import (  # noqa: E402
    TABLE_PATH,
    format_of,
    gpu_table_path,
    rule_tiles,
    table_key,
    table_path,
)
from aioworker.compute.layers.linear_method import UNQUANTIZED  # noqa: E402
from aioworker.compute.layers.ops import silu_and_mul  # noqa: E402
from aioworker.compute.layers.quantized.fp8 import FP8  # noqa: E402
from aioworker.compute.layers.quantized.weight_only import Int4OnLoad, Int8OnLoad  # noqa: E402

METHODS = {"none": UNQUANTIZED, "fp8": FP8, "wint8": Int8OnLoad(), "wint4": Int4OnLoad()}
COPY_TARGET_BYTES = 1 << 30  # the copies of a layer a graph cycles through: well past L2

# (model, projection) -> (output channels, K, gated, formats): W4's goals' models and formats
# (the LM head is bf16 unless model.quantize_lm_head has the format read a quantized copy).
SHAPES = {
    ("llama-3.1-8b", "gate_up"): (28672, 4096, True, ("none", "fp8", "wint8", "wint4")),
    ("llama-3.1-8b", "down"): (4096, 14336, False, ("none", "fp8", "wint8", "wint4")),
    ("llama-3.1-8b", "qkv"): (6144, 4096, False, ("none", "fp8", "wint8", "wint4")),
    ("llama-3.1-8b", "o"): (4096, 4096, False, ("none", "fp8", "wint8", "wint4")),
    ("llama-3.1-8b", "lm_head"): (128256, 4096, False, ("none", "fp8", "wint8", "wint4")),
    ("qwen3-0.6b", "gate_up"): (6144, 1024, True, ("none", "wint4")),
    ("qwen3-0.6b", "down"): (1024, 3072, False, ("none", "wint4")),
    ("qwen3-0.6b", "qkv"): (4096, 1024, False, ("none", "wint4")),
    ("qwen3-0.6b", "o"): (1024, 2048, False, ("none", "wint4")),
    ("qwen3-0.6b", "lm_head"): (151936, 1024, False, ("none", "wint4")),
}
FLAGS = ("a8", "bits", "fold", "wide_x", "prefetch", "words", "blocks", "pipelined", "ahead")
SMOKE_SHAPES = {
    ("smoke", "gate_up"): (2 * 96, 256, True, ("none", "fp8", "wint8", "wint4")),
    ("smoke", "down"): (64, 192, False, ("none", "wint4")),
}


def graph_time_s(fn, copies: int) -> float:
    """Seconds per call of fn(i) for i over the copies, captured in one CUDA graph (on the CPU:
    wall time of one pass, for --smoke)."""
    if not torch.cuda.is_available():
        started = time.perf_counter()
        for i in range(copies):
            fn(i)
        return (time.perf_counter() - started) / copies
    from aioworker.bench.gpu_spec import replay_ms

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(copies):
            fn(i)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(copies):
            fn(i)
    reps = max(3, int(20 / max(replay_ms(graph, 1), 1e-3)))  # about 20 ms of replays
    return min(replay_ms(graph, reps) for _ in range(2)) / 1e3 / copies


def build_layer(method, channels: int, depth: int, device: str) -> nn.Module:
    """A layer as the loader leaves it: dense random weights (scaled like a trained layer's),
    quantized by the method where it quantizes on load, then its derived tensors."""
    layer = nn.Module()
    with torch.device(device):
        method.create_weights(layer, channels, depth)
    fill = lambda dense: dense.normal_(0.0, depth**-0.5)  # noqa: E731
    if hasattr(method, "fill_dummy"):
        method.fill_dummy(layer, fill)
    else:
        fill(layer.weight.data)
    method.process_after_loading(layer)
    return layer


def theirs(method, layer, x, gated):
    y = method.apply(layer, x)
    return silu_and_mul(y) if gated else y


def ours(method, layer, x, gated, tiles):
    from aioworker.compute.layers.gemv.product import small_rows_product

    op = small_rows.OPERANDS[type(method)](layer)
    weight = op.int4_blocks if tiles.blocks else op.weight
    return small_rows_product(x, weight, tiles, op.scale, gated, None, op.int4_groups)


def error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


def sweep_one(channels, depth, gated, fmt, device, deadline, refine=False) -> dict:
    """{rows: {"theirs_s", "timed": [(seconds, tiles), ...] fastest first}} and the bytes read."""
    method = METHODS[fmt]
    first = build_layer(method, channels, depth, device)
    read = method.weight_bytes(first)
    copies = 2 if device == "cpu" else max(2, min(48, -(-COPY_TARGET_BYTES // read)))
    layers = [first] + [build_layer(method, channels, depth, device) for _ in range(copies - 1)]
    sms = 2 if device == "cpu" else torch.cuda.get_device_properties(0).multi_processor_count
    # The table is keyed by what the kernels read, as `tiles_for` keys it.
    operands = small_rows.OPERANDS[type(method)](first)
    group = depth // operands.int4_groups[0].shape[1] if operands.int4_groups else 0
    found = {"bytes": read, "format": format_of(operands.weight.dtype, group)}
    for rows in (1, 8):
        x = torch.randn(rows, depth, device=device)
        want = theirs(method, first, x, gated)
        their_s = graph_time_s(lambda i, x=x: theirs(method, layers[i], x, gated), copies)
        if refine:
            tried = refined(channels, depth, gated, fmt, rows, sms, group)
        elif rows == 1:
            tried = [
                *candidates(channels, depth, gated, True, sms, fmt),
                *candidates(channels, depth, gated, False, sms, fmt),
            ]
        else:
            best_dot = [t for _, t in found[1]["timed"] if t.dot][:3]
            tried = list(dict.fromkeys([*best_dot, rule_tiles(channels, depth, gated, sms)]))
        timed = []
        for tiles in tried:
            if time.monotonic() > deadline:
                break
            try:
                err = error(ours(method, first, x, gated, tiles), want)
            except OutOfResources:  # its pipeline stages need more shared memory than an SM has
                continue
            except ValueError:  # a tiling the product refuses (int4's groups do not nest)
                continue
            except Exception as exc:  # noqa: BLE001 - a variant this Triton cannot compile
                # One failed variant (say, a8 on an older Triton) must not end the sweep.
                print(f"  FAILED {fmt} {channels}x{depth} rows={rows} {tiles}: "
                      f"{type(exc).__name__}: {str(exc).splitlines()[-1][:200]}")  # fmt: skip
                continue
            # Only gross errors: the sides round differently, and fp8's own product quantizes
            # the rows too (3.5% off at these sizes); a wrong kernel is off by ~100%.
            # tests/compute/layers/gemv/ hold the kernels to exact references.
            if err > 0.1:
                print(f"  WRONG {fmt} {channels}x{depth} rows={rows} {tiles}: {err:.3g}")
                continue
            t = graph_time_s(lambda i, x=x, tiles=tiles: ours(method, layers[i], x, gated, tiles),
                             copies)  # fmt: skip
            timed.append((t, tiles))
        timed.sort(key=lambda pair: pair[0])
        found[rows] = {"theirs_s": their_s, "timed": timed}
    if device == "cuda":
        torch.cuda.empty_cache()
    return found


def copy_bytes_per_s(device: str) -> float:
    if device == "cpu":
        return 1e10
    from aioworker.bench import gpu

    return gpu.measure_limits().copy_bytes_per_s  # what W4's floors divide by


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--json", type=Path, required=True,
        help="every shape's times: theirs, and each tiling that ran (fastest first)",
    )  # fmt: skip
    parser.add_argument("--budget-s", type=float, default=360, help="stop timing after this")
    parser.add_argument(
        "--write-table", action="store_true",
        help="write the fastest tiles into the default table, or this GPU's own (choice.py)",
    )  # fmt: skip
    parser.add_argument("--smoke", action="store_true", help="two tiny shapes on the CPU")
    parser.add_argument(
        "--refine", action="store_true", help="only the table's tiles and their neighbours"
    )
    parser.add_argument(
        "--pdl",
        action="store_true",
        help="launch the products with programmatic dependent launch (device.pdl), so that "
        "back-to-back products overlap as a step's do, and try prefetching W while they wait",
    )
    parser.add_argument(
        "--int4-group",
        type=int,
        choices=(32, 64, 128),
        default=32,
        help="wint4's inputs a group (model.int4_group); other than 32, the table's keys name it "
        "(int4g128), and its tiles start from 32's where they fit",
    )
    parser.add_argument(
        "--formats",
        default="none,fp8,wint8,wint4",
        help="the weight formats to sweep, comma-separated (the others keep their entries)",
    )
    parser.add_argument(
        "--shapes",
        default="",
        help="only these shapes, comma-separated: a model (llama-3.1-8b) or a model and its "
        "projection (llama-3.1-8b:qkv); the others keep their entries (default: all)",
    )
    args = parser.parse_args()
    if args.smoke and os.environ.get("TRITON_INTERPRET") != "1":
        parser.error("--smoke runs under Triton's interpreter: set TRITON_INTERPRET=1")
    device = "cpu" if args.smoke else "cuda"
    METHODS["wint4"] = Int4OnLoad(args.int4_group)
    small_rows.INTERPRET_ON_CPU = args.smoke  # so that CPU layers derive int4's blocks too
    pdl.enable(args.pdl and not args.smoke)
    # The model's dtype, as build_model sets it; float16 for --smoke: Triton's interpreter
    # multiplies bf16 tiles wrongly (tl.dot).
    torch.set_default_dtype(torch.float16 if args.smoke else torch.bfloat16)
    deadline = time.monotonic() + args.budget_s
    rate = copy_bytes_per_s(device)
    print(f"copy bandwidth (read + write): {rate / 1e12:.2f} TB/s", flush=True)
    # Keys this run does not reach keep their entries.
    # A GPU without a table of its own starts from the default's entries.
    read_from, write_to = table_path(), written_table_path(device_name(device))
    previous = json.loads(read_from.read_text())["tiles"] if read_from.exists() else {}
    results, table, lines = [], {"device": device_name(device), "tiles": previous}, []
    for (model, proj), (channels, depth, gated, formats) in (
        SMOKE_SHAPES if args.smoke else SHAPES
    ).items():
        if not wanted(model, proj, args.shapes):
            continue
        for fmt in (f for f in formats if f in args.formats.split(",")):
            if fmt == "wint4" and depth % args.int4_group:
                continue  # no whole groups (a --smoke shape)
            found = sweep_one(channels, depth, gated, fmt, device, deadline, args.refine)
            for rows in (1, 8):
                entry = found[rows]
                row = {"shape": f"{model} {proj}", "format": fmt, "rows": rows,
                       "bytes": found["bytes"], "theirs_s": entry["theirs_s"],
                       "timed": [(t, dataclasses.asdict(k)) for t, k in entry["timed"]]}  # fmt: skip
                results.append(row)
                if not entry["timed"]:
                    continue
                t, tiles = entry["timed"][0]
                key = table_key(rows, channels, depth, found["format"], gated)
                table["tiles"][key] = dataclasses.asdict(tiles) if t < entry["theirs_s"] else None
                line = (
                    f"| {model} {proj} | {fmt} | {rows} | {found['bytes'] / entry['theirs_s'] / rate:.0%} "
                    f"| {found['bytes'] / t / rate:.0%} | {entry['theirs_s'] * 1e6:.1f} | {t * 1e6:.1f} "
                    f"| {tiles.block_n}x{tiles.block_k}/{tiles.splits}{'' if tiles.dot else ' fma'}"
                    + "".join(f" {flag}" for flag in FLAGS if getattr(tiles, flag))
                    + " |"
                )
                lines.append(line)
                print(line, flush=True)
            args.json.write_text(json.dumps({"copy_bytes_per_s": rate, "rows": results}, indent=1))
    if args.write_table:
        write_to.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
        print(f"wrote {write_to}")
    print(
        "\n| shape | format | rows | theirs, of copy bw | ours, of copy bw | theirs us | ours us | tiles |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    print("\n".join(lines))


def wanted(model: str, proj: str, shapes: str) -> bool:
    """Whether --shapes (a comma-separated list of models and model:projection names, or '' for
    all) takes this shape."""
    names = [name for name in shapes.split(",") if name]
    return not names or model in names or f"{model}:{proj}" in names


def written_table_path(name: str) -> Path:
    """The default table where it was swept on this kind of GPU (or there is none), else this
    GPU's own (choice.gpu_table_path)."""
    if not TABLE_PATH.exists() or json.loads(TABLE_PATH.read_text())["device"] == name:
        return TABLE_PATH
    return gpu_table_path(name)


def device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device == "cuda" else "cpu (smoke)"


if __name__ == "__main__":
    main()
