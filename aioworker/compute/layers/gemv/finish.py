"""How a small-rows product's float32 sums become its output: normed (add_norm.py), scaled per
channel, biased or gated, and rounded; and with split K, the partial sums added first, by the
last of a tile's programs to arrive (`fold`) or by a second kernel (`reduce_kernel`)."""

from __future__ import annotations

import triton
import triton.language as tl

from aioworker.compute.layers.gdc import wait_for_previous_kernel
from aioworker.compute.layers.gemv.add_norm import inverse_rms


@triton.jit
def _epilogue(gate, up, scale_ptr, bias_ptr, channels, num_channels, SCALED: tl.constexpr,
              HAS_BIAS: tl.constexpr, GATED: tl.constexpr):  # fmt: skip
    """Sums [BLOCK_N, BLOCK_M] (float32) -> the output values: scaled, then biased (a plain
    product) or gated."""
    in_range = channels < num_channels
    if SCALED:
        gate = gate * tl.load(scale_ptr + channels, mask=in_range, other=0.0)[:, None]
        if GATED:
            up_scale = tl.load(scale_ptr + num_channels + channels, mask=in_range, other=0.0)
            up = up * up_scale[:, None]
    if HAS_BIAS:
        gate += tl.load(bias_ptr + channels, mask=in_range, other=0.0).to(tl.float32)[:, None]
    return gate * tl.sigmoid(gate) * up if GATED else gate


@triton.jit
def fold(
    partial_ptr, counter_ptr, squares_ptr, scale_ptr, bias_ptr, out_ptr, tile, at, channels,
    rows, num_rows, num_channels, depth, stride_split, stride_out, eps, out_mask,
    NORMED: tl.constexpr, SCALED: tl.constexpr, HAS_BIAS: tl.constexpr, GATED: tl.constexpr,
):  # fmt: skip
    """Split K finished without a second kernel: the last of the tile's programs to arrive
    (counted at counter_ptr[tile], which it sets back to 0 for the next product) adds every
    split's partial sums (and squares) and stores the output."""
    # Every thread's partials are written before the count says so (release); the last to
    # arrive sees every split's (acquire), read past L1, which may hold no copy anyway.
    tl.debug_barrier()
    splits = tl.num_programs(1)
    arrived = tl.atomic_add(counter_ptr + tile, 1, sem="acq_rel")
    if arrived == splits - 1:
        gate = tl.zeros(out_mask.shape, dtype=tl.float32)
        up = tl.zeros(out_mask.shape, dtype=tl.float32)
        squares_sum = tl.zeros(rows.shape, dtype=tl.float32)
        for other in range(splits):
            from_split = partial_ptr + other * stride_split + at
            gate += tl.load(from_split, mask=out_mask, other=0.0, cache_modifier=".cg")
            if GATED:
                up += tl.load(from_split + num_channels, mask=out_mask, other=0.0,
                              cache_modifier=".cg")  # fmt: skip
            if NORMED:
                squares_at = (tile * splits + other) * num_rows + rows
                squares_sum += tl.load(squares_ptr + squares_at, mask=rows < num_rows,
                                       other=0.0, cache_modifier=".cg")  # fmt: skip
        store_output(gate, up, squares_sum, scale_ptr, bias_ptr, out_ptr, channels, rows,
                      num_channels, depth, stride_out, eps, out_mask, NORMED, SCALED, HAS_BIAS,
                      GATED)  # fmt: skip
        tl.atomic_xchg(counter_ptr + tile, 0)


@triton.jit
def store_output(
    gate, up, squares_sum, scale_ptr, bias_ptr, out_ptr, channels, rows, num_channels, depth,
    stride_out, eps, out_mask, NORMED: tl.constexpr, SCALED: tl.constexpr,
    HAS_BIAS: tl.constexpr, GATED: tl.constexpr,
):  # fmt: skip
    """The sums [BLOCK_N, BLOCK_M] (NORMED: times 1 / rms) through the epilogue, rounded into
    the output rows."""
    if NORMED:
        inv_rms = inverse_rms(squares_sum, depth, eps)[None, :]
        gate, up = gate * inv_rms, up * inv_rms
    y = _epilogue(gate, up, scale_ptr, bias_ptr, channels, num_channels, SCALED, HAS_BIAS, GATED)
    tl.store(out_ptr + rows[None, :] * stride_out + channels[:, None],
             y.to(out_ptr.dtype.element_ty), mask=out_mask)  # fmt: skip


@triton.jit
def reduce_kernel(
    partial_ptr, scale_ptr, bias_ptr, out_ptr, squares_ptr, num_splits, num_rows, num_channels,
    depth, stride_split, stride_out, eps, SCALED: tl.constexpr, HAS_BIAS: tl.constexpr,
    GATED: tl.constexpr, NORMED: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """One program per (row, block of channels): the partials' sum, then the epilogue (NORMED:
    first 1 / rms from the slices' sums of squares)."""
    wait_for_previous_kernel(PDL)
    row = tl.program_id(0)
    channels = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = channels < num_channels
    width = num_channels * 2 if GATED else num_channels
    gate = tl.zeros((BLOCK,), dtype=tl.float32)
    up = tl.zeros((BLOCK,), dtype=tl.float32)
    squares_sum = tl.zeros((1,), dtype=tl.float32)
    for split in range(num_splits):
        base = partial_ptr + split * stride_split + row * width + channels
        gate += tl.load(base, mask=mask, other=0.0)
        if GATED:
            up += tl.load(base + num_channels, mask=mask, other=0.0)
        if NORMED:
            squares_sum += tl.load(squares_ptr + split * num_rows + row + tl.arange(0, 1))
    if NORMED:
        inv_rms = inverse_rms(squares_sum, depth, eps)
        gate, up = gate * inv_rms, up * inv_rms
    y = _epilogue(gate[:, None], up[:, None], scale_ptr, bias_ptr, channels, num_channels, SCALED,
                  HAS_BIAS, GATED)  # fmt: skip
    tl.store(out_ptr + row * stride_out + channels[:, None], y.to(out_ptr.dtype.element_ty),
             mask=mask[:, None])  # fmt: skip
