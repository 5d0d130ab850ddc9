"""Loading a tile of W for the small-rows kernels, widened for the multiply: a weight format is
a variant of this load, not a copy of the kernel (kernels.py)."""

from __future__ import annotations

import triton
import triton.language as tl

from aioworker.compute.layers.gemv.widening import (
    exact_float32,
    int8_pairs_as_bf16,
    int8_words_as_float32,
    signed_nibble_as,
)


@triton.jit
def weight_tile(
    w_ptr, group_scale_ptr, group_offset_ptr, w_rows, in_range, k0, stride_w, stride_group_row,
    stride_group, depth, compute_dtype, BITS: tl.constexpr, EVEN_K: tl.constexpr,
    INT4_GROUP: tl.constexpr, INT4_PER_UNIT: tl.constexpr, INT4_LOW_FIRST: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, WORDS: tl.constexpr = 0,
):  # fmt: skip
    """W's rows `w_rows` at columns k0 .. k0 + BLOCK_K, widened to compute_dtype (BITS: float32
    by bit operations, widening.py, not conversion instructions): a stored dtype
    as it is (bf16, e4m3, int8), or with INT4_GROUP, 4-bit values packed INT4_PER_UNIT to a
    stored unit (2 a byte, the first in the high bits, as quantized/weight_only.py packs; 8 an
    int32, the first in the low bits, as compressed-tensors does), w = (q - 8) s + o per group
    of columns. WORDS (int8, float32 tiles): widened four a word by PTX (1), or by Triton's
    operations on the same bits where the interpreter runs the kernel (2)."""
    # Compiled Triton keeps one return per function: a constexpr branch that returns early would
    # still compile the code after it (the interpreter does not), so each branch is a function.
    if INT4_GROUP == 0:
        w = _stored_tile(w_ptr, w_rows, in_range, k0, stride_w, depth, EVEN_K, BLOCK_K)
    else:
        w = _int4_tile(
            w_ptr, group_scale_ptr, group_offset_ptr, w_rows, in_range, k0, stride_w,
            stride_group_row, stride_group, depth, BITS, EVEN_K, INT4_GROUP, INT4_PER_UNIT,
            INT4_LOW_FIRST, BLOCK_N, BLOCK_K,
        )  # fmt: skip
    if WORDS:
        widened = int8_words_as_float32(w, WORDS == 1)
    elif BITS:
        widened = exact_float32(w).to(compute_dtype)
    else:
        widened = w.to(compute_dtype)
    return widened


@triton.jit
def _stored_tile(w_ptr, w_rows, in_range, k0, stride_w, depth, EVEN_K: tl.constexpr,
                 BLOCK_K: tl.constexpr):  # fmt: skip
    """W's rows at columns k0 .. k0 + BLOCK_K as stored (bf16, e4m3, int8)."""
    ks = k0 + tl.arange(0, BLOCK_K)
    mask = in_range[:, None]
    if not EVEN_K:
        mask = mask & (ks[None, :] < depth)
    return tl.load(w_ptr + w_rows[:, None] * stride_w + ks[None, :], mask=mask, other=0.0)


