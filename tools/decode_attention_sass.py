"""What the paged decode kernel compiles to for Hopper (sm_90), on any machine, no GPU: its
registers, local loads and stores (spills), shared memory, and how its key tiles reach shared
memory (cp.async copies in flight, Triton's pipelining), for each build asked.

Triton specializes a launch's arguments: a pointer or an integer divisible by 16 is compiled as
such, and that decides whether loads vectorize and pipeline. The engine's arguments all are
(caches of head dim 128, strides of whole heads and blocks, block tables of max_model_len /
block_size entries). Compiled without those hints the kernel looks far worse than it runs (255
registers and spills at 4 warps, loads into registers a tile at a time), which is what
`--no-hints` shows.

    tools/compile_with_gpu_triton.sh                 once: the GPU machine's Triton, in /tmp
    PYTHONPATH=/tmp/triton-3.6.0:. python tools/decode_attention_sass.py [--group 2 4]
        [--warps 4 8] [--stages 3 5] [--tile 64] [--rope] [--splits] [--no-hints]
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton
from triton.compiler import ASTSource

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests/compute/layers"))

from pdl_compile import HOPPER, signature_of  # noqa: E402

from aioworker.bench.report import format_table  # noqa: E402
from aioworker.compute.layers.attention import triton_decode  # noqa: E402

KERNEL = triton_decode._decode_partial
OPCODE = re.compile(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")


def compile_build(group: int, warps: int, stages: int | None, tile: int, rope: bool,
                  splits: bool, hints: bool):  # fmt: skip
    """The kernel compiled for sm_90 with one query per sequence, head dim 128, blocks of 16."""
    constants = {
        "GROUP": group, "GROUP_P2": triton.next_power_of_2(group), "ROWS_PAD": 16,
        "MULTI": False, "HEAD_DIM": 128, "BLOCK_SIZE": 16, "TILE_N": tile, "DIRECT": not splits,
        "DOT_PRECISION": "tf32", "PDL": False, "ROPE_IN": rope, "HAS_NORM": rope,
        "QUERIES_P2": 1, "HEADS_FIRST": False,
    }  # fmt: skip
    signature = signature_of(KERNEL, constants)
    names = list(signature)
    aligned = [n for n in names if n.endswith("_ptr") or n.startswith("stride_")]
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in aligned} if hints else {}
    options = {"num_warps": warps, **({} if stages is None else {"num_stages": stages})}
    return triton.compile(ASTSource(KERNEL, signature, constants, attrs), HOPPER, options)


def facts(compiled) -> dict[str, str]:
    """Registers, local (spill) traffic, shared memory and copies from its cubin and SASS."""
    tools = Path(triton.__file__).parent / "backends/nvidia/bin"
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as cubin:
        cubin.write(compiled.asm["cubin"])
    try:
        usage = _run(tools / "cuobjdump", "-res-usage", cubin.name)
        sass = _run(tools / "cuobjdump", "-sass", cubin.name)
    finally:
        os.unlink(cubin.name)
    ops = [op for op in OPCODE.findall(sass)]
    registers = re.search(r"REG:(\d+)", usage)
    depth = re.findall(r"memdesc<(\d+)x\d+x\d+xbf16", compiled.asm["ttgir"])
    return {
        "registers": registers.group(1) if registers else "?",
        "local loads + stores": str(ops.count("LDL") + ops.count("STL")),
        "shared KiB": f"{compiled.metadata.shared / 1024:.0f}",
        "cp.async (LDGSTS)": str(ops.count("LDGSTS")),
        "K/V tiles buffered": max(depth, default="0 (registers)"),
    }


def _run(*command) -> str:
    return subprocess.run([str(c) for c in command], capture_output=True, text=True).stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--group", type=int, nargs="+", default=[2, 4], help="q heads a KV head")
    parser.add_argument("--warps", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--stages", nargs="+", default=["-"], help="`-`: Triton's default")
    parser.add_argument("--tile", type=int, nargs="+", default=[triton_decode.TILE_N])
    parser.add_argument("--rope", action="store_true", help="rotary and the cache write in")
    parser.add_argument("--splits", action="store_true", help="partial results, to be merged")
    parser.add_argument("--no-hints", action="store_true", help="without Triton's specialization")
    args = parser.parse_args()
    rows = []
    for group, warps, stages, tile in itertools.product(
        args.group, args.warps, args.stages, args.tile
    ):
        depth = None if stages == "-" else int(stages)
        compiled = compile_build(
            group, warps, depth, tile, args.rope, args.splits, not args.no_hints
        )
        rows.append([str(group), str(warps), stages, str(tile), *facts(compiled).values()])
    header = ["group", "warps", "stages", "tile", "registers", "local loads + stores",
              "shared KiB", "cp.async (LDGSTS)", "K/V tiles buffered"]  # fmt: skip
    print(f"triton {triton.__version__}, sm_90, head dim 128, blocks of 16, "
          f"{'no hints' if args.no_hints else 'pointers and strides divisible by 16'}")  # fmt: skip
    print(format_table(header, rows))


if __name__ == "__main__":
    main()
