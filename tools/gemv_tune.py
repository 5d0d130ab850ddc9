"""Tile sweep for the small-rows product kernels (compute/layers/gemv/) on the GPU: for each
projection shape of the models in configs/models/ and each format, every candidate tiling is
timed, and the best is printed beside torch's product (cuBLAS; `_scaled_mm` after a per-token
quantization for fp8) and the device's copy bandwidth, all in one run. GPU only.

Timing: a CUDA graph runs the product over enough copies of the weight that they do not fit
in L2, back to back, as a decode step's layers do; time per product = graph time / copies.

    python tools/gemv_tune.py --json $OUT/gemv_tune.json [--budget-s 420] [--write-table]

--write-table writes the winners to compute/layers/gemv/tuned_tiles.json, the table the method
reads: per shape, format, gating and row class, the best tiles, or null where torch's product
was faster.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aioworker.bench import gpu  # noqa: E402
from aioworker.bench.gpu_spec import replay_ms  # noqa: E402
from aioworker.compute.layers.gemv.choice import TABLE_PATH, format_of, table_key  # noqa: E402
from aioworker.compute.layers.gemv.product import small_rows_product  # noqa: E402
from aioworker.compute.layers.gemv.tiles import Tiles  # noqa: E402
from aioworker.compute.layers.quantized import fp8  # noqa: E402

E4M3 = torch.float8_e4m3fn
FORMAT_DTYPES = {"bf16": torch.bfloat16, "fp8": E4M3}
SMS = 132

# (model, projection) -> (output channels, K, gated)
SHAPES = {
    ("llama-3.1-8b", "qkv"): (6144, 4096, False),
    ("llama-3.1-8b", "o"): (4096, 4096, False),
    ("llama-3.1-8b", "gate_up"): (28672, 4096, True),
    ("llama-3.1-8b", "down"): (4096, 14336, False),
    ("llama-3.1-8b", "lm_head"): (128256, 4096, False),
    ("qwen3-0.6b", "qkv"): (4096, 1024, False),
    ("qwen3-0.6b", "o"): (1024, 2048, False),
    ("qwen3-0.6b", "gate_up"): (6144, 1024, True),
    ("qwen3-0.6b", "down"): (1024, 3072, False),
    ("qwen3-0.6b", "lm_head"): (151936, 1024, False),
}


def candidates(channels: int, depth: int, dot: bool) -> list[Tiles]:
    if dot:
        grid = itertools.product((32, 64, 128), (64, 128, 256), (3, 4), (1, 2, 4, 8))
    else:
        grid = itertools.product((16, 32), (256, 512), (3,), (1, 2, 4, 8))
    found = []
    for block_n, block_k, stages, splits in grid:
        programs = triton.cdiv(channels, block_n) * splits
        if depth // splits < block_k or not SMS // 2 <= programs <= 16 * SMS:
            continue
        found.append(Tiles(dot, block_n, block_k, splits, 4, stages))
    return found


def graph_time_s(fn, copies: int) -> float:
    """Seconds per call of fn(i) for i over the copies, captured in one CUDA graph."""
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
    reps = max(3, int(50 / max(replay_ms(graph, 1), 1e-3)))  # about 50 ms of replays
    return min(replay_ms(graph, reps) for _ in range(3)) / 1e3 / copies


def weights(channels: int, depth: int, fmt: str, copies: int):
    made = []
    for _ in range(copies):
        w = torch.randn(channels, depth, device="cuda", dtype=torch.bfloat16)
        if fmt == "fp8":
            q, s = fp8.quantize_rows(w.float())
            made.append((q, s))
        else:
            made.append((w, None))
    return made


def torch_product(x, w, scale, gated):
    y = torch.nn.functional.linear(x, w) if scale is None else fp8.scaled_product(x, w, scale, None)
    if gated:
        from aioworker.compute.layers.fused import silu_and_mul

        y = silu_and_mul(y)
    return y


def sweep_one(name, channels, depth, gated, fmt, rows_list, deadline):
    bytes_per_weight = channels * depth * (1 if fmt == "fp8" else 2)
    copies = max(2, min(48, triton.cdiv(1 << 30, bytes_per_weight)))
    made = weights(channels, depth, fmt, copies)
    result = {"shape": name, "format": fmt, "bytes": bytes_per_weight, "rows": {}}
    for rows in rows_list:
        x = torch.randn(rows, depth, device="cuda", dtype=torch.bfloat16)
        want = torch_product(x, *made[0], gated).float()
        theirs = graph_time_s(lambda i, x=x: torch_product(x, *made[i], gated), copies)
        timed = []
        for dot in (True, False) if rows == 1 else (True,):
            for tiles in candidates(channels, depth, dot):
                if time.monotonic() > deadline:
                    break
                got = small_rows_product(x, made[0][0], tiles, made[0][1], gated).float()
                err = ((got - want).norm() / want.norm()).item()
                if err > 3e-2:
                    print(f"  WRONG {name} {fmt} rows={rows} {tiles}: rel err {err:.3g}")
                    continue
                t = graph_time_s(
                    lambda i, x=x, tiles=tiles: small_rows_product(
                        x, made[i][0], tiles, made[i][1], gated
                    ),
                    copies,
                )
                timed.append((t, tiles))
        timed.sort(key=lambda pair: pair[0])
        result["rows"][rows] = {
            "torch_s": theirs,
            "best": [(t, tiles.__dict__) for t, tiles in timed[:5]],
        }
    torch.cuda.empty_cache()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--budget-s", type=float, default=420)
    parser.add_argument("--rows", default="1,8")
    parser.add_argument("--write-table", action="store_true")
    args = parser.parse_args()
    deadline = time.monotonic() + args.budget_s
    rate = gpu.measure_limits().copy_bytes_per_s  # what W4's floors divide by
    print(f"copy bandwidth (read + write): {rate / 1e12:.2f} TB/s", flush=True)
    rows_list = [int(r) for r in args.rows.split(",")]
    results = {"copy_bytes_per_s": rate, "shapes": []}
    table = {"device": torch.cuda.get_device_name(), "tiles": {}}
    lines = []
    for (model, proj), (channels, depth, gated) in SHAPES.items():
        for fmt in ("bf16", "fp8") if proj != "lm_head" else ("bf16",):
            r = sweep_one(f"{model} {proj}", channels, depth, gated, fmt, rows_list, deadline)
            results["shapes"].append(r)
            args.json.write_text(json.dumps(results, indent=1))
            for rows, entry in r["rows"].items():
                if not entry["best"]:
                    continue
                t, tiles = entry["best"][0]
                key = table_key(rows, channels, depth, format_of(FORMAT_DTYPES[fmt]), gated)
                table["tiles"][key] = tiles if t < entry["torch_s"] else None
                line = (
                    f"| {model} {proj} | {fmt} | {rows} | {r['bytes'] / entry['torch_s'] / rate:.0%} "
                    f"| {r['bytes'] / t / rate:.0%} | {t * 1e6:.1f} | {tiles} |"
                )
                lines.append(line)
                print(line, flush=True)
    if args.write_table:
        TABLE_PATH.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
        print(f"wrote {TABLE_PATH}")
    print("\n| shape | format | rows | torch of copy bw | ours of copy bw | ours us | tiles |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
