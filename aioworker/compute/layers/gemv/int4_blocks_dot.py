"""int4's blocks layout (int4_blocks.py) on tensor cores: 1 to 8 rows, padded to 16, at the cost of
one row.

The FMA tiles multiply each weight once per row; the tensor cores multiply a bf16 tile by all the
rows at once, so what a weight costs is its widening alone. Here a word's eight values widen as
four bf16 pairs, each (value t, value t + 4), t = 0..3, by PTX (`_PAIRS_AS_BF16`):

- rotated right by 4 t, the word holds value t at bits 3..6 and value t + 4 at bits 19..22 (the
  layout rotates each word left by 3): one LOP3 puts both under bf16's exponent of 2^7, the
  pair (128 + 8 q, 128 + 8 q'), exact in bf16's seven mantissa bits;
- minus 192, times s / 8 (exact: a power of two) plus o, both packed: (q - 8) s + o, rounded to
  bf16 once, where the format's own dequantization to bf16 rounds twice.

That is 15 instructions a word, ~1.9 a weight. The loop spends ~2.9 a weight in all with one
pipeline stage (tools/sass_mix.py int4-blocks dot 128x256 --stages 1, Triton 3.6): under the
~3.9 an SM can issue at the copy rate of 0.5-byte weights, for every row count.

Each word is loaded whole and split into its two int16 halves by `tl.join`, whose new axis is
always a thread's two neighbouring registers: one asm instance (pack=2) takes two neighbours, so
this is what makes it take one word's two halves and give one pair's two values. The tile's
columns are in the order the pairs come out, not K's (`in_k_order`): the step's blocks in groups
of four, a pair's two values neighbouring columns, and a thread's columns in the tensor cores'
layout (pairs c and c + 4 of each 16) one block's. The first version loaded int16 halves and put
the word last in the columns: the compiler gave the asm the tensor cores' layout, whose
neighbouring registers held neighbouring words, so it paired halves of two words. Triton's
interpreter, which runs no PTX, could not see it; on the H200 it was 70-90% wrong. A product sums
over K, so x's slice, loaded in K's order, is put in the columns' order (x is 1 to 16 rows, W up
to 128): loaded in the columns' order, a value at a time, x cost 0.6 instructions a weight more.
Rows of another dtype than bf16, and the interpreter (ASM = 2), get the same tile from Triton's
operations, in float32.

With `Tiles.bits` a step lies within one group (groups of 64 or 128: a step of at most a group),
and the tile is left as the LOP3 makes it: 128 + 8 q, exact in bf16 (`_RAW_PAIRS_AS_BF16`, 7
instructions a word, ~0.9 a weight). The tensor cores multiply those, and what the values lack
comes off the step's sums once per channel and row (`group_scaled`): the sum is
d = sum x (128 + 8 q), so sum x (q - 8) = (d - 192 X) / 8 with X the step's sum of x, and the
product adds s (d - 192 X) / 8 + o X, computed as s/8 d + (o - 24 s) X. The float32 sums keep
x (128 + 8 q) to ~2^-24 of ~200 |x|: taking 24 s X off costs ~2^-17 of a step's sum, where the
bf16 tile would round each value to 2^-9. What the tile saves (a subtract and an FMA a pair, 1.0
instruction a weight), the step's sums of x (16 padded rows widened and added) and the two FMAs
on the [N, 16] sums take much of back: ~2.5 a weight against ~2.8 (tools/sass_mix.py, 128x128,
groups of 128). Unnormed x's sums come from its rows loaded again, 8 or one (X_ROWS): 2.4, and
2.3 at one row, under the FMA tiles' 3.2. Which is faster is the sweep's to say.
"""

from __future__ import annotations

import triton
import triton.language as tl

from aioworker.compute.layers.gemv.int4_blocks import BLOCK, ROTATION
from aioworker.compute.layers.gemv.widening import lop3_rotations_ptx

# Blocks a step's columns interleave, so that a thread of the tensor cores' layout takes one
# block's words (the module's note); a step of fewer blocks is one group.
GROUP = tl.constexpr(4)


