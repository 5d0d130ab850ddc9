"""The K loop of a small-rows product on int4's blocks layout (int4_blocks.py on FMA tiles,
int4_blocks_dot.py on tensor cores), with each step's words read during the step before where
the tiles ask (Tiles.ahead)."""

from __future__ import annotations

import triton
import triton.language as tl

from aioworker.compute.layers.gemv.int4_blocks import blocks_operands, int4_block_step
from aioworker.compute.layers.gemv.int4_blocks_dot import dequantized_tile, group_scaled, raw_tile
from aioworker.compute.layers.gemv.rows import accumulate, x_step


@triton.jit
def int4_blocks_loop(
    gate_acc, up_acc, squares_sum, x_ptr, w_ptr, group_scale_ptr, group_offset_ptr,
    residual_ptr, norm_weight_ptr, residual_out_ptr, write_sum, channels, in_range, rows,
    num_rows, num_channels, first, k_per_split, stride_x, stride_w, stride_group_row,
    stride_group, depth, compute_dtype, GATED: tl.constexpr, DOT: tl.constexpr,
    IEEE: tl.constexpr, EVEN_K: tl.constexpr, INT4_GROUP: tl.constexpr, NORMED: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr, INT4_BLOCKS: tl.constexpr, AHEAD: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, FMA_STAGES: tl.constexpr, BITS: tl.constexpr,
    X_ROWS: tl.constexpr,
):  # fmt: skip
    """The K loop on int4's blocks layout (int4_blocks.py, int4_blocks_dot.py). BITS (tensor
    cores, a step within one group): the raw tile, scaled once a step (int4_blocks_dot.py's
    `group_scaled`). AHEAD: each step
    reads the next step's operands before it multiplies its own, which were read during the step
    before; the last step is peeled off the loop, so that no step reads past its slice and the
    addresses stay a step apart (no clamp, no predicate)."""
    if AHEAD:
        gate_w, gate_s, gate_o, up_w, up_s, up_o = _blocks_operands(
            w_ptr, group_scale_ptr, group_offset_ptr, channels, in_range, num_channels, first,
            stride_w, stride_group_row, stride_group, depth, GATED, EVEN_K, INT4_GROUP, BLOCK_K,
            DOT and BITS,
        )  # fmt: skip
        for start in tl.range(0, k_per_split - BLOCK_K, BLOCK_K):
            next_gate_w, next_gate_s, next_gate_o, next_up_w, next_up_s, next_up_o = (
                _blocks_operands(
                    w_ptr, group_scale_ptr, group_offset_ptr, channels, in_range, num_channels,
                    first + start + BLOCK_K, stride_w, stride_group_row, stride_group, depth, GATED,
                    EVEN_K, INT4_GROUP, BLOCK_K, DOT and BITS,
                )
            )  # fmt: skip
            gate_acc, up_acc, squares_sum = _int4_blocks_step(
                gate_acc, up_acc, squares_sum, gate_w, gate_s, gate_o, up_w, up_s, up_o, x_ptr,
                residual_ptr, norm_weight_ptr, residual_out_ptr, write_sum, rows, num_rows,
                first + start, stride_x, depth, compute_dtype, GATED, DOT, IEEE,
                EVEN_K, NORMED, HAS_RESIDUAL, INT4_BLOCKS, BLOCK_N, BLOCK_K, BITS, X_ROWS,
            )  # fmt: skip
            gate_w, gate_s, gate_o = next_gate_w, next_gate_s, next_gate_o
            up_w, up_s, up_o = next_up_w, next_up_s, next_up_o
        gate_acc, up_acc, squares_sum = _int4_blocks_step(
            gate_acc, up_acc, squares_sum, gate_w, gate_s, gate_o, up_w, up_s, up_o, x_ptr,
            residual_ptr, norm_weight_ptr, residual_out_ptr, write_sum, rows, num_rows,
            first + k_per_split - BLOCK_K, stride_x, depth, compute_dtype, GATED, DOT, IEEE,
            EVEN_K, NORMED, HAS_RESIDUAL, INT4_BLOCKS, BLOCK_N, BLOCK_K, BITS, X_ROWS,
        )  # fmt: skip
    else:
        for start in tl.range(0, k_per_split, BLOCK_K, num_stages=FMA_STAGES):
            gate_w, gate_s, gate_o, up_w, up_s, up_o = _blocks_operands(
                w_ptr, group_scale_ptr, group_offset_ptr, channels, in_range, num_channels,
                first + start, stride_w, stride_group_row, stride_group, depth, GATED, EVEN_K,
                INT4_GROUP, BLOCK_K, DOT and BITS,
            )  # fmt: skip
            gate_acc, up_acc, squares_sum = _int4_blocks_step(
                gate_acc, up_acc, squares_sum, gate_w, gate_s, gate_o, up_w, up_s, up_o, x_ptr,
                residual_ptr, norm_weight_ptr, residual_out_ptr, write_sum, rows, num_rows,
                first + start, stride_x, depth, compute_dtype, GATED, DOT, IEEE, EVEN_K, NORMED,
                HAS_RESIDUAL, INT4_BLOCKS, BLOCK_N, BLOCK_K, BITS, X_ROWS,
            )  # fmt: skip
    return gate_acc, up_acc, squares_sum


