"""The PTX the small-rows kernels widen weights with (int4's blocks layout, int8's `words`), run on
the CPU by a small emulator of the instructions it uses: its masks, lookup tables, exponents,
byte selectors and rotations give the values the kernels pair with x (the GPU tests run the real
thing; this catches a wrong constant without one)."""

from __future__ import annotations

import re
import struct

import pytest
import torch

triton = pytest.importorskip("triton")  # interpreted without a GPU (tests/conftest.py)

from aioworker.compute.layers.gemv import int4_blocks, int4_blocks_dot, widening  # noqa: E402
from aioworker.compute.layers.quantized.weight_only import pack_int4_blocks  # noqa: E402

MASK = 0xFFFFFFFF


def _f32(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def _f32_bits(value: float) -> int:
    return struct.unpack("<I", struct.pack("<f", value))[0]


def _bf16_pair(bits: int) -> tuple[float, float]:
    halves = torch.tensor([bits & 0xFFFF, bits >> 16], dtype=torch.int32).to(torch.int16)
    return tuple(halves.view(torch.bfloat16).float().tolist())


def _pack_bf16(low: float, high: float) -> int:
    halves = torch.tensor([low, high], dtype=torch.float64).to(torch.bfloat16).view(torch.int16)
    low_bits, high_bits = (h & 0xFFFF for h in halves.tolist())
    return low_bits | high_bits << 16


def run_ptx(asm: str, inputs: dict[str, int]) -> dict[str, int]:
    """Registers after `asm` (mov, shf.r.wrap, lop3, sub.rn.bf16x2, fma.rn.bf16x2)."""
    regs = dict(inputs)

    def value(operand: str) -> int:
        if operand.startswith("0f"):  # a float32 literal, by its bits
            return int(operand[2:], 16)
        return int(operand, 0) & MASK if operand[0].isdigit() else regs[operand]

    for line in asm.splitlines():
        match = re.match(r"\s*([\w.]+)\s+(.*);", line)
        if not match or match.group(1) == ".reg":
            continue
        op, args = match.group(1), [a.strip() for a in match.group(2).split(",")]
        out, src = args[0], [value(a) for a in args[1:]]
        if op == "mov.b32":
            regs[out] = src[0]
        elif op == "shf.r.wrap.b32":  # funnel shift of (src[1]:src[0]) right: a rotation here
            regs[out] = ((src[1] << 32 | src[0]) >> (src[2] & 31)) & MASK
        elif op == "lop3.b32":
            a, b, c, lut = src
            regs[out] = sum(
                ((lut >> ((a >> i & 1) << 2 | (b >> i & 1) << 1 | (c >> i & 1))) & 1) << i
                for i in range(32)
            )
        elif op == "shr.b32":
            regs[out] = src[0] >> src[1]
        elif op == "xor.b32":
            regs[out] = src[0] ^ src[1]
        elif op == "prmt.b32":  # byte i of the result: byte (selector nibble i) of (b:a)
            pool = (src[1] << 32 | src[0]).to_bytes(8, "little")
            regs[out] = int.from_bytes(bytes(pool[src[2] >> 4 * i & 7] for i in range(4)), "little")
        elif op == "sub.f32":
            regs[out] = _f32_bits(_f32(src[0]) - _f32(src[1]))
        elif op == "sub.rn.bf16x2":
            (a0, a1), (b0, b1) = _bf16_pair(src[0]), _bf16_pair(src[1])
            regs[out] = _pack_bf16(a0 - b0, a1 - b1)
        elif op == "fma.rn.bf16x2":
            (a0, a1), (b0, b1), (c0, c1) = (_bf16_pair(s) for s in src)
            regs[out] = _pack_bf16(a0 * b0 + c0, a1 * b1 + c1)
        else:
            raise AssertionError(f"the emulator has no {op}")
    return regs


def _values_and_word(seed: int) -> tuple[list[int], int]:
    """A word of the blocks layout and its eight values (value i is k = 4 i of word 0)."""
    values = torch.randint(0, 16, (1, 32), generator=torch.Generator().manual_seed(seed))
    word = pack_int4_blocks(values)[0, 0].item() & MASK
    return values[0, 0::4].tolist(), word


@pytest.mark.parametrize("seed", range(8))
def test_fma_widening_gives_each_value_under_its_offset(seed: int) -> None:
    values, word = _values_and_word(seed)
    regs = run_ptx(int4_blocks._WORD_AS_FLOAT32.value, {"$8": word})
    got = [_f32(regs[f"${j}"]) for j in range(8)]
    want = [
        (16.0 if slot else 256.0) + values[(3 + 2 * t + slot) % 8]
        for t in range(4)
        for slot in (0, 1)
    ]
    assert got == want


@pytest.mark.parametrize("seed", range(8))
def test_tensor_core_widening_dequantizes_each_pair_once(seed: int) -> None:
    values, word = _values_and_word(seed)
    s, o = 0.0371, -0.215
    eighth_s = _pack_bf16(s / 8, s / 8)
    offsets = _pack_bf16(o, o)
    regs = run_ptx(
        int4_blocks_dot._PAIRS_AS_BF16.value, {"$4": word, "$5": eighth_s, "$6": offsets}
    )
    s_bf16, o_bf16 = _bf16_pair(eighth_s)[0] * 8, _bf16_pair(offsets)[0]
    for t in range(4):
        got = _bf16_pair(regs[f"${t}"])
        want = _bf16_pair(_pack_bf16(*((values[t + 4 * h] - 8) * s_bf16 + o_bf16 for h in (0, 1))))
        assert got == want  # (q - 8) s + o, rounded to bf16 once


@pytest.mark.parametrize("seed", range(8))
def test_raw_tensor_core_widening_leaves_each_pair_at_128_plus_8q(seed: int) -> None:
    """The raw tiles' PTX (Tiles.bits on int4's blocks): the scaled widening without its
    subtract and FMA, each value exactly 128 + 8 q for `group_scaled` to take apart."""
    values, word = _values_and_word(seed)
    regs = run_ptx(int4_blocks_dot._RAW_PAIRS_AS_BF16.value, {"$4": word})
    for t in range(4):
        assert _bf16_pair(regs[f"${t}"]) == (128.0 + 8 * values[t], 128.0 + 8 * values[t + 4])


def test_int8_words_widen_four_values_a_word_in_order() -> None:
    """widening.py's `words`: byte n of the word, the n-th value along K, as float32 q."""
    values = [-128, -1, 0, 127, 5, -77, 64, 33]
    for first in (0, 4):
        word = int.from_bytes(bytes(v & 0xFF for v in values[first : first + 4]), "little")
        regs = run_ptx(widening._INT8_WORD_AS_FLOAT32.value, {"$4": word})
        assert [_f32(regs[f"${n}"]) for n in range(4)] == values[first : first + 4]


@pytest.mark.parametrize("first", [0, 4, 8, 12])
def test_int8_pairs_make_each_value_exactly_in_bf16(first: int) -> None:
    """int8 on tensor cores (`words`): a word's four values as two bf16 pairs, (k, k + 1) and
    (k + 2, k + 3), every int8 value exact (all 256 across the cases)."""
    values = list(range(-128, 128))
    for word_values in (values[i : i + 4] for i in range(first, 256, 16)):
        word = int.from_bytes(bytes(v & 0xFF for v in word_values), "little")
        regs = run_ptx(widening._INT8_PAIRS_AS_BF16.value, {"$2": word})
        assert [*_bf16_pair(regs["$0"]), *_bf16_pair(regs["$1"])] == word_values
