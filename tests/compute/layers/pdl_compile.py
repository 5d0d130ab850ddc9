"""Compile, for Hopper (sm_90) and without a GPU, every kernel of a decode step that launches
with programmatic dependent launch (compute/layers/pdl.py) other than the small-rows products
(gemv/hopper_compile.py compiles those), with PDL on, and check that each waits on the kernel
before it: its PTX holds griddepcontrol.wait. Run by test_pdl.py in a process of its own,
without TRITON_INTERPRET.

    python tests/compute/layers/pdl_compile.py    prints one line per kernel compiled
"""

from __future__ import annotations

import sys
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from aioworker.compute.layers import fused  # noqa: E402
from aioworker.compute.layers.attention import split_merge, triton_decode  # noqa: E402

HOPPER = GPUTarget("cuda", 90, 32)
# Pointer and float arguments by name; every other argument is an i32.
POINTERS = {
    "cos_ptr": "*fp32", "sin_ptr": "*fp32", "slot_ptr": "*i64", "block_tables_ptr": "*i32",
    "context_lens_ptr": "*i32", "query_starts_ptr": "*i32", "query_lens_ptr": "*i32",
    "lse_ptr": "*fp32", "partial_ptr": "*fp32", "counter_ptr": "*i32",
}  # fmt: skip
FLOATS = {"eps", "scale"}
KERNELS = [
    (fused._add_rms_norm_kernel, {"HAS_RESIDUAL": True, "BLOCK": 4096}),
    (fused._silu_and_mul_kernel, {"BLOCK": 1024}),
    (fused._norm_rope_kernel, {"HEAD_DIM": 128, "HAS_NORM": True}),
    (fused._qkv_rope_cache_kernel, {"HEAD_DIM": 128, "HAS_NORM": False, "ROWS": fused.ROWS}),
    (
        triton_decode._decode_partial,
        {
            "GROUP": 4,
            "GROUP_P2": 4,
            "ROWS_PAD": 16,
            "MULTI": False,
            "HEAD_DIM": 128,
            "BLOCK_SIZE": 64,
            "TILE_N": 64,
            "DIRECT": False,
            "DOT_PRECISION": "tf32",
            "ROPE_IN": True,
            "HAS_NORM": True,
            "QUERIES_P2": 1,
            "HEADS_FIRST": False,
        },
    ),  # fmt: skip
    (split_merge.merge_splits, {"SPLITS_PAD": 8, "HEAD_DIM": 128}),
]


def signature_of(kernel, constants: dict) -> dict[str, str]:
    def kind(name: str) -> str:
        if name in constants:
            return "constexpr"
        if name.endswith("_ptr"):
            return POINTERS.get(name, "*bf16")
        return "fp32" if name in FLOATS else "i32"

    return {name: kind(name) for name in kernel.arg_names}


def main() -> None:
    for kernel, constants in KERNELS:
        constants = {**constants, "PDL": True}
        source = ASTSource(kernel, signature_of(kernel, constants), constants)
        compiled = triton.compile(source, HOPPER, {"num_warps": 4})
        waits = "griddepcontrol.wait" in compiled.asm["ptx"]
        print(f"compiled {kernel.fn.__name__} {'waits' if waits else 'DOES NOT WAIT'}")


if __name__ == "__main__":
    main()
