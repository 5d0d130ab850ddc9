"""A model's products at the row counts of W1's large decode steps, on the GPU: torch's product
(cuBLAS, as the engine runs them above 8 rows) against cuBLASLt and a Triton GEMM that splits K,
each timed in a CUDA graph over copies of the weights too large for L2 together, beside its roof
(the weights at the copy rate, or the FLOPs at the measured bf16 matmul rate, whichever is
longer).

    python tools/bench_products.py [--model qwen3-0.6b] [--rows 80 208 256] [--configs N]
    TRITON_INTERPRET=1 python tools/bench_products.py --check   # the Triton GEMM on the CPU

Why: a 200-sequence step of Qwen3-0.6B spent 0.83 ms in cuBLAS's products on an H100 (profile,
docs/benchmarks.md 2026-12-06 17:45), where the weights read at the copy rate take ~0.3 ms and
the FLOPs ~0.2 ms. Its products are narrow (1,024 to 6,144 channels), so a GEMM of 128 x 128
tiles gives 16 to 96 programs to 132 SMs. This says how far each product sits from its roof and
whether splitting K or narrower tiles close it.
"""

from __future__ import annotations

import argparse
import itertools

import torch
import triton
import triton.language as tl

from aioworker.bench.gpu import MODELS
from aioworker.checkpoint.model_config import ModelConfig, load_model_config

COPIES_BYTES = 256 << 20  # weights copies cycled a replay: more than any GPU's L2


@triton.jit
def _tile_sums(
    x_ptr, w_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SPLIT: tl.constexpr
):
    """This program's float32 sums of x[rows] @ w[cols]^T over its slice of K, and its rows
    and columns. Programs of one channel tile are neighbours (the grid's first axis is the rows'
    tiles), so its weights come from DRAM once and from L2 for its other row tiles."""
    pid_m, pid_n, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = pid_m * BM + tl.arange(0, BM)
    cols = pid_n * BN + tl.arange(0, BN)
    span = K // SPLIT
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(pid_k * span, (pid_k + 1) * span, BK):
        ks = k + tl.arange(0, BK)
        x = tl.load(x_ptr + rows[:, None] * K + ks[None, :], mask=rows[:, None] < M, other=0.0)
        w = tl.load(w_ptr + cols[None, :] * K + ks[:, None], mask=cols[None, :] < N, other=0.0)
        acc = tl.dot(x, w, acc)
    return acc, rows, cols