@triton.jit
def _int4_tile(
    w_ptr, group_scale_ptr, group_offset_ptr, w_rows, in_range, k0, stride_w, stride_group_row,
    stride_group, depth, BITS: tl.constexpr, EVEN_K: tl.constexpr, INT4_GROUP: tl.constexpr,
    INT4_PER_UNIT: tl.constexpr, INT4_LOW_FIRST: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):  # fmt: skip
    """W's rows at columns k0 .. k0 + BLOCK_K from 4-bit values, dequantized (float32)."""
    q = int4_values(w_ptr, w_rows, in_range, k0, stride_w, depth, tl.float32, BITS, EVEN_K,
                    INT4_PER_UNIT, INT4_LOW_FIRST, BLOCK_N, BLOCK_K)  # fmt: skip
    if BLOCK_K <= INT4_GROUP:
        s, o = int4_group_scales(group_scale_ptr, group_offset_ptr, w_rows, in_range, k0,
                                 stride_group_row, stride_group, depth, INT4_GROUP)  # fmt: skip
        w = q * s[:, None] + o[:, None]
    else:
        GROUPS: tl.constexpr = BLOCK_K // INT4_GROUP
        groups = k0 // INT4_GROUP + tl.arange(0, GROUPS)
        at = w_rows[:, None] * stride_group_row + groups[None, :] * stride_group
        group_mask = in_range[:, None] & (groups[None, :] < depth // INT4_GROUP)
        s = tl.load(group_scale_ptr + at, mask=group_mask, other=0.0).to(tl.float32)
        o = tl.load(group_offset_ptr + at, mask=group_mask, other=0.0).to(tl.float32)
        q3 = tl.reshape(q, (BLOCK_N, GROUPS, INT4_GROUP))
        w = tl.reshape(q3 * s[:, :, None] + o[:, :, None], (BLOCK_N, BLOCK_K))
    return w


@triton.jit
def int4_values(
    w_ptr, w_rows, in_range, k0, stride_w, depth, dtype: tl.constexpr, BITS: tl.constexpr,
    EVEN_K: tl.constexpr, INT4_PER_UNIT: tl.constexpr, INT4_LOW_FIRST: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """W's 4-bit values q at columns k0 .. k0 + BLOCK_K as q - 8 in `dtype`: by bit operations
    with BITS (widening.py), else by conversion. Units past K read as 0 (then q - 8 = -8: the
    columns of x there are zeros)."""
    units = k0 // INT4_PER_UNIT + tl.arange(0, BLOCK_K // INT4_PER_UNIT)
    mask = in_range[:, None]
    if not EVEN_K:
        mask = mask & (units[None, :] < depth // INT4_PER_UNIT)
    packed = tl.load(w_ptr + w_rows[:, None] * stride_w + units[None, :], mask=mask, other=0)
    place = tl.arange(0, INT4_PER_UNIT)
    shifts = 4 * place if INT4_LOW_FIRST else 4 * (INT4_PER_UNIT - 1 - place)
    q = ((packed[:, :, None] >> shifts[None, None, :]) & 0xF).to(tl.int32)
    signed = signed_nibble_as(q, dtype) if BITS else (q.to(tl.float32) - 8.0).to(dtype)
    return tl.reshape(signed, (BLOCK_N, BLOCK_K))


@triton.jit
def int4_group_scales(group_scale_ptr, group_offset_ptr, w_rows, in_range, k0,
                      stride_group_row, stride_group, depth, INT4_GROUP: tl.constexpr):  # fmt: skip
    """The scale and offset [BLOCK_N] (float32) of the group of K holding column k0, per row.
    Columns past K are zeros of x and their weights zeros too: no scale is read past K (a stray
    inf or NaN there would poison the sum)."""
    group = tl.zeros_like(w_rows) + k0 // INT4_GROUP
    at = w_rows * stride_group_row + group * stride_group
    group_mask = in_range & (group < depth // INT4_GROUP)  # a last split's tile may be past K
    s = tl.load(group_scale_ptr + at, mask=group_mask, other=0.0).to(tl.float32)
    o = tl.load(group_offset_ptr + at, mask=group_mask, other=0.0).to(tl.float32)
    return s, o


@triton.jit
def int8_pairs_tile(w_ptr, w_rows, in_range, k0, stride_w, depth, EVEN_K: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    """int8 W's rows at columns k0 .. k0 + BLOCK_K as bf16, exactly, two values a register by
    PTX (widening.py), for the tensor cores (`words` on dot tiles, bf16 rows). W is read as int16
    (K and the row stride multiples of 4: the product checks); rows past N read row 0 (their
    sums are never stored), so no load needs a predicate per element."""
    halves = _int8_word_halves(w_ptr, w_rows, in_range, k0, stride_w, depth, EVEN_K, BLOCK_N,
                               BLOCK_K)  # fmt: skip
    pairs = int8_pairs_as_bf16(halves)
    return int8_pairs_in_k_order(pairs[0], pairs[1], BLOCK_N, BLOCK_K)


@triton.jit
def _int8_word_halves(w_ptr, w_rows, in_range, k0, stride_w, depth, EVEN_K: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    """int8 W's rows at columns k0 .. k0 + BLOCK_K read as int16, [N, words, 2]: each 32-bit
    word's two halves, the shape the PTX widenings take a word in (pack=2). Rows past N read
    row 0; past K: zeros."""
    rows = tl.where(in_range, w_rows, 0)
    halves = k0 // 2 + tl.arange(0, BLOCK_K // 2)
    at = rows[:, None] * (stride_w // 2) + halves[None, :]
    if EVEN_K:
        flat = tl.load(w_ptr.to(tl.pointer_type(tl.int16)) + at)
    else:
        in_k = (halves * 2 < depth)[None, :]
        flat = tl.load(w_ptr.to(tl.pointer_type(tl.int16)) + at, mask=in_k, other=0)
    return tl.reshape(flat, (BLOCK_N, BLOCK_K // 4, 2))


@triton.jit
def int8_pairs_in_k_order(pair0, pair1, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Each word's pairs (k, k + 1) and (k + 2, k + 3), [N, words, 2] each, as [N, K]."""
    joined = tl.join(pair0, pair1)  # [N, word, half, pair]
    return tl.reshape(tl.permute(joined, (0, 1, 3, 2)), (BLOCK_N, BLOCK_K))
