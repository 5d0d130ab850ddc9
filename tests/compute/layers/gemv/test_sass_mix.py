"""tools/sass_mix.py on a variant whose loop it explains: one row on FMA tiles, x loaded as a row,
exchanges x through shared memory behind a barrier every step; `wide_x` loads it in the W tile's
shape and the loop has no barrier (compiled for sm_90 on the CPU, in a process of its own,
without TRITON_INTERPRET)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

if importlib.util.find_spec("triton") is None:
    pytest.skip("needs triton", allow_module_level=True)
TOOL = Path(__file__).resolve().parents[4] / "tools" / "sass_mix.py"


def mix(*args: str) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, str(TOOL), *args], env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    per_element = done.stdout.split(":", 1)[1]
    return {op: float(n) for op, n in re.findall(r"([A-Z0-9_]+) ([\d.]+)", per_element)}


def test_the_row_load_waits_on_a_barrier_each_step_and_wide_x_does_not() -> None:
    row, wide = mix("e4m3", "fma", "16x256"), mix("e4m3", "fma", "16x256", "--wide-x")
    assert row.get("BAR", 0) > 0 and "BAR" not in wide
    # Both multiply each weight once, widened by the packed e4m3x2 conversion.
    assert row["FFMA"] == wide["FFMA"] == 1.0 and row["F2FP"] == wide["F2FP"] == 0.5


def test_a_pipelined_fma_tile_copies_its_loads_ahead_and_a_plain_one_waits_on_them() -> None:
    """Triton pipelines only loads that feed a dot: a plain FMA tile loads W into registers and
    waits on it every step, whatever num_stages says; `pipelined` copies the steps ahead into
    shared memory (LDGSTS) and reads them from there."""
    plain = mix("int8", "fma", "16x256", "--wide-x", "--words")
    piped = mix("int8", "fma", "16x256", "--wide-x", "--words", "--pipelined")
    assert "LDGSTS" not in plain and plain["LDG"] > 0
    assert piped["LDGSTS"] > 0 and "LDG" not in piped and piped["LDS"] > 0


def test_int8_widened_four_a_word_needs_no_conversion_and_fewer_instructions_than_bits() -> None:
    """`words`: no conversion instruction (I2F issues at a quarter of the rate), and fewer
    instructions per weight than `bits`, whose Triton widens each byte to 32 bits first."""
    words, bits = mix("int8", "fma", "16x256", "--words"), mix("int8", "fma", "16x256", "--bits")
    assert "I2F" not in words and "I2F" not in bits
    assert sum(words.values()) < sum(bits.values()) - 0.5


def test_int4_blocks_issue_fewer_instructions_a_weight_than_the_copy_rate_allows() -> None:
    """int4's blocks layout (int4_blocks.py): under the ~3.9 instructions a weight an H200 SM
    can issue at the copy rate of 0.5-byte weights, no barrier, no conversion instruction, and
    less than half of what the bytes layout's one-row tiles spend."""
    blocks = mix("int4-blocks", "fma", "64x256", "--warps", "2")
    plain = mix("int4", "fma", "16x512", "--bits")
    assert sum(blocks.values()) < 3.9 and "BAR" not in blocks and "I2F" not in blocks
    assert sum(blocks.values()) < sum(plain.values()) / 2


def test_int4_blocks_on_tensor_cores_stay_under_the_copy_rates_budget() -> None:
    """int4_blocks_dot.py with one stage: four bf16 pairs a word by PTX, each word loaded once
    (one load of 4 bytes at most per 8 weights, scales and x included: 0.25), under the copy
    rate's budget; the bytes layout's tiles of the same shape spend over twice as many."""
    blocks = mix("int4-blocks", "dot", "128x256", "--stages", "1")
    plain = mix("int4", "dot", "128x64", "--bits")
    assert sum(blocks.values()) < 3.9 and blocks["LDG"] < 0.25 and "I2F" not in blocks
    assert blocks["HFMA2"] == blocks["HADD2"] == 0.5  # (v - 192) then (q - 8) s + o, by pairs
    assert sum(plain.values()) > 2 * sum(blocks.values())
