"""The instructions a small-rows product variant spends per weight element, compiled for Hopper
(sm_90) on any machine, no GPU: the loop's SASS, counted by opcode and divided by the weight
elements a thread multiplies per step. What bounds a GEMV at batch 1 is often visible there
before any GPU time is spent: an SM must issue about 4 instructions per byte of e4m3 or int8
read to keep up with the copy rate, conversions issue at a quarter of that, and a barrier in
the loop means a shared-memory exchange each step (that is how `wide_x` was found).

    tools/compile_with_gpu_triton.sh                  once: the GPU machine's Triton, in /tmp
    PYTHONPATH=/tmp/triton-3.6.0:. python tools/sass_mix.py e4m3 fma 16x256 [--wide-x]
        [--bits] [--a8] [--rows 16] [--warps 4]
    python tools/sass_mix.py int4-blocks fma 64x512 --warps 2     int4's blocks layout
    python tools/sass_mix.py int8 fma 16x256 --wide-x --words --pipelined    W copied ahead
    python tools/sass_mix.py int4-blocks dot 128x256 --stages 1 --ahead   W read a step early
    python tools/sass_mix.py int4-blocks dot 128x128 --stages 1 --bits --group 128 --x-rows 1
                                                            int4's raw tiles, one row
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests/compute/layers/gemv"))

from hopper_compile import WEIGHTS, product_variant  # noqa: E402

HOPPER = GPUTarget("cuda", 90, 32)
SASS_LINE = re.compile(r"/\*[0-9a-f]{4}\*/")
LABEL = re.compile(r"\s*\.L_x_(\d+):")
BRANCH = re.compile(r"BRA\s+`?\(?\.L_x_(\d+)")
OPCODE = re.compile(r"\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)")


def loop_body(sass: str) -> list[str]:
    """The instructions between the longest backward branch and its target: the K loop."""
    labels, lines = {}, []
    for line in sass.splitlines():
        label = LABEL.match(line)
        if label:
            labels[label.group(1)] = len(lines)
        elif SASS_LINE.search(line):
            lines.append(line)
    loops = []
    for end, line in enumerate(lines):
        branch = BRANCH.search(line)
        if branch and labels.get(branch.group(1), end) < end:
            loops.append((end - labels[branch.group(1)], labels[branch.group(1)], end))
    if not loops:
        return lines
    _, start, end = max(loops)
    return lines[start : end + 1]


def opcode_counts(cubin: bytes) -> collections.Counter:
    nvdisasm = Path(triton.__file__).parent / "backends/nvidia/bin/nvdisasm"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([nvdisasm, "-c", f.name], capture_output=True, text=True).stdout
    found = (OPCODE.search(line) for line in loop_body(sass))
    return collections.Counter(m.group(1) for m in found if m)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("format", choices=sorted(WEIGHTS))
    parser.add_argument("multiply", choices=["dot", "fma"])
    parser.add_argument("tile", help="channels x K per step, e.g. 64x128")
    parser.add_argument("--rows", type=int, default=16, help="dot tiles' padded rows")
    parser.add_argument("--warps", type=int, default=4)
    parser.add_argument("--stages", type=int, default=4, help="Triton's pipeline stages")
    parser.add_argument("--bits", action="store_true")
    parser.add_argument("--a8", action="store_true")
    parser.add_argument("--wide-x", action="store_true")
    parser.add_argument("--words", action="store_true", help="int8: a word at a time by PTX")
    parser.add_argument(
        "--pipelined", action="store_true", help="FMA tiles: loads issued --stages - 1 steps ahead"
    )
    parser.add_argument(
        "--ahead", action="store_true", help="int4-blocks: each step reads the next one's words"
    )
    parser.add_argument(
        "--group", type=int, default=32, help="int4: K values a scale covers (checkpoints: 128)"
    )
    parser.add_argument(
        "--x-rows", type=int, default=0, choices=(0, 1, 8),
        help="int4-blocks raw tiles (--bits): x's sums from this many rows loaded again",
    )  # fmt: skip
    args = parser.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1":
        parser.error("compiles for the GPU: unset TRITON_INTERPRET")
    block_n, block_k = (int(n) for n in args.tile.split("x"))
    dot, int4 = args.multiply == "dot", args.format.startswith("int4")
    rows = args.rows if dot else 1
    variant = product_variant(
        args.format, False, dot, False, True, "", aligned=True, BLOCK_N=block_n,
        BLOCK_K=block_k, BLOCK_M=rows, ACC_COLUMNS=rows if dot else block_k // 32 if int4 else block_k,
        BITS=args.bits, A8=args.a8, WIDE_X=args.wide_x and not dot, PDL=False, PREFETCH_LINES=0,
        WORDS=int(args.words and args.format == "int8"),
        INT4_GROUP=args.group if int4 else 0, HAS_BIAS=False,
        INT4_BLOCKS=int(args.format == "int4-blocks"),
        FMA_STAGES=args.stages if args.pipelined and not dot else None,
        AHEAD=args.ahead and args.format == "int4-blocks", X_ROWS=args.x_rows,
    )  # fmt: skip
    compiled = triton.compile(variant, HOPPER, {"num_warps": args.warps, "num_stages": args.stages})
    counts = opcode_counts(compiled.asm["cubin"])
    per_thread = block_n * block_k / (32 * args.warps)  # weight elements a thread takes a step
    top = ", ".join(f"{op} {n / per_thread:.2f}" for op, n in counts.most_common())
    print(f"{sum(counts.values()) / per_thread:.2f} instructions per weight element: {top}")


if __name__ == "__main__":
    main()
