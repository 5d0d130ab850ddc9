"""How one small-rows product is cut into programs (kept apart from the kernels, so choosing
tiles imports no Triton)."""

from __future__ import annotations

from dataclasses import dataclass

MAX_ROWS = 8
INT4_BLOCK = 32  # K values a block of int4's blocks layout holds, in four int32 words


@dataclass(frozen=True)
class Tiles:
    """`dot`: tensor cores, or elementwise FMA (one row only); then output channels per
    program, K per loop step, K slices, and Triton's warps and pipeline stages. `a8` (e4m3
    weights, dot tiles): the rows quantized to e4m3 per step of K, multiplied on fp8 tensor
    cores (kernels.py). `bits` (quantized weights): widened by bit operations, not conversion
    instructions (widening.py); int4 on tensor cores then takes one group a step and scales
    the sums, not the values (on int4's blocks: the raw tiles, 128 + 8 q, int4_blocks_dot.py,
    a step within one group). `fold`: split K's partial sums added
    by the last of a tile's programs to arrive, not by a second kernel (kernels.py).
    `prefetch` (with device.pdl): each program fetches its first step of W into L2 while it
    waits on the kernel before. `wide_x` (FMA tiles of a stored format, not with the fused
    norm): each step's slice of x loaded in the W tile's shape, so that it arrives in W's
    register layout: loaded as a row, it crosses shared memory behind barriers every step.
    `words` (int8): widened exactly a 32-bit word at a time by PTX (widening.py), on FMA tiles
    to four float32, on tensor cores (bf16 rows) to two bf16 pairs.
    `blocks` (int4 on FMA tiles): W read from its blocks layout, derived at load time, whose
    values an SM widens and multiplies in ~3.5 instructions each (int4_blocks.py).
    `pipelined` (FMA tiles): the K loop's loads issued `num_stages - 1` steps ahead, copied
    to shared memory asynchronously. Triton pipelines only loads that feed a dot, so an FMA
    tile's step otherwise waits for its own loads in full, whatever `num_stages` says; at one
    row, a few such tiles per SM keep too few bytes in flight to cover the memory's latency.
    `ahead` (int4's blocks, either kind of tile): each step reads the next step's words and
    scales into registers before it multiplies its own, so that a step's reads overlap the step
    before's widening and multiplying without passing through shared memory (which costs the
    blocks tiles their place under ~3.9 instructions a weight, and their registers)."""

    dot: bool = True
    block_n: int = 64
    block_k: int = 128
    splits: int = 1
    num_warps: int = 4
    num_stages: int = 3
    a8: bool = False
    bits: bool = False
    fold: bool = False
    prefetch: bool = False
    wide_x: bool = False
    words: bool = False
    blocks: bool = False
    pipelined: bool = False
    ahead: bool = False

    def int4_misfit(self, group: int) -> str | None:
        """Why these tiles cannot multiply int4 weights in groups of `group` inputs, or None."""
        if self.block_k % group and group % self.block_k:
            return f"BLOCK_K {self.block_k} and int4 groups of {group} do not nest"
        if self.blocks and (self.block_k % INT4_BLOCK or group % INT4_BLOCK):
            return (
                f"blocks tiles take K in blocks of {INT4_BLOCK}: BLOCK_K {self.block_k}, "
                f"group {group}"
            )
        if not self.dot and not self.blocks and self.block_k % group:
            return f"FMA tiles on int4 take whole groups: BLOCK_K {self.block_k}"
        if self.dot and self.bits and group % self.block_k:
            return f"bits dot tiles on int4 take one group a step: BLOCK_K {self.block_k}"
        return None