@triton.jit
def _int4_blocks_step(
    gate_acc, up_acc, squares_sum, gate_w, gate_s, gate_o, up_w, up_s, up_o, x_ptr,
    residual_ptr, norm_weight_ptr, residual_out_ptr, write_sum, rows, num_rows, k0, stride_x,
    depth, compute_dtype, GATED: tl.constexpr, DOT: tl.constexpr, IEEE: tl.constexpr,
    EVEN_K: tl.constexpr, NORMED: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    INT4_BLOCKS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    BITS: tl.constexpr, X_ROWS: tl.constexpr,
):  # fmt: skip
    """One step of K from k0 on operands `_blocks_operands` read: x's rows (normed on tensor
    cores) times the gate rows' dequantized tile (BITS: raw tile, scaled after), and the up
    rows' when GATED; on FMA tiles one row, its x loaded again for the up rows, from L1."""
    if DOT and BITS:
        x, _, squares_sum = x_step(
            squares_sum, x_ptr, residual_ptr, norm_weight_ptr, residual_out_ptr, write_sum, rows,
            num_rows, k0, stride_x, depth, False, EVEN_K, NORMED, HAS_RESIDUAL, False,
            INT4_BLOCKS, BLOCK_N, BLOCK_K,
        )  # fmt: skip
        x_sums = _x_sums(x, x_ptr, k0, depth, num_rows, stride_x, EVEN_K, X_ROWS, BLOCK_K)
        w = raw_tile(gate_w, compute_dtype, INT4_BLOCKS, BLOCK_N, BLOCK_K)
        gate_acc = group_scaled(gate_acc, _sums(w, x, IEEE), x_sums, gate_s, gate_o)
        if GATED:
            w = raw_tile(up_w, compute_dtype, INT4_BLOCKS, BLOCK_N, BLOCK_K)
            up_acc = group_scaled(up_acc, _sums(w, x, IEEE), x_sums, up_s, up_o)
    elif DOT:
        x, x_scale, squares_sum = x_step(
            squares_sum, x_ptr, residual_ptr, norm_weight_ptr, residual_out_ptr, write_sum, rows,
            num_rows, k0, stride_x, depth, False, EVEN_K, NORMED, HAS_RESIDUAL, False,
            INT4_BLOCKS, BLOCK_N, BLOCK_K,
        )  # fmt: skip
        w = dequantized_tile(gate_w, gate_s, gate_o, compute_dtype, INT4_BLOCKS, BLOCK_N,
                             BLOCK_K)  # fmt: skip
        gate_acc = accumulate(gate_acc, x, x_scale, w, DOT, IEEE, False)
        if GATED:
            w = dequantized_tile(up_w, up_s, up_o, compute_dtype, INT4_BLOCKS, BLOCK_N, BLOCK_K)
            up_acc = accumulate(up_acc, x, x_scale, w, DOT, IEEE, False)
    else:
        gate_acc = int4_block_step(gate_acc, x_ptr, gate_w, gate_s, gate_o, k0, depth,
                                   INT4_BLOCKS, EVEN_K, BLOCK_K)  # fmt: skip
        if GATED:
            up_acc = int4_block_step(up_acc, x_ptr, up_w, up_s, up_o, k0, depth, INT4_BLOCKS,
                                     EVEN_K, BLOCK_K)  # fmt: skip
    return gate_acc, up_acc, squares_sum