def _pairs_ptx(scaled: bool) -> str:
    """PTX taking $4, a word of the blocks layout (as two int16), to $0..$3, pair t = (value t,
    value t + 4) as bf16x2: the word rotated right by 4 t, its two values' bits kept under k and
    bf16's exponent of 2^7 set elsewhere (LUT 0x62 on (a, b = k, c = the immediate) is
    (a & b & ~c) | (~b & c)), which is 128 + 8 q. `scaled`: then less 192 (c) and times s / 8
    ($5) plus o ($6), each twice: (q - 8) s + o; else left raw, for `group_scaled`."""
    if not scaled:
        return lop3_rotations_ptx("$4", 0x00780078, tuple(
            (f"${t}", 4 * t, 0x43004300, 0x62) for t in range(4)))  # fmt: skip
    outputs = tuple(
        ("v", 4 * t, 0x43004300, 0x62, "sub.rn.bf16x2 v, v, c;", f"fma.rn.bf16x2 ${t}, v, $5, $6;")
        for t in range(4)
    )
    return lop3_rotations_ptx("$4", 0x00780078, outputs, ("mov.b32 c, 0x43404340;",), ("c", "v"))


_PAIRS_AS_BF16 = tl.constexpr(_pairs_ptx(scaled=True))
_RAW_PAIRS_AS_BF16 = tl.constexpr(_pairs_ptx(scaled=False))
RAW_OFFSET = tl.constexpr(192.0)  # a raw value is 128 + 8 q = 8 (q - 8) + 192
RAW_SCALE = tl.constexpr(0.125)


