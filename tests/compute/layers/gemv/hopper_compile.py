"""Compile the small-rows kernels for Hopper (sm_90) on any machine, no GPU needed: Triton's
interpreter runs the kernels as Python, so code it accepts can still fail to compile (an early
return in a constexpr branch did: the compiler went on into the code after it). Run by
test_hopper_compile.py in a process of its own, without TRITON_INTERPRET.

    python tests/compute/layers/gemv/hopper_compile.py    prints one line per variant compiled
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))

from aioworker.compute.layers.gemv.finish import reduce_kernel  # noqa: E402
from aioworker.compute.layers.gemv.kernels import _small_rows_kernel  # noqa: E402

HOPPER = GPUTarget("cuda", 90, 32)
VARIANTS = ((True, True, False, "add+norm"), (False, False, True, ""), (False, False, True, "norm"))
# int4's blocks on FMA tiles: x is never normed there
BLOCKS_VARIANTS = ((True, True, False, ""), (False, False, True, ""))
WEIGHTS = {"bf16": "*bf16", "e4m3": "*fp8e4nv", "int8": "*i8", "int4": "*u8", "int4-words": "*i32",
           "int4-blocks": "*i32"}  # fmt: skip
UNIT_BYTES = {"bf16": 2, "e4m3": 1, "int8": 1, "int4": 1, "int4-words": 4, "int4-blocks": 4}
PRODUCT_ARGS = [
    "x_ptr",
    "w_ptr",
    "scale_ptr",
    "bias_ptr",
    "group_scale_ptr",
    "group_offset_ptr",
    "out_ptr",
    "partial_ptr",
    "counter_ptr",
    "residual_ptr",
    "norm_weight_ptr",
    "residual_out_ptr",
    "squares_ptr",
    "num_rows",
    "num_channels",
    "depth",
    "k_per_split",
    "stride_x",
    "stride_w",
    "stride_group_row",
    "stride_group",
    "stride_split",
    "stride_out",
    "eps",
    "num_squares",
]


def product_variant(
    fmt: str, gated: bool, dot: bool, split: bool, even_k: bool, norm: str, aligned: bool = False,
    x: str = "*bf16", **overrides,
):  # fmt: skip
    """norm: "" (none), "norm" (the norm fused, no residual), "add+norm" (both). aligned: the
    pointers, sizes and strides divisible by 16, as Triton specializes them when they are (its
    loads are vectorized only then); overrides: constants replaced (BLOCK_N=64, ...)."""
    int4 = fmt.startswith("int4")
    # bits: the FMA tiles' split variant, and int4's dot tiles (one group a step) with the norm.
    bits = (not dot and split) or (dot and int4 and norm == "norm")
    block_m, block_k = (16, 64) if dot else (1, 128)
    constants = {
        "SCALED": fmt in ("e4m3", "int8"), "HAS_BIAS": not gated, "GATED": gated, "DOT": dot,
        "IEEE": False, "INT4_GROUP": (64 if dot and bits else 32) if int4 else 0,
        "INT4_PER_UNIT": {"int4": 2, "int4-words": 8, "int4-blocks": 8}.get(fmt, 1),
        "INT4_BLOCKS": int(fmt == "int4-blocks"),
        "INT4_LOW_FIRST": fmt == "int4-words", "NORMED": bool(norm),
        "HAS_RESIDUAL": norm == "add+norm", "A8": fmt == "e4m3" and dot and split,
        "BITS": bits,
        "SPLIT": split, "FOLD": split and dot, "EVEN_K": even_k,
        "ROW_GROUPS": int4 and not dot, "WIDE_X": not dot and not int4 and not norm,
        # words: on FMA tiles with the norm, and on tensor cores (bf16 pairs) without it
        "WORDS": int(fmt == "int8" and (norm == "norm") != dot),
        "ACC_COLUMNS": block_m if dot else block_k // 32 if int4 else block_k,
        "BLOCK_M": block_m, "BLOCK_N": 32, "BLOCK_K": block_k, "PDL": split,
        "PREFETCH_LINES": 2 if split else 0, "LINE_UNITS": 128 // UNIT_BYTES[fmt],
        "FMA_STAGES": None, "AHEAD": False, "X_ROWS": 0, "PRENORMED": False, "NORM_OUT": False,
        "SQUARES_P2": 16, "EARLY": False,
    }  # fmt: skip
    pointers = {"x_ptr": x, "w_ptr": WEIGHTS[fmt], "partial_ptr": "*fp32",
                "counter_ptr": "*i32", "squares_ptr": "*fp32", "eps": "fp32"}  # fmt: skip
    signature = {
        name: pointers.get(name, "*bf16" if name.endswith("_ptr") else "i32")
        for name in PRODUCT_ARGS
    }
    constants |= overrides
    signature |= dict.fromkeys(constants, "constexpr")
    attrs = {}
    if aligned:
        names = _small_rows_kernel.arg_names
        divisible = [n for n in PRODUCT_ARGS if n.endswith("_ptr") or n in ALIGNED_SIZES]
        attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in divisible}
    return ASTSource(_small_rows_kernel, signature, constants, attrs)


ALIGNED_SIZES = ("num_channels", "depth", "k_per_split", "stride_x", "stride_w", "stride_split",
                 "stride_out")  # fmt: skip


def reduce_variant(gated: bool, norm_out: bool = False, early: bool = False):
    constants = {"SCALED": True, "HAS_BIAS": not gated, "GATED": gated, "NORMED": gated,
                 "NORM_OUT": norm_out, "BLOCK": 256, "PDL": gated or early, "SQUARES_P2": 4,
                 "EARLY": early, "SPLITS_P2": 8 if early else 1}  # fmt: skip
    signature = {"partial_ptr": "*fp32", "scale_ptr": "*bf16", "bias_ptr": "*bf16",
                 "out_ptr": "*bf16", "squares_ptr": "*fp32", "num_splits": "i32",
                 "num_squares": "i32", "num_rows": "i32", "num_channels": "i32", "depth": "i32",
                 "stride_split": "i32", "stride_out": "i32", "eps": "fp32",
                 "residual_ptr": "*bf16", "norm_weight_ptr": "*bf16",
                 "residual_out_ptr": "*bf16"}  # fmt: skip
    return ASTSource(reduce_kernel, signature | dict.fromkeys(constants, "constexpr"), constants)


def main() -> None:
    options = {"num_warps": 4, "num_stages": 3}
    for fmt, dot in itertools.product(WEIGHTS, (True, False)):
        # Gated with split K (folded on the dot tiles, reduced by a second kernel on the FMA
        # ones), uneven K, the add and norm, PDL (pdl.py), e4m3's a8 and the FMA tiles' bits;
        # plain with none of them, with and without the norm: every branch once per format.
        fma_blocks = fmt == "int4-blocks" and not dot
        for gated, split, even_k, norm in BLOCKS_VARIANTS if fma_blocks else VARIANTS:
            variant = product_variant(fmt, gated, dot, split, even_k, norm)
            ptx = triton.compile(variant, HOPPER, options).asm["ptx"]
            waits = "griddepcontrol.wait" in ptx
            assert waits == split, "a PDL launch must wait on the kernel before it first"
            assert ("prefetch.global.L2" in ptx) == split, "the PDL variant prefetches W"
            print(f"compiled {fmt} dot={dot} gated={gated} split={split} even_k={even_k} {norm}")
    for fmt in WEIGHTS:  # FMA tiles pipelined (Tiles.pipelined): W copied ahead, asynchronously
        variant = product_variant(fmt, True, False, True, True, "", aligned=True, FMA_STAGES=3)
        ptx = triton.compile(variant, HOPPER, options).asm["ptx"]
        assert "cp.async" in ptx, "a pipelined FMA tile copies its loads ahead"
        print(f"compiled {fmt} dot=False pipelined")
    for dot, gated in itertools.product((True, False), (True, False)):  # int4's blocks read a
        # step ahead (Tiles.ahead): gated and uneven with split K, plain and even
        variant = product_variant("int4-blocks", gated, dot, gated, not gated, "", aligned=True,
                                  AHEAD=True, **({"BLOCK_K": 256} if dot else {}))  # fmt: skip
        triton.compile(variant, HOPPER, {"num_warps": 4, "num_stages": 1})
        print(f"compiled int4-blocks dot={dot} gated={gated} ahead")
    for gated in (True, False):  # int4's raw tiles (Tiles.bits on tensor cores), groups of 128:
        # gated, uneven, split K and read a step ahead; plain, even and one row
        variant = product_variant("int4-blocks", gated, True, gated, not gated, "", aligned=True,
                                  BITS=True, INT4_GROUP=128, BLOCK_K=128, AHEAD=gated,
                                  X_ROWS=8 if gated else 1)  # fmt: skip
        ptx = triton.compile(variant, HOPPER, {"num_warps": 4, "num_stages": 1}).asm["ptx"]
        assert "sub.rn.bf16x2" not in ptx, "a raw tile is left as the LOP3 makes it"
        print(f"compiled int4-blocks dot=True gated={gated} raw")
    for dot in (True, False):  # int4's blocks for float32 rows: Triton's operations, not PTX
        variant = product_variant("int4-blocks", True, dot, True, False, "", x="*fp32",
                                  INT4_BLOCKS=2, IEEE=True)  # fmt: skip
        triton.compile(variant, HOPPER, options)
        print(f"compiled int4-blocks dot={dot} float32 rows")
    for gated in (False, True):
        triton.compile(reduce_variant(gated), HOPPER, options)
        print(f"compiled reduce gated={gated}")
    triton.compile(reduce_variant(False, norm_out=True), HOPPER, options)
    print("compiled reduce norm_out")
    for dot, split in ((True, False), (True, True), (False, False)):  # the norm split between
        # two products: the first's finish starts it (NORM_OUT: in the product, in its fold, and
        # in the reduce kernel above), the next one's finishes it (PRENORMED)
        for side in ("NORM_OUT", "PRENORMED"):
            variant = product_variant("bf16", False, dot, split, True, "", **{side: True})
            triton.compile(variant, HOPPER, options)
            print(f"compiled bf16 dot={dot} split={split} {side.lower()}")
    early_variants(options)


def early_variants(options: dict) -> None:
    """device.early_epilogue_loads (finish.py): the reduce kernel loads the constants before it
    waits (PDL), and products that finish themselves fetch theirs into L2 while they wait."""
    for gated, norm_out in ((True, False), (False, True)):
        ptx = triton.compile(reduce_variant(gated, norm_out, early=True), HOPPER, options).asm[
            "ptx"
        ]
        assert ptx.index("ld.global") < ptx.index("griddepcontrol.wait"), "constants first"
        print(f"compiled reduce gated={gated} norm_out={norm_out} early")
    for fmt, dot in (("bf16", True), ("e4m3", False)):  # folded, norm_out; one slice, scaled
        variant = product_variant(fmt, False, dot, dot, True, "", NORM_OUT=dot, EARLY=True,
                                  PDL=True, PREFETCH_LINES=2)  # fmt: skip
        ptx = triton.compile(variant, HOPPER, options).asm["ptx"]
        assert ptx.count("prefetch.global.L2") > 2, "W's lines and the constants' lines"
        print(f"compiled {fmt} dot={dot} early")


if __name__ == "__main__":
    main()
