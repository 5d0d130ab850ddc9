"""One row times int4 weights in the blocks layout: the FMA tiles' int4 variant that an SM can
issue at the copy rate.

At 0.5 bytes a weight an H200 SM must finish a weight in about 4 issued instructions to keep up
with the copy bandwidth (132 SMs at ~1.98 GHz, 128 lanes each, against 8.5e12 weights a second).
The plain layouts (two values a byte, or eight a word in K's order) spend 7-10 (sm_90 SASS,
tools/sass_mix.py): a shift and a mask per value, a float subtract, and x loaded strided, one
value at a time. The blocks layout (`quantized/weight_only.pack_int4_blocks`, derived at load
time) cuts K into blocks of 32 and keeps each block in four int32 words, the value at
k = 32 b + 4 i + u in word u, at bits 4i+3 .. 4i+6 (each word rotated left by 3). Then

- a value's x is x[32 b + 4 i + u]: for one i the four words' x are contiguous, one vector
  load, shared by the rows a thread holds;
- a word gives its eight values to three rotations and eight LOP3s (PTX, `_WORD_AS_FLOAT32`):
  rotated right by 8 t, bits 15..18 and 19..22 hold values 3 + 2 t and 4 + 2 t (mod 8), the top
  of float32's mantissa; OR-ed under the exponents of 2^8 and 2^4 they are the float32 values
  256 + q and 16 + q, exactly. One mask register serves both (LUT 0x62: a & b where c is 0,
  c where b is 0);
- each value costs its LOP3 and its FMA, x (C + q) added to the block's sum; the offsets C
  (and the format's 8) come off once a block, as (C + 8) times x's sum over that block's
  values of each kind. C is the smallest the bits allow, so that little cancels: a float32 sum
  of x (256 + q) keeps x to ~2^-16, where the 8 + q of the plain magic (2^23 + q) would lose
  all of it.

A block's sum is then scaled as int4_row.py's groups are: w = (q - 8) s + o gives
s * sum (q - 8) x + o * sum x. The compiled loop spends ~3.4 instructions a weight with eight
rows a thread sharing x, under the GPU machine's Triton 3.6 and 3.9 alike (tools/sass_mix.py
int4-blocks fma 64x256 --warps 2: 3.39 and 3.33; 4.50 under 3.6 while the words were loaded as
[rows, blocks, 4], where it gave a thread one row and every block), and the tensor-core variant
(int4_blocks_dot.py) ~3.5 at any row count; the sweep chooses. Triton's interpreter runs no
PTX: there (ASM = 2) the same values come from Triton's operations.
"""

from __future__ import annotations

import triton
import triton.language as tl

from aioworker.compute.layers.gemv.widening import lop3_rotations_ptx
from aioworker.compute.layers.quantized.weight_only import BLOCKS_ROTATION, INT4_BLOCK

BLOCK = tl.constexpr(INT4_BLOCK)  # K values a block of four words holds
ROTATION = tl.constexpr(BLOCKS_ROTATION)  # bits each stored word is rotated left by
# Each rotation's two values: (the nibble of the word, the float offset C it is read with).
SLOT_A_OFFSET = tl.constexpr(256.0)  # bits 15..18 under the exponent of 2^8
SLOT_B_OFFSET = tl.constexpr(16.0)  # bits 19..22 under the exponent of 2^4

# $8: a word of the blocks layout; $0..$7: rotations t = 0..3, each giving slot A (bits 15..18,
# 0x43800000: 256 + q) then slot B (bits 19..22, 0x41800000: 16 + q). LUT 0x62 on (a = the
# rotated word, b = k, c = the immediate) is (a & b & ~c) | (~b & c): k = 0x007F8000 keeps both
# slots' bits, the immediate clears the other slot's and sets the exponent.
_WORD_AS_FLOAT32 = tl.constexpr(lop3_rotations_ptx("$8", 0x007F8000, tuple(
    (f"${2 * t + slot}", 8 * t, (0x43F80000, 0x41878000)[slot], 0x62)
    for t in range(4) for slot in (0, 1)
)))  # fmt: skip


