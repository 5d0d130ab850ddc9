"""Widening stored weights to float32 without conversion instructions.

A conversion (int to float, e4m3 to f16 to f32) issues at a quarter of the rate of a float add
on Hopper (16 a cycle per SM against 64 or 128), and at these batch sizes each weight element
is converted once per element read: at the copy rate an SM reads about 18 bytes a cycle, so an
e4m3 or int8 tile widened by conversion instructions cannot keep up (the sweeps measured both at
40-76% of copy bandwidth, bf16, which needs none, at 91-97%). The same values come exactly from
integer operations on the bits and one float add or multiply:

- int8 q: the float whose bits are 0x4B000000 | (q + 128) is 2^23 + 128 + q, exactly; subtract.
- a 4-bit q (0..15): 0x4B000000 | q is 2^23 + q; subtracting 2^23 + 8 gives q - 8, the signed
  value the int4 formats scale. In bf16 (0x4300 | q is 128 + q) and fp16 (0x6400 | q is
  1024 + q) the same, two bytes a value, for the tensor cores.
- int8, four a 32-bit word (`int8_words_as_float32`, compiled kernels): one XOR flips the four
  sign bits, one PRMT per value assembles the bytes of 0x4B000000 | (q + 128), one subtract.
  Triton's own code for the line above spends about 1.5 integer operations more per value
  (sm_90 SASS, tools/sass_mix.py), as it widens each byte to 32 bits first.
- e4m3 (sign, 4 exponent bits e, 3 mantissa bits m): placing its 7 low bits at bits 20..26 of a
  float32 gives 2^(e - 127) (1 + m/8), or for e = 0 the float32 subnormal (m/8) 2^-126: either
  way the value times 2^-120. One multiply by 2^120 restores it exactly. (e4m3fn's NaN byte
  would read as 480; quantized weights hold none.)
"""

from __future__ import annotations

import triton
import triton.language as tl

TWO_TO_120: tl.constexpr = tl.constexpr(2.0**120)
MAGIC: tl.constexpr = tl.constexpr(0x4B000000)  # the bits of 2^23 as float32
TWO_TO_23: tl.constexpr = tl.constexpr(8388608.0)


@triton.jit
def exact_float32(tile):
    """An e4m3, int8 or floating-point tile as float32 values."""
    if tile.dtype == tl.float8e4nv:
        bits = tile.to(tl.uint8, bitcast=True).to(tl.uint32)
        placed = ((bits & 0x7F) << 20) | ((bits & 0x80) << 24)
        widened = placed.to(tl.float32, bitcast=True) * TWO_TO_120
    elif tile.dtype == tl.int8:
        bits = (tile.to(tl.uint8, bitcast=True).to(tl.uint32) ^ 0x80) | MAGIC
        widened = bits.to(tl.float32, bitcast=True) - (TWO_TO_23 + 128.0)
    else:
        widened = tile.to(tl.float32)
    return widened


# $4: four int8 values, the first in the low byte; $0..$3: each as float32. prmt's selector
# 0x744n takes byte n of u, then bytes 0, 0 and 0x4B of m: the float 2^23 + (q + 128).
_INT8_WORD_AS_FLOAT32 = tl.constexpr("""{
    .reg .b32 u, m;
    xor.b32 u, $4, 0x80808080;
    mov.b32 m, 0x4B000000;
    prmt.b32 $0, u, m, 0x7440;
    prmt.b32 $1, u, m, 0x7441;
    prmt.b32 $2, u, m, 0x7442;
    prmt.b32 $3, u, m, 0x7443;
    sub.f32 $0, $0, 0f4B000080;
    sub.f32 $1, $1, 0f4B000080;
    sub.f32 $2, $2, 0f4B000080;
    sub.f32 $3, $3, 0f4B000080;
}""")


@triton.jit
def int8_words_as_float32(tile, ASM: tl.constexpr):
    """An int8 tile as float32, exactly: by PTX on whole words of four (ASM, compiled kernels),
    or, in Triton's interpreter, which runs no PTX, by `exact_float32`: the same values."""
    if ASM:
        widened = tl.inline_asm_elementwise(
            _INT8_WORD_AS_FLOAT32, "=r,=r,=r,=r,r", [tile], dtype=tl.float32, is_pure=True,
            pack=4,
        )  # fmt: skip
    else:
        widened = exact_float32(tile)
    return widened