@triton.jit
def in_k_order(x, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """x [rows, BLOCK_K], loaded in K's order (vector loads), its columns put in the order
    `dequantized_tile` gives W's: the step's blocks in groups of G, column
    (((g 4 + u) 2 + t1) 2 + t0) G + c) 2 + h holding block g G + c's value t + 4 h
    (t = 2 t1 + t0) of word u. (Loaded in that order, x took a scalar load and an address a
    value: no two neighbouring columns are neighbours in K.)"""
    G: tl.constexpr = min(GROUP, BLOCK_K // BLOCK)
    S: tl.constexpr = BLOCK_K // BLOCK // G
    by_k = tl.reshape(x, (BLOCK_M, S, G, 2, 2, 2, 4))  # [rows, g, c, h, t1, t0, u]
    return tl.reshape(tl.permute(by_k, (0, 1, 6, 4, 5, 2, 3)), (BLOCK_M, BLOCK_K))


@triton.jit
def dequantized_tile(
    words, s, o, dtype: tl.constexpr, ASM: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):  # fmt: skip
    """One step of K of W's rows as (q - 8) s + o in `dtype`, its columns in `in_k_order`'s, from
    what `int4_blocks.blocks_operands` read: the words [N, BLOCK_K / 32, 4] and each block's
    scale and offset [N, BLOCK_K / 32]."""
    BLOCKS: tl.constexpr = BLOCK_K // BLOCK
    if ASM == 1:
        tile = _pairs_by_ptx(words, s, o, BLOCK_N, BLOCKS)
    else:
        tile = _pairs_by_triton(words, s.to(tl.float32), o.to(tl.float32), BLOCK_N, BLOCKS)
        tile = tile.to(dtype)
    # [N, groups, c, u, h, t0, t1] to the columns' order, in_k_order's
    return tl.reshape(tl.permute(tile, (0, 1, 3, 6, 5, 2, 4)), (BLOCK_N, BLOCK_K))


@triton.jit
def raw_tile(words, dtype: tl.constexpr, ASM: tl.constexpr, BLOCK_N: tl.constexpr,
             BLOCK_K: tl.constexpr):  # fmt: skip
    """One step of K of W's rows as 128 + 8 q in `dtype` (exact in bf16, fp16 and float32), its
    columns in `in_k_order`'s, from the words [N, BLOCK_K / 32, 4]: for `group_scaled`."""
    BLOCKS: tl.constexpr = BLOCK_K // BLOCK
    if ASM == 1:
        halves = tl.join(words.to(tl.int16), (words >> 16).to(tl.int16))
        pairs = tl.inline_asm_elementwise(
            _RAW_PAIRS_AS_BF16, "=r,=r,=r,=r,r", [halves], dtype=(tl.bfloat16,) * 4,
            is_pure=True, pack=2,
        )  # fmt: skip
        tile = in_pair_order(pairs[0], pairs[1], pairs[2], pairs[3], BLOCK_N, BLOCKS)
    else:
        tile = _pairs_by_triton(words, 0.0, 0.0, BLOCK_N, BLOCKS, RAW=True).to(dtype)
    return tl.reshape(tl.permute(tile, (0, 1, 3, 6, 5, 2, 4)), (BLOCK_N, BLOCK_K))


@triton.jit
def group_scaled(acc, sums, x_sums, s, o):
    """acc [N, rows] plus a step's product within one group: `sums` [N, rows] of x times the raw
    tile, `x_sums` [rows] of x over the step, s and o [N, 1] the group's scale and offset."""
    # s (d - 192 X) / 8 + o X as s/8 d + (o - 24 s) X: two FMAs an element, the per-channel
    # factors made once a step in float32 (24 s exactly; o - 24 s rounded once, to 2^-24)
    s = s.to(tl.float32)
    x_factor = o.to(tl.float32) - RAW_OFFSET * RAW_SCALE * s
    return acc + sums * (s * RAW_SCALE) + x_factor * x_sums[None, :]


@triton.jit
def _pairs_by_ptx(packed, s, o, BLOCK_N: tl.constexpr, BLOCKS: tl.constexpr):
    """bf16 pairs in `in_pair_order`'s shape. Each word is split into two int16, so that one asm
    instance takes the word's two halves and gives two bf16 a register: the halves are
    neighbours in the joined tensor and the pair's values in the tile (the module's note)."""
    # Each word's two halves, joined: a new last axis, so always neighbours in a thread's registers
    words = tl.join(packed.to(tl.int16), (packed >> 16).to(tl.int16))
    eighth_s = (s.to(tl.float32) * 0.125).to(tl.bfloat16)  # exact: a power of two
    scales = tl.broadcast_to(eighth_s[:, :, None, None], words.shape)
    offsets = tl.broadcast_to(o.to(tl.bfloat16)[:, :, None, None], words.shape)
    pairs = tl.inline_asm_elementwise(
        _PAIRS_AS_BF16, "=r,=r,=r,=r,r,r,r", [words, scales, offsets],
        dtype=(tl.bfloat16,) * 4, is_pure=True, pack=2,
    )  # fmt: skip
    return in_pair_order(pairs[0], pairs[1], pairs[2], pairs[3], BLOCK_N, BLOCKS)


@triton.jit
def in_pair_order(pair0, pair1, pair2, pair3, BLOCK_N: tl.constexpr, BLOCKS: tl.constexpr):
    """Four [N, blocks, 4, 2] tensors, pair t's (value t, value t + 4) of each word, as one
    [N, groups, G, 4, 2, 2, 2]: (group of blocks, block in it, word, half, t % 2, t // 2)."""
    G: tl.constexpr = min(GROUP, BLOCKS)
    shape: tl.constexpr = (BLOCK_N, BLOCKS // G, G, 4, 2)
    return tl.join(
        tl.join(tl.reshape(pair0, shape), tl.reshape(pair1, shape)),
        tl.join(tl.reshape(pair2, shape), tl.reshape(pair3, shape)),
    )


@triton.jit
def _pairs_by_triton(words, s, o, BLOCK_N: tl.constexpr, BLOCKS: tl.constexpr,
                     RAW: tl.constexpr = False):  # fmt: skip
    """The same values in float32 from Triton's operations, in `in_pair_order`'s shape (RAW:
    `raw_tile`'s, 128 + 8 q)."""
    G: tl.constexpr = min(GROUP, BLOCKS)
    bits = tl.reshape(words, (BLOCK_N, BLOCKS // G, G, 4)).to(tl.uint32, bitcast=True)
    unrotated = (bits >> ROTATION) | (bits << (32 - ROTATION))
    shifts = 4 * (  # [h, t % 2, t // 2]: value t + 4 h
        4 * tl.arange(0, 2)[:, None, None]
        + tl.arange(0, 2)[None, :, None]
        + 2 * tl.arange(0, 2)[None, None, :]
    )
    q = (unrotated[:, :, :, :, None, None, None] >> shifts[None, None, None, None, :, :, :]) & 0xF
    values = q.to(tl.float32) * 8.0 + 128.0  # RAW (no early return: a constexpr branch's is
    if not RAW:  # compiled through)
        s = tl.reshape(s, (BLOCK_N, BLOCKS // G, G))[:, :, :, None, None, None, None]
        o = tl.reshape(o, (BLOCK_N, BLOCKS // G, G))[:, :, :, None, None, None, None]
        values = (q.to(tl.float32) - 8.0) * s + o
    return values
