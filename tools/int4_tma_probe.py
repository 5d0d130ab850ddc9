"""Probe: does reading int4's blocks words through the bulk tensor copy engine (TMA, Triton's
tensor descriptors, pipelined into shared memory) lift the one-row int4 product's bandwidth?
Nsight Compute found the FMA blocks tiles latency-bound: 125 registers a thread hold 4 programs
an SM, and a step waits for its own loads. TMA copies stage ahead without registers.

Times, for one projection shape (rows of W, K), the table's product against the probe kernel
over a grid of tilings (CUDA graph over copies past L2), and checks each probe's sums.

    python tools/int4_tma_probe.py --rows 28672 --depth 4096
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gemv_tune import graph_time_s  # noqa: E402

from aioworker.compute.layers.gemv.int4_blocks import int4_block_step  # noqa: E402
from aioworker.compute.layers.quantized.weight_only import pack_int4_blocks  # noqa: E402

ASM = 2 if os.environ.get("TRITON_INTERPRET") == "1" else 1


@triton.jit
def _probe_kernel(
    x_ptr, w_desc, w_ptr, s_ptr, o_ptr, partial_ptr, num_rows, depth, k_per_split, stride_w,
    stride_g, TMA: tl.constexpr, ASM: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, STAGES: tl.constexpr,
):  # fmt: skip
    tile, split = tl.program_id(0), tl.program_id(1)
    rows = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_N, BLOCK_K // 32), dtype=tl.float32)
    first = split * k_per_split
    for start in tl.range(0, k_per_split, BLOCK_K, num_stages=STAGES):
        k0 = first + start
        if TMA:
            words = w_desc.load([tile * BLOCK_N, k0 // 8])
        else:
            units = k0 // 8 + tl.arange(0, BLOCK_K // 8)
            words = tl.load(w_ptr + rows[:, None] * stride_w + units[None, :])
        groups = k0 // 32 + tl.arange(0, BLOCK_K // 32)
        at = rows[:, None] * stride_g + groups[None, :]
        s = tl.load(s_ptr + at)
        o = tl.load(o_ptr + at)
        words = tl.reshape(words, (BLOCK_N, BLOCK_K // 32, 4))
        acc = int4_block_step(acc, x_ptr, words, s, o, k0, depth, ASM, True, BLOCK_K)
    tl.store(partial_ptr + split * num_rows + rows, tl.sum(acc, axis=1))


def probe(x, words, s, o, block_n, block_k, splits, warps, stages, tma):
    from triton.tools.tensor_descriptor import TensorDescriptor

    rows, depth = words.shape[0], words.shape[1] * 8
    per_split = depth // splits
    partial = torch.empty(splits, rows, dtype=torch.float32, device=x.device)
    desc = TensorDescriptor.from_tensor(words, [block_n, block_k // 8]) if tma else words
    _probe_kernel[(rows // block_n, splits)](
        x, desc, words, s, o, partial, rows, depth, per_split, words.stride(0), s.stride(0),
        TMA=tma, ASM=ASM, BLOCK_N=block_n, BLOCK_K=block_k, STAGES=stages, num_warps=warps,
    )  # fmt: skip
    return partial[0] if splits == 1 else partial.sum(0)


def reference(x, values, s, o):
    w = (values.float() - 8.0).reshape(values.shape[0], -1, 32) * s.float()[:, :, None]
    w = w + o.float()[:, :, None]
    return w.reshape(values.shape[0], -1) @ x.float()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=28672)
    parser.add_argument("--depth", type=int, default=4096)
    parser.add_argument("--quick", action="store_true", help="one small tiling (CPU check)")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8,
                                                                     device="cuda"))  # fmt: skip
    gen = torch.Generator(device).manual_seed(0)
    values = torch.randint(0, 16, (args.rows, args.depth), generator=gen, device=device,
                           dtype=torch.uint8)  # fmt: skip
    words = pack_int4_blocks(values)
    s = (torch.rand(args.rows, args.depth // 32, generator=gen, device=device) * 0.02).bfloat16()
    o = (torch.randn(args.rows, args.depth // 32, generator=gen, device=device) * 0.01).bfloat16()
    x = torch.randn(1, args.depth, generator=gen, device=device).bfloat16()
    want = reference(x, values, s, o)
    grid = (
        [(32, 256, 1, 1, 2, True), (32, 256, 1, 1, 2, False)]
        if args.quick
        else [
            (bn, 256, sp, w, st, tma)
            for bn, sp, w, st, tma in itertools.product(
                (32, 64, 128), (1, 2, 4), (2, 4), (1, 3), (False, True)
            )
            if st > 1 or not tma
        ]
    )
    read = words.numel() * 4 + s.numel() * 4
    copies = 1 if device == "cpu" else max(2, -(-(1 << 30) // read))
    stack = [(words, s, o)] + [(words.clone(), s.clone(), o.clone()) for _ in range(copies - 1)]
    results = []
    for block_n, block_k, splits, warps, stages, tma in grid:
        if args.depth // splits < block_k or args.rows % block_n:
            continue
        try:
            got = probe(x, words, s, o, block_n, block_k, splits, warps, stages, tma)
        except Exception as exc:  # noqa: BLE001 - a tiling this Triton refuses
            print(f"  failed {block_n}x{block_k}/{splits} w{warps} s{stages} tma={tma}: "
                  f"{type(exc).__name__}: {str(exc).splitlines()[-1][:160]}")  # fmt: skip
            continue
        err = ((got - want).norm() / want.norm()).item()
        seconds = float("nan")
        if device == "cuda":
            seconds = graph_time_s(
                lambda i, cfg=(block_n, block_k, splits, warps, stages, tma): probe(
                    x, *stack[i], *cfg
                ),
                copies,
            )
        results.append((seconds, block_n, block_k, splits, warps, stages, tma, err))
        print(f"{block_n}x{block_k}/{splits} w{warps} s{stages} tma={tma}: "
              f"{seconds * 1e6:.1f} us, {read / seconds / 1e12:.2f} TB/s, err {err:.2e}",
              flush=True)  # fmt: skip
    if device == "cuda":  # the kernels' own product with the blocks tiles the H200 chose
        from aioworker.compute.layers.gemv.product import small_rows_product
        from aioworker.compute.layers.gemv.tiles import Tiles

        for block_n, splits, warps in ((64, 2, 4), (64, 8, 2), (32, 8, 2)):
            tiles = Tiles(False, block_n, 256, splits, warps, 4, blocks=True)
            got = small_rows_product(x, words, tiles, None, False, None, (s, o))[0].float()
            err = ((got - want).norm() / want.norm()).item()
            seconds = graph_time_s(
                lambda i, t=tiles: small_rows_product(x, stack[i][0], t, None, False, None,
                                                      stack[i][1:]),
                copies,
            )  # fmt: skip
            results.append((seconds, block_n, 256, splits, warps, 0, "kernels", err))
            print(f"kernels' {tiles}: {seconds * 1e6:.1f} us, err {err:.2e}", flush=True)
    results.sort()
    print("\n| tiling | us | TB/s read | rel. error |\n| --- | --- | --- | --- |")
    for seconds, bn, bk, sp, w, st, tma, err in results[:12]:
        print(f"| {bn}x{bk}/{sp} w{w} s{st}{' tma' if tma is True else ' kernels' if tma else ''} | {seconds * 1e6:.1f} "
              f"| {read / seconds / 1e12:.2f} | {err:.1e} |")  # fmt: skip


if __name__ == "__main__":
    main()