@triton.jit
def _gemm(
    x_ptr,
    w_ptr,
    out_ptr,
    M,
    N,
    K,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    SPLIT: tl.constexpr,
):
    """out[M, N] (+)= x[M, K] @ w[N, K]^T over this program's slice of K; with SPLIT > 1 the
    slices add into a float32 out by atomics."""
    acc, rows, cols = _tile_sums(x_ptr, w_ptr, M, N, K, BM, BN, BK, SPLIT)
    where = out_ptr + rows[:, None] * N + cols[None, :]
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    if SPLIT == 1:
        tl.store(where, acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        tl.atomic_add(where, acc, mask=mask, sem="relaxed")


@triton.jit
def _gemm_fold(
    x_ptr,
    w_ptr,
    out_ptr,
    partial_ptr,
    counts_ptr,
    M,
    N,
    K,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    SPLIT: tl.constexpr,
):
    """`_gemm` with K split and no second kernel: each program stores its float32 sums, and the
    last of an output tile's programs to arrive adds them, stores the output and sets the
    tile's count back to 0 (as the few-rows kernels' FOLD does)."""
    acc, rows, cols = _tile_sums(x_ptr, w_ptr, M, N, K, BM, BN, BK, SPLIT)
    at = rows[:, None] * N + cols[None, :]
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    tl.store(partial_ptr + tl.program_id(2) * M * N + at, acc, mask=mask)
    tl.debug_barrier()
    tile = tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
    if tl.atomic_add(counts_ptr + tile, 1, sem="acq_rel") == SPLIT - 1:
        total = tl.zeros((BM, BN), dtype=tl.float32)
        for other in range(SPLIT):
            total += tl.load(
                partial_ptr + other * M * N + at, mask=mask, other=0.0, cache_modifier=".cg"
            )
        tl.store(out_ptr + at, total.to(out_ptr.dtype.element_ty), mask=mask)
        tl.atomic_xchg(counts_ptr + tile, 0)


def fold_product(config: tuple[int, ...]):
    """A product x @ w^T by `_gemm_fold` (SPLIT > 1), its workspace kept across calls."""
    bm, bn, bk, split, warps, stages = config
    kept: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def product(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        m, k = x.shape
        n = w.shape[0]
        grid = (triton.cdiv(m, bm), triton.cdiv(n, bn), split)
        if (m, n) not in kept:
            kept[m, n] = (
                torch.empty(split, m, n, dtype=torch.float32, device=x.device),
                torch.zeros(grid[0] * grid[1], dtype=torch.int32, device=x.device),
            )
        partial, counts = kept[m, n]
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
        _gemm_fold[grid](
            x,
            w,
            out,
            partial,
            counts,
            m,
            n,
            k,
            BM=bm,
            BN=bn,
            BK=bk,
            SPLIT=split,
            num_warps=warps,
            num_stages=stages,
        )
        return out

    return product


def triton_product(config: tuple[int, ...]):
    """A product x @ w^T by `_gemm` with (BM, BN, BK, SPLIT, warps, stages)."""
    bm, bn, bk, split, warps, stages = config

    def product(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        m, k = x.shape
        n = w.shape[0]
        grid = (triton.cdiv(m, bm), triton.cdiv(n, bn), split)
        if split == 1:
            out = torch.empty(m, n, dtype=x.dtype, device=x.device)
        else:
            out = torch.zeros(m, n, dtype=torch.float32, device=x.device)
        _gemm[grid](
            x, w, out, m, n, k, BM=bm, BN=bn, BK=bk, SPLIT=split, num_warps=warps, num_stages=stages
        )
        return out if split == 1 else out.to(x.dtype)

    return product


def configs(k: int, limit: int) -> list[tuple[int, ...]]:
    """Tiles and splits worth timing for K inputs, at most `limit`: splits that leave each slice
    whole tiles of K."""
    found = []
    for bm, bn, bk, split, warps, stages in itertools.product(
        (64, 128), (64, 128), (64, 128), (1, 2, 4), (4, 8), (3, 4)
    ):
        if k % (bk * split) == 0 and not (bm == 128 and bn == 128 and warps == 4):
            found.append((bm, bn, bk, split, warps, stages))
    return found[:limit]


def products(cfg: ModelConfig) -> dict[str, tuple[int, int]]:
    """(N, K) of each product of a decoder layer, and of the LM head."""
    d, q, kv = cfg.hidden_size, cfg.q_size, cfg.kv_size
    return {
        "qkv": (q + 2 * kv, d),
        "o": (d, q),
        "gate_up": (2 * cfg.intermediate_size, d),
        "down": (d, cfg.intermediate_size),
        "lm_head": (cfg.vocab_size, d),
    }


def time_us(product, x: torch.Tensor, weights: list[torch.Tensor]) -> float:
    """Device time of one product, a CUDA graph replaying it over every copy of the weights."""
    from aioworker.bench.gpu_spec import replay_ms

    for w in weights[:2]:
        product(x, w)  # compile, and let the allocator see the shapes before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for w in weights:
            product(x, w)
    return replay_ms(graph) * 1e3 / len(weights)


def check() -> None:
    """The Triton GEMM against torch, odd sizes, each split (CPU under TRITON_INTERPRET=1)."""
    torch.manual_seed(0)
    x = torch.randn(37, 256, dtype=torch.float32)
    w = torch.randn(100, 256, dtype=torch.float32)
    for config in [(16, 32, 64, 1, 4, 2), (32, 16, 64, 2, 4, 2), (16, 16, 32, 4, 4, 2)]:
        got = triton_product(config)(x, w)
        torch.testing.assert_close(got, x @ w.T, rtol=1e-4, atol=1e-3)
        if config[3] > 1:
            fold = fold_product(config)
            for _ in range(2):  # the counts are back at 0 for the second call
                torch.testing.assert_close(fold(x, w), x @ w.T, rtol=1e-4, atol=1e-3)
    print("the Triton GEMMs equal torch's product (3 configs, 37 x 256 @ 100 x 256)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen3-0.6b")
    parser.add_argument("--rows", type=int, nargs="+", default=[80, 208, 256])
    parser.add_argument("--configs", type=int, default=96, help="Triton configs to try a shape")
    parser.add_argument("--check", action="store_true", help=check.__doc__)
    args = parser.parse_args()
    if args.check:
        return check()
    from aioworker.bench.gpu import _copy_bytes_per_s, _matmul_flop_per_s
    from aioworker.bench.report import format_table

    copy, flops = _copy_bytes_per_s(), _matmul_flop_per_s()
    print(
        f"copy {copy / 1e12:.2f} TB/s, bf16 matmul {flops / 1e12:.0f} TFLOP/s, {torch.cuda.get_device_name()}"
    )
    cfg = load_model_config(MODELS / args.model)
    table, sums = [], {}
    for rows, (name, (n, k)) in itertools.product(args.rows, products(cfg).items()):
        x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
        copies = max(2, COPIES_BYTES // (n * k * 2))
        weights = [
            torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5 for _ in range(copies)
        ]
        roof = max(n * k * 2 / copy, 2 * rows * n * k / flops) * 1e6
        torch.backends.cuda.preferred_blas_library("cublas")
        cublas = time_us(torch.nn.functional.linear, x, weights)
        torch.backends.cuda.preferred_blas_library("cublaslt")
        lt = time_us(torch.nn.functional.linear, x, weights)
        torch.backends.cuda.preferred_blas_library("cublas")
        reference = x @ weights[0].T
        best, best_config = float("inf"), None
        candidates = [(c, triton_product(c), "") for c in configs(k, args.configs)]
        candidates += [(c, fold_product(c), "fold") for c in configs(k, args.configs) if c[3] > 1]
        for config, product, kind in candidates:
            try:
                got = product(x, weights[0])
            except Exception as error:  # a config past the shared memory: not a candidate
                print(f"{name} {rows} {config}: {type(error).__name__}")
                continue
            torch.testing.assert_close(got.float(), reference.float(), rtol=2e-2, atol=2e-2)
            us = time_us(product, x, weights)
            if us < best:
                best, best_config = us, (*config, kind) if kind else config
        for column, us in (("cuBLAS", cublas), ("cuBLASLt", lt), ("Triton", best)):
            sums[rows, column] = sums.get((rows, column), 0.0) + (us if name != "lm_head" else 0)
        table.append(
            [
                rows,
                name,
                f"{n}x{k}",
                f"{roof:.1f}",
                f"{cublas:.1f} ({roof / cublas:.0%})",
                f"{lt:.1f} ({roof / lt:.0%})",
                f"{best:.1f} ({roof / best:.0%})",
                "x".join(map(str, best_config or ())),
            ]
        )
        print(table[-1], flush=True)
    header = [
        "rows",
        "product",
        "N x K",
        "roof us",
        "cuBLAS us (of roof)",
        "cuBLASLt",
        "Triton, best",
        "BM x BN x BK x split x warps x stages",
    ]
    print(format_table(header, table))
    layers = cfg.num_hidden_layers
    for rows in args.rows:
        line = ", ".join(
            f"{c} {sums[rows, c] * layers / 1e3:.3f} ms" for c in ("cuBLAS", "cuBLASLt", "Triton")
        )
        print(f"{rows} rows, a step's layer products ({layers} layers): {line}")


if __name__ == "__main__":
    main()