@triton.jit
def blocks_operands(
    w_ptr, group_scale_ptr, group_offset_ptr, w_rows, in_range, k0, stride_w, stride_group_row,
    stride_group, depth, EVEN_K: tl.constexpr, INT4_GROUP: tl.constexpr, BLOCK_K: tl.constexpr,
    ONE_GROUP: tl.constexpr = False,
):  # fmt: skip
    """What one step of K from k0 reads of W's rows `w_rows` (blocks layout, [N, K / 8] int32):
    the words [rows, BLOCK_K / 32, 4], and each block's group scale and offset [rows,
    BLOCK_K / 32] as stored (ONE_GROUP, a step within one group: the group's, [rows, 1]).
    Loaded apart from their use, so that a step can be read while the one before is multiplied
    (Tiles.ahead). Rows past N read row 0 (their sums are never stored: no load is predicated
    per row); past K: zeros."""
    BLOCKS: tl.constexpr = BLOCK_K // BLOCK
    blocks = k0 // BLOCK + tl.arange(0, BLOCKS)
    w_rows = tl.where(in_range, w_rows, 0)
    at = (
        w_rows[:, None] * stride_group_row
        + block_groups(blocks, INT4_GROUP)[None, :] * stride_group
    )
    # The step's words of a row, contiguous: loaded as [rows, words] so that the compiler sees
    # them contiguous and gives a thread a block of several rows, whose x it then shares (as a
    # [rows, blocks, 4] pointer tensor, Triton 3.6 gave each thread one row and every block)
    units = (k0 // BLOCK) * 4 + tl.arange(0, BLOCK_K // 8)  # a block's 4 words: 16 bytes aligned
    words_at = w_rows[:, None] * stride_w + units[None, :]
    if EVEN_K:
        words = tl.load(w_ptr + words_at)
    else:  # a split may pass K
        words = tl.load(w_ptr + words_at, mask=(units < depth // 8)[None, :], other=0)
    if ONE_GROUP:  # [rows, 1]: the step's group (past K: zeros)
        group_at = w_rows[:, None] * stride_group_row + (k0 // INT4_GROUP) * stride_group
        in_k = tl.full((1, 1), k0, tl.int32) < depth
        s = tl.load(group_scale_ptr + group_at, mask=in_k, other=0.0)
        o = tl.load(group_offset_ptr + group_at, mask=in_k, other=0.0)
    elif EVEN_K and INT4_GROUP > BLOCK and BLOCK_K >= INT4_GROUP:
        # whole groups of several blocks: each group's scale loaded once, then spread over its
        # blocks (a load per block would repeat the address arithmetic of each)
        groups = k0 // INT4_GROUP + tl.arange(0, BLOCK_K // INT4_GROUP)
        group_at = w_rows[:, None] * stride_group_row + groups[None, :] * stride_group
        s = _spread(tl.load(group_scale_ptr + group_at), INT4_GROUP // BLOCK)
        o = _spread(tl.load(group_offset_ptr + group_at), INT4_GROUP // BLOCK)
    elif EVEN_K:
        s = tl.load(group_scale_ptr + at)
        o = tl.load(group_offset_ptr + at)
    else:
        group_mask = (blocks < depth // BLOCK)[None, :]
        s = tl.load(group_scale_ptr + at, mask=group_mask, other=0.0)
        o = tl.load(group_offset_ptr + at, mask=group_mask, other=0.0)
    return tl.reshape(words, (w_rows.shape[0], BLOCKS, 4)), s, o


@triton.jit
def int4_block_step(
    acc, x_ptr, words, s, o, k0, depth, ASM: tl.constexpr, EVEN_K: tl.constexpr,
    BLOCK_K: tl.constexpr,
):  # fmt: skip
    """acc [rows, BLOCK_K / 32] (float32) plus row 0 of x times one step of K from k0 of W's
    rows, as `blocks_operands` read them: summed per block of 32 and scaled by the block's
    group. ASM: widened by PTX (1) or, in the interpreter, by Triton's operations on the same
    bits (2)."""
    BLOCKS: tl.constexpr = BLOCK_K // BLOCK
    values = _words_as_float32(words, ASM)
    # x for value i of every word: x[32 b + 4 i + u], [blocks, 4], loaded and widened once for
    # the rows a thread holds, then broadcast over them (loaded in the words' full shape,
    # Triton 3.6 loads and widens it once per row a thread holds)
    # offsets from the step's first x, known to the compiler: immediates of one address
    first_ks = tl.arange(0, BLOCKS)[:, None] * BLOCK + tl.arange(0, 4)[None, :]
    x_step = x_ptr + k0
    for t in tl.static_range(4):  # unrolled: the sums begin at t = 0
        x_a = _x_at(x_step, first_ks + 4 * ((3 + 2 * t) % 8), depth - k0, EVEN_K)[None]
        x_b = _x_at(x_step, first_ks + 4 * ((4 + 2 * t) % 8), depth - k0, EVEN_K)[None]
        if t == 0:  # no adds to zero: they are not free, and not dropped (-0.0)
            sums = values[0] * x_a
            x_sum_a, x_sum_b = x_a, x_b
        else:
            sums += values[2 * t] * x_a
            x_sum_a += x_a
            x_sum_b += x_b
        sums += values[2 * t + 1] * x_b
    x_a_total = tl.sum(x_sum_a, axis=2)
    x_b_total = tl.sum(x_sum_b, axis=2)
    signed_sums = (tl.sum(sums, axis=2) - (SLOT_A_OFFSET + 8.0) * x_a_total
                   - (SLOT_B_OFFSET + 8.0) * x_b_total)  # fmt: skip
    return acc + signed_sums * s.to(tl.float32) + o.to(tl.float32) * (x_a_total + x_b_total)


@triton.jit
def _spread(per_group, BLOCKS_A_GROUP: tl.constexpr):
    """[rows, groups] -> [rows, groups * BLOCKS_A_GROUP]: each group's value for its blocks."""
    rows: tl.constexpr = per_group.shape[0]
    groups: tl.constexpr = per_group.shape[1]
    spread = tl.broadcast_to(per_group[:, :, None], (rows, groups, BLOCKS_A_GROUP))
    return tl.reshape(spread, (rows, groups * BLOCKS_A_GROUP))


@triton.jit
def block_groups(blocks, INT4_GROUP: tl.constexpr):
    """The scale group of each block of 32 (the blocks themselves for groups of 32, said so
    that the scales' loads stay contiguous, hence vectorized, to the compiler)."""
    if INT4_GROUP == BLOCK:  # noqa: SIM108 - a constexpr branch
        groups = blocks
    else:
        groups = blocks * BLOCK // INT4_GROUP
    return groups


@triton.jit
def _x_at(x_ptr, ks, depth, EVEN_K: tl.constexpr):
    """x's bf16 values at `ks` (those at `depth` or past it: zeros) as float32, by a shift (a
    conversion instruction would not be shared between the tile's rows: those loading the same
    x reuse one load and one shift)."""
    if EVEN_K:  # noqa: SIM108 - a constexpr branch: the masked load is not compiled
        x = tl.load(x_ptr + ks)
    else:
        x = tl.load(x_ptr + ks, mask=ks < depth, other=0.0)
    if x.dtype == tl.bfloat16:
        widened = (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    else:
        widened = x.to(tl.float32)
    return widened


@triton.jit
def _words_as_float32(words, ASM: tl.constexpr):
    """Eight float32 tensors shaped as `words`: rotation t's slot A (256 + q), then its slot B
    (16 + q), for t = 0..3."""
    if ASM == 1:
        values = tl.inline_asm_elementwise(
            _WORD_AS_FLOAT32, "=r,=r,=r,=r,=r,=r,=r,=r,r", [words],
            dtype=(tl.float32,) * 8, is_pure=True, pack=1,
        )  # fmt: skip
    else:
        bits = words.to(tl.uint32, bitcast=True)
        values = (
            _slot_a(bits), _slot_b(bits), _slot_a(_rotr(bits, 8)), _slot_b(_rotr(bits, 8)),
            _slot_a(_rotr(bits, 16)), _slot_b(_rotr(bits, 16)), _slot_a(_rotr(bits, 24)),
            _slot_b(_rotr(bits, 24)),
        )  # fmt: skip
    return values


@triton.jit
def _rotr(bits, n: tl.constexpr):
    return (bits >> n) | (bits << (32 - n))


@triton.jit
def _slot_a(bits):
    return ((bits & 0x78000) | 0x43800000).to(tl.float32, bitcast=True)


@triton.jit
def _slot_b(bits):
    return ((bits & 0x780000) | 0x41800000).to(tl.float32, bitcast=True)