# $2: four int8 values (k .. k + 3, the first in the low byte), loaded as two int16; $0: the
# values k and k + 1, $1: k + 2 and k + 3, each pair bf16x2. bf16 holds an int8 exactly but no
# magic number makes one in a LOP3 (128 + q needs eight mantissa bits, bf16 has seven), so
# each value is made of its nibbles, q = 16 hs + l (hs the signed high nibble): PRMT puts a
# pair's two bytes in the low bytes of the halves, a LOP3 puts their low nibbles under the
# exponent of 2^7 (128 + l), another their high nibbles with the sign bit flipped (LUT 0x6A:
# a ^ c under k, c elsewhere: 128 + hs + 8), two packed subtracts make l and hs exactly, and
# a packed FMA 16 hs + l, exact too (|q| <= 128).
def _int8_pair(out: str, selector: str) -> str:
    """PTX for the pair of bytes `selector` picks (0x4140: bytes 0 and 1; 0x4342: 2 and 3)."""
    return f"""
    prmt.b32 v, $2, z, {selector};
    lop3.b32 l, v, k, 0x43004300, 0xEA;
    sub.rn.bf16x2 l, l, c;
    prmt.b32 v, hi, z, {selector};
    lop3.b32 v, v, k, 0x43084308, 0x6A;
    sub.rn.bf16x2 v, v, d;
    fma.rn.bf16x2 {out}, v, s, l;"""


_INT8_PAIRS_AS_BF16 = tl.constexpr(
    """{
    .reg .b32 k, z, c, d, s, hi, v, l;
    mov.b32 k, 0x000F000F;
    mov.b32 z, 0;
    mov.b32 c, 0x43004300;
    mov.b32 d, 0x43084308;
    mov.b32 s, 0x41804180;
    shr.b32 hi, $2, 4;"""
    + _int8_pair("$0", "0x4140")
    + _int8_pair("$1", "0x4342")
    + "\n}"
)


@triton.jit
def int8_pairs_as_bf16(halves):
    """int8 values loaded as int16 [..., 2] (a word's two halves): (values k, k + 1; values
    k + 2, k + 3) of each word, two bf16 tensors shaped as `halves`, exactly, by PTX."""
    return tl.inline_asm_elementwise(
        _INT8_PAIRS_AS_BF16, "=r,=r,r", [halves], dtype=(tl.bfloat16, tl.bfloat16),
        is_pure=True, pack=2,
    )  # fmt: skip


@triton.jit
def signed_nibble(bits):
    """Int32 values q in 0..15 as the float32 q - 8."""
    return (bits | MAGIC).to(tl.float32, bitcast=True) - (TWO_TO_23 + 8.0)


@triton.jit
def signed_nibble_as(bits, dtype: tl.constexpr):
    """Int32 values q in 0..15 as q - 8 in `dtype`, exactly: in bf16 the bits 0x4300 | q are
    128 + q (seven mantissa bits hold 0..15), in fp16 0x6400 | q is 1024 + q."""
    if dtype == tl.bfloat16:
        values = (bits.to(tl.uint16) | 0x4300).to(tl.bfloat16, bitcast=True) - 136.0
    elif dtype == tl.float16:
        values = (bits.to(tl.uint16) | 0x6400).to(tl.float16, bitcast=True) - 1032.0
    else:
        values = signed_nibble(bits)
    return values.to(dtype)


def lop3_rotations_ptx(word: str, mask: int, outputs, setup=(), registers=()) -> str:
    """A PTX block that widens the 32-bit `word` by rotations and LOP3s, the pattern of every
    bit-placing widening here: each output (destination, rotation, immediate, lookup table,
    *lines after) is LOP3(`word` rotated right by `rotation` bits, k = `mask`, immediate) under
    the lookup table, followed by its lines after. One rotation per distinct amount, made
    first; `setup` lines before them, `registers` declared besides k and the rotations."""
    rotations = sorted({output[1] for output in outputs} - {0})
    rotated = {0: word, **{r: f"r{r}" for r in rotations}}
    lines = [f"mov.b32 k, {mask:#010x};", *setup]
    lines += [f"shf.r.wrap.b32 r{r}, {word}, {word}, {r};" for r in rotations]
    for destination, rotation, immediate, lut, *after in outputs:
        lines.append(
            f"lop3.b32 {destination}, {rotated[rotation]}, k, {immediate:#010x}, {lut:#04x};"
        )
        lines += after
    declared = ", ".join(["k", *(f"r{r}" for r in rotations), *registers])
    return "{\n    .reg .b32 " + declared + ";\n    " + "\n    ".join(lines) + "\n}"
