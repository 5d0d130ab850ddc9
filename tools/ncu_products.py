"""Run W4's small-rows products once each inside the CUDA profiler's range, for Nsight Compute
to read their hardware counters: why a product reads at the share of copy bandwidth it does
(memory latency, issue, occupancy), which timings alone cannot say. Each layer is built by the
format's real linear method and multiplied through the kernels' method with the tiles the
device's table gives, as a decode step does; the products are compiled and run outside the
range first, so that only their timed launch is profiled. GPU only.

    ncu --profile-from-start off --clock-control none --section SpeedOfLight \\
        --section Occupancy --section WarpStateStats --section SchedulerStats \\
        python3 tools/ncu_products.py --formats wint4,fp8 --projections gate_up,down
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gemv_tune import METHODS, SHAPES, build_layer  # noqa: E402

from aioworker.compute.layers.gemv import method as small_rows  # noqa: E402
from aioworker.compute.layers.gemv.choice import tiles_for  # noqa: E402
from aioworker.compute.layers.quantized.weight_only import Int4OnLoad  # noqa: E402


def product(wrapped, layer, x, gated):
    return wrapped.apply_gated(layer, x) if gated else wrapped.apply(layer, x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-3.1-8b", help="a W4 model (gemv_tune.SHAPES)")
    parser.add_argument("--formats", default="wint4", help="comma-separated: none,fp8,wint8,wint4")
    parser.add_argument("--projections", default="gate_up,down,qkv,o", help="comma-separated")
    parser.add_argument("--rows", type=int, default=1, help="rows of x, 1 to 8")
    parser.add_argument("--int4-group", type=int, choices=(32, 64, 128), default=32)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("a GPU is needed: the products run under Nsight Compute")
    METHODS["wint4"] = Int4OnLoad(args.int4_group)
    torch.set_default_dtype(torch.bfloat16)
    runs = []
    for (model, proj), (channels, depth, gated, formats) in SHAPES.items():
        if model != args.model or proj not in args.projections.split(","):
            continue
        for fmt in (f for f in formats if f in args.formats.split(",")):
            method = METHODS[fmt]
            layer = build_layer(method, channels, depth, "cuda")
            wrapped = small_rows.small_rows(method)
            x = torch.randn(args.rows, depth, device="cuda")
            op = small_rows.OPERANDS[type(method)](layer)
            tiles = tiles_for(args.rows, op.weight, gated, args.int4_group if op.int4_groups else 0)
            product(wrapped, layer, x, gated)  # compiled here, outside the profiled range
            runs.append((f"{proj} {fmt} rows={args.rows}: {tiles}", wrapped, layer, x, gated))
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for name, wrapped, layer, x, gated in runs:
        print(name, flush=True)
        product(wrapped, layer, x, gated)
        torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()
