"""The rows' side of a small-rows product step (kernels.py): x's slice of one step of K, normed
and quantized as the tiles ask, and the multiply-accumulate of a widened W tile by it. Shared by
the stored layouts' loop (kernels.py) and int4's blocks loop (int4_blocks_loop.py)."""

from __future__ import annotations

import triton
import triton.language as tl

from aioworker.compute.layers.gemv.add_norm import normed_values
from aioworker.compute.layers.gemv.int4_blocks_dot import in_k_order


@triton.jit
def e4m3_rows(x):
    """x [rows, BLOCK_K] as e4m3, each row scaled so that its largest magnitude is e4m3's
    largest (448), and the scales [rows] that undo it (all-zero rows: zeros)."""
    x32 = x.to(tl.float32)
    largest = tl.maximum(tl.max(tl.abs(x32), axis=1), 1e-30)
    return (x32 * (448.0 / largest)[:, None]).to(tl.float8e4nv), largest / 448.0


@triton.jit
def accumulate(acc, x, x_scale, w, DOT: tl.constexpr, IEEE: tl.constexpr, A8: tl.constexpr):
    """DOT: acc [BLOCK_N, BLOCK_M] += w [BLOCK_N, BLOCK_K] @ x^T (A8: x e4m3, times its row
    scales x_scale); FMA: acc [BLOCK_N, BLOCK_K] += w * x[0] (x has one row)."""
    if A8:
        acc += tl.dot(w, tl.trans(x)) * x_scale[None, :]
    elif DOT:
        if IEEE:
            acc = tl.dot(w, tl.trans(x), acc, input_precision="ieee")
        else:
            acc = tl.dot(w, tl.trans(x), acc)
    else:
        acc += w.to(tl.float32) * x.to(tl.float32)
    return acc


@triton.jit
def x_step(
    squares_sum, x_ptr, residual_ptr, norm_weight_ptr, residual_out_ptr, write_sum, rows,
    num_rows, k0, stride_x, depth, A8: tl.constexpr, EVEN_K: tl.constexpr,
    NORMED: tl.constexpr, HAS_RESIDUAL: tl.constexpr, WIDE_X: tl.constexpr,
    INT4_BLOCKS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """x's rows over one step of K from k0 (normed: add_norm.py, its squares added to
    squares_sum), A8: as e4m3 with their scales. INT4_BLOCKS (dot tiles): the columns in the
    order int4_blocks_dot.py dequantizes W's."""
    ks = k0 + tl.arange(0, BLOCK_K)
    x_mask = rows[:, None] < num_rows
    k_mask = ks[None, :] < depth
    if not EVEN_K:
        x_mask = x_mask & k_mask
    x_at = rows[:, None] * stride_x + ks[None, :]
    if WIDE_X:  # one row, repeated over the tile's channels: loads from L1 after the first
        x_at = tl.zeros((BLOCK_N, 1), dtype=tl.int32) + ks[None, :]
    x, squares = normed_values(
        x_ptr, residual_ptr, norm_weight_ptr, residual_out_ptr, x_at, ks[None, :], x_mask,
        k_mask, write_sum, NORMED, HAS_RESIDUAL,
    )  # fmt: skip
    if NORMED:
        squares_sum += tl.sum(squares, axis=1)
    x_scale = squares_sum  # unused unless A8
    if A8:
        x, x_scale = e4m3_rows(x)
    if INT4_BLOCKS:
        x = in_k_order(x, rows.shape[0], BLOCK_K)
    return x, x_scale, squares_sum
