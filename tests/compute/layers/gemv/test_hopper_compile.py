"""Every branch of the small-rows kernels compiles for Hopper (sm_90), on the CPU: compiled
Triton rejects code the interpreter runs (hopper_compile.py says how)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Not imported here: Triton reads TRITON_INTERPRET once, at import, and the other tests of this
# folder set it first.
if importlib.util.find_spec("triton") is None:
    pytest.skip("needs triton", allow_module_level=True)
SCRIPT = Path(__file__).with_name("hopper_compile.py")


def test_every_variant_compiles_for_sm_90() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    formats = ("bf16", "e4m3", "int8", "int4", "int4-words", "int4-blocks")
    # int4's blocks on FMA tiles: gated and split, and plain (x is never normed there); then
    # each format's FMA tiles pipelined (with cp.async), int4's blocks read a step ahead (both
    # tilings, gated and plain), int4's raw tiles (gated and plain, no packed subtract), both
    # blocks tilings for float32 rows, the reduce kernel's two and its norm_out, the norm
    # split between two products (norm_out and prenormed, three tilings each), and early
    # epilogue loads (two reduce kernels, two products)
    assert done.stdout.count("compiled") == (
        2 * 3 * len(formats) - 1 + len(formats) + 4 + 2 + 2 + 2 + 1 + 6 + 4
    )
    assert done.stdout.count("early") == 4
    assert done.stdout.count("pipelined") == len(formats)
    assert done.stdout.count("ahead") == 4
    assert done.stdout.count("raw") == 2
