"""One row times int4 weights without widening W: the FMA tiles' int4 variant.

Widening every 4-bit value to its place in K and scaling it per group (kernels._int4_tile) costs
more registers and shuffles than the bytes are worth at one row. Here W's tile is loaded as
[channels, groups, units of a group], and each of a unit's 4-bit places is multiplied by the
x values it pairs with (loaded strided: x is tiny and cached), so no value moves. A group's
scale and offset factor out of its sum, w = (q - 8) s + o:

    sum_k w_k x_k = s * sum_k (q_k - 8) x_k + o * sum_k x_k

so the tile is summed per group, and scaled once per group. x may be normed in the kernel
(add_norm.py): each place's values add their squares.
"""

from __future__ import annotations

import triton
import triton.language as tl

from aioworker.compute.layers.gemv.add_norm import normed_values
from aioworker.compute.layers.gemv.widening import signed_nibble


@triton.jit
def int4_row_step(
    acc, squares_sum, x_ptr, w_ptr, group_scale_ptr, group_offset_ptr, residual_ptr,
    norm_weight_ptr, residual_out_ptr, write_sum, w_rows, in_range, k0, stride_w,
    stride_group_row, stride_group, depth, BITS: tl.constexpr, EVEN_K: tl.constexpr,
    INT4_GROUP: tl.constexpr, INT4_PER_UNIT: tl.constexpr, INT4_LOW_FIRST: tl.constexpr,
    NORMED: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """(acc [BLOCK_N, BLOCK_K / INT4_GROUP] (float32) plus row 0 of x times W's rows `w_rows`
    over columns k0 .. k0 + BLOCK_K, summed per group of columns; squares_sum [1] plus, NORMED,
    the squares of x's columns there). BITS: the 4-bit values widened by bit operations
    (widening.py)."""
    GROUPS: tl.constexpr = BLOCK_K // INT4_GROUP
    UNITS: tl.constexpr = INT4_GROUP // INT4_PER_UNIT  # stored units a group spans
    groups = k0 // INT4_GROUP + tl.arange(0, GROUPS)
    units = groups[:, None] * UNITS + tl.arange(0, UNITS)[None, :]  # [GROUPS, UNITS]
    mask = in_range[:, None, None]
    if not EVEN_K:
        mask = mask & (units[None, :, :] < depth // INT4_PER_UNIT)
    packed = tl.load(w_ptr + w_rows[:, None, None] * stride_w + units[None, :, :], mask=mask,
                     other=0)  # fmt: skip
    sums = tl.zeros(acc.shape, dtype=tl.float32)
    x_sums = tl.zeros((GROUPS,), dtype=tl.float32)
    for place in tl.static_range(INT4_PER_UNIT):
        shift = 4 * place if INT4_LOW_FIRST else 4 * (INT4_PER_UNIT - 1 - place)
        nibbles = (packed >> shift) & 0xF
        q = signed_nibble(nibbles.to(tl.int32)) if BITS else nibbles.to(tl.float32) - 8.0
        ks = units * INT4_PER_UNIT + place
        k_mask = ks < depth
        x, squares = normed_values(x_ptr, residual_ptr, norm_weight_ptr, residual_out_ptr, ks, ks,
                                   k_mask, k_mask, write_sum, NORMED, HAS_RESIDUAL)  # fmt: skip
        if NORMED:
            squares_sum += tl.sum(tl.sum(squares, axis=1), axis=0)
        x = x.to(tl.float32)
        sums += tl.sum(q * x[None, :, :], axis=2)
        x_sums += tl.sum(x, axis=1)
    # A last split's tile may lie past K: no scale is read there (a stray inf would poison it).
    group_mask = in_range[:, None] & (groups[None, :] < depth // INT4_GROUP)
    at = w_rows[:, None] * stride_group_row + groups[None, :] * stride_group
    s = tl.load(group_scale_ptr + at, mask=group_mask, other=0.0).to(tl.float32)
    o = tl.load(group_offset_ptr + at, mask=group_mask, other=0.0).to(tl.float32)
    return acc + sums * s + o * x_sums[None, :], squares_sum
