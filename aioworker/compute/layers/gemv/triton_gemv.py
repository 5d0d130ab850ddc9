"""y = x @ W.T for a few rows of x (M = 1..8), in Triton: the kernel family of decode's small
products, where a step is the time to read the weights once.

Each program reads one BLOCK_N x K_PER_SPLIT tile of W exactly once and multiplies it with
every row of x (the rows share the read, so M = 8 costs what M = 1 does in bytes). With few
output tiles, K is split across programs so that there are enough of them to fill the device
(132 SMs on an H200); their partial sums, in float32, are added by one small reduction. A
weight format adds a variant, not a copy: a per-output-channel scale (fp8, int8) multiplies the
accumulated sum, since it factors out of the sum over K.

Not yet picked by any linear method: issue 22 tunes it on the GPU first.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_ROWS = 8
BLOCK_N = 64
BLOCK_K = 128
# Programs to aim for: two per SM of an H200, so that every SM streams weights.
TARGET_PROGRAMS = 264


@triton.jit
def _gemv_kernel(
    x_ptr, w_ptr, scale_ptr, partial_ptr,
    num_rows, num_cols, depth, stride_x, stride_w, stride_split, stride_row,
    HAS_SCALE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, K_PER_SPLIT: tl.constexpr,
):  # fmt: skip
    tile, split = tl.program_id(0), tl.program_id(1)
    rows = tl.arange(0, BLOCK_M)
    cols = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    first = split * K_PER_SPLIT
    for start in range(0, K_PER_SPLIT, BLOCK_K):
        ks = first + start + tl.arange(0, BLOCK_K)
        w = tl.load(
            w_ptr + cols[:, None] * stride_w + ks[None, :],
            mask=(cols[:, None] < num_cols) & (ks[None, :] < depth),
            other=0.0,
        )  # [BLOCK_N, BLOCK_K]
        x = tl.load(
            x_ptr + rows[:, None] * stride_x + ks[None, :],
            mask=(rows[:, None] < num_rows) & (ks[None, :] < depth),
            other=0.0,
        )  # [BLOCK_M, BLOCK_K]
        acc += tl.sum(x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :], axis=2)
    if HAS_SCALE:
        acc *= tl.load(scale_ptr + cols, mask=cols < num_cols, other=0.0)[None, :]
    tl.store(
        partial_ptr + split * stride_split + rows[:, None] * stride_row + cols[None, :],
        acc,
        mask=(rows[:, None] < num_rows) & (cols[None, :] < num_cols),
    )


def num_splits(num_cols: int, depth: int) -> int:
    """Splits of K that give about TARGET_PROGRAMS programs, each at least one BLOCK_K deep."""
    num_tiles = triton.cdiv(num_cols, BLOCK_N)
    return max(1, min(triton.cdiv(TARGET_PROGRAMS, num_tiles), triton.cdiv(depth, BLOCK_K)))


def gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor | None = None,
    splits: int | None = None,
) -> torch.Tensor:
    """x: [M, K] (M <= MAX_ROWS), weight: [N, K] (rows contiguous), scale: [N] float32 or
    None; returns [M, N] in x's dtype."""
    num_rows, depth = x.shape
    num_cols = weight.shape[0]
    if not 1 <= num_rows <= MAX_ROWS or weight.shape[1] != depth:
        raise ValueError(f"gemv takes 1 to {MAX_ROWS} rows of {weight.shape[1]}, got {x.shape}")
    x = x.contiguous()
    splits = splits or num_splits(num_cols, depth)
    k_per_split = triton.cdiv(triton.cdiv(depth, splits), BLOCK_K) * BLOCK_K
    splits = triton.cdiv(depth, k_per_split)
    partial = torch.empty((splits, num_rows, num_cols), dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(num_cols, BLOCK_N), splits)
    _gemv_kernel[grid](
        x, weight, scale if scale is not None else x, partial,
        num_rows, num_cols, depth, x.stride(0), weight.stride(0),
        partial.stride(0), partial.stride(1),
        HAS_SCALE=scale is not None, BLOCK_M=triton.next_power_of_2(num_rows),
        BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, K_PER_SPLIT=k_per_split,
    )  # fmt: skip
    return partial.sum(0).to(x.dtype)