@triton.jit
def _x_sums(x, x_ptr, k0, depth, num_rows, stride_x, EVEN_K: tl.constexpr, X_ROWS: tl.constexpr,
            BLOCK_K: tl.constexpr):  # fmt: skip
    """[rows] sums of the step's x [rows, BLOCK_K], padded to the tensor cores' 16 rows. X_ROWS
    (1, or 8 of 16): from x's first X_ROWS rows loaded again (from L1) in K's order, the others
    0, as x's are. Summed over the padded tile, the widening and adds of 16 values a column
    cost 0.48 instructions a weight; over 8 rows 0.3, over one 0.2 (tools/sass_mix.py)."""
    if X_ROWS > 0:
        ks = k0 + tl.arange(0, BLOCK_K)
        few = tl.arange(0, X_ROWS)
        mask = few[:, None] < num_rows
        if not EVEN_K:
            mask = mask & (ks < depth)[None, :]
        loaded = tl.load(x_ptr + few[:, None] * stride_x + ks[None, :], mask=mask, other=0.0)
        sums = tl.sum(loaded.to(tl.float32), axis=1)
        if X_ROWS == 1:  # noqa: SIM108 - a constexpr branch
            sums = tl.where(tl.arange(0, x.shape[0]) == 0, tl.sum(sums, axis=0), 0.0)
        else:  # [8] -> [16]: then eight zeros
            tl.static_assert(x.shape[0] == 2 * X_ROWS, "X_ROWS pads to 16 rows")
            sums = tl.reshape(tl.trans(tl.join(sums, tl.zeros_like(sums))), (x.shape[0],))
    else:
        sums = tl.sum(x.to(tl.float32), axis=1)
    return sums


@triton.jit
def _sums(w, x, IEEE: tl.constexpr):
    """w [N, BLOCK_K] @ x^T: the step's own [N, rows] float32 sums, scaled before they are added."""
    zeros = tl.zeros((w.shape[0], x.shape[0]), dtype=tl.float32)
    return accumulate(zeros, x, x, w, True, IEEE, False)


@triton.jit
def _blocks_operands(
    w_ptr, group_scale_ptr, group_offset_ptr, channels, in_range, num_channels, k0, stride_w,
    stride_group_row, stride_group, depth, GATED: tl.constexpr, EVEN_K: tl.constexpr,
    INT4_GROUP: tl.constexpr, BLOCK_K: tl.constexpr, ONE_GROUP: tl.constexpr,
):  # fmt: skip
    """What one step of K reads of int4's blocks layout (int4_blocks.blocks_operands): the gate
    rows' words, scales and offsets, then the up rows' when GATED (else the gate rows' again,
    unused)."""
    gate_w, gate_s, gate_o = blocks_operands(
        w_ptr, group_scale_ptr, group_offset_ptr, channels, in_range, k0, stride_w,
        stride_group_row, stride_group, depth, EVEN_K, INT4_GROUP, BLOCK_K, ONE_GROUP,
    )  # fmt: skip
    up_w, up_s, up_o = gate_w, gate_s, gate_o
    if GATED:
        up_w, up_s, up_o = blocks_operands(
            w_ptr, group_scale_ptr, group_offset_ptr, channels + num_channels, in_range, k0,
            stride_w, stride_group_row, stride_group, depth, EVEN_K, INT4_GROUP, BLOCK_K,
            ONE_GROUP,
        )  # fmt: skip
    return gate_w, gate_s, gate_o, up_w, up_s, up_o
