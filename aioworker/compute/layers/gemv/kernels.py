"""y = x W^T for a few rows of x (decode's products at batch 1 to 8), in Triton: the step is the
time to read W once, so the kernel is built around streaming W.

- Each program owns BLOCK_N output channels and one slice of K (split K where there are too
  few channel tiles to give every SM of the device several programs); its slice of W is read
  once and serves every row of x.
- Two ways to multiply, picked per shape by measurement (choice.py, tiles.py):
  - DOT: tensor cores, W as the left operand (y^T = W x^T), x padded to 16 rows. Padding costs
    nothing that matters here, and Triton pipelines the loads that feed a dot.
  - FMA (one row only): products accumulate elementwise in a [BLOCK_N, BLOCK_K] tile, summed
    once at the end, so the loop does no cross-lane reductions.
- A weight format is a variant, not a copy: `weight_tile` (weight_tiles.py) loads and widens a
  tile (bf16 as is; e4m3 and int8 widened exactly; int4 unpacked and dequantized per group of K
  in registers, from the bytes of the on-load format or the int32 words of a compressed-tensors
  checkpoint), and a per-output-channel scale multiplies the sum, since it factors out of the
  sum over K. BITS widens by bit operations instead of conversion instructions (widening.py);
  int4 on tensor cores then multiplies q - 8 as is and scales each group's sums. int4's blocks
  layout has a K loop of its own (int4_blocks_loop.py), which may read each step a step early
  (AHEAD); x's side of a step, shared by both loops, is rows.py.
- A8 (e4m3 weights, DOT tiles): each step's slice of every row of x is quantized to e4m3 with
  a scale of its own (its largest magnitude to e4m3's 448), and the e4m3 weights multiply it on
  fp8 tensor cores as stored: no weight element is widened, which is what bounds e4m3 with
  bf16 rows (conversions issue at a quarter of the rate of other arithmetic). The fp8 format's
  own GEMM quantizes its rows too, per token; a scale per slice of K is finer.
- A bias (a plain product's, per channel) is added after the scale.
- GATED computes silu(x gate^T) * (x up^T) for a gate/up weight stacked as [2I, K]: each program
  reads the gate rows and the matching up rows, so the activation needs no kernel of its own.
- NORMED computes the product of rms_norm(x + residual) instead of x (add_norm.py): a decoder
  layer's residual add and RMSNorm inside its qkv and gate/up products. PRENORMED: x is already
  h * n, and the sums of squares of h come from the product before (add_norm_input.PreNormed),
  which computed them with NORM_OUT: its output added to the residual in its finish
  (finish.norm_out_values).
- Split K leaves float32 partial sums (and, NORMED, each slice's sums of squares); a second
  kernel adds them, then normalizes, scales, gates and rounds, or with FOLD the last of a tile's
  programs to arrive does, counted by an atomic (finish.py). With one split the product kernel
  does that itself.
- PDL (layers/pdl.py): the kernel waits on the one before it before touching x, and with
  PREFETCH_LINES fetches its first step of W into L2 while it waits.
"""

from __future__ import annotations

import triton
import triton.language as tl

from aioworker.compute.layers.gdc import prefetch_to_l2, wait_for_previous_kernel
from aioworker.compute.layers.gemv.finish import fold, squares_total, store_output
from aioworker.compute.layers.gemv.int4_blocks_loop import int4_blocks_loop
from aioworker.compute.layers.gemv.int4_row import int4_row_step
from aioworker.compute.layers.gemv.rows import accumulate, x_step
from aioworker.compute.layers.gemv.weight_tiles import (
    int4_group_scales,
    int4_values,
    int8_pairs_tile,
    weight_tile,
)


@triton.jit
def _finish(acc, DOT: tl.constexpr):
    """The accumulator as [BLOCK_N, BLOCK_M] sums."""
    return acc if DOT else tl.sum(acc, axis=1)[:, None]


@triton.jit
def _small_rows_kernel(
    x_ptr, w_ptr, scale_ptr, bias_ptr, group_scale_ptr, group_offset_ptr, out_ptr, partial_ptr,
    counter_ptr, residual_ptr, norm_weight_ptr, residual_out_ptr, squares_ptr,
    num_rows, num_channels, depth, k_per_split, stride_x, stride_w, stride_group_row,
    stride_group, stride_split, stride_out, eps, num_squares,
    SCALED: tl.constexpr, HAS_BIAS: tl.constexpr, GATED: tl.constexpr, DOT: tl.constexpr,
    IEEE: tl.constexpr, INT4_GROUP: tl.constexpr, INT4_PER_UNIT: tl.constexpr,
    INT4_LOW_FIRST: tl.constexpr, NORMED: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    A8: tl.constexpr, BITS: tl.constexpr, SPLIT: tl.constexpr, FOLD: tl.constexpr,
    EVEN_K: tl.constexpr, ROW_GROUPS: tl.constexpr, WIDE_X: tl.constexpr, WORDS: tl.constexpr,
    INT4_BLOCKS: tl.constexpr,
    ACC_COLUMNS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, PDL: tl.constexpr, PREFETCH_LINES: tl.constexpr,
    LINE_UNITS: tl.constexpr, FMA_STAGES: tl.constexpr, AHEAD: tl.constexpr,
    X_ROWS: tl.constexpr = 0, PRENORMED: tl.constexpr = False, NORM_OUT: tl.constexpr = False,
    SQUARES_P2: tl.constexpr = 1, EARLY: tl.constexpr = False,
):  # fmt: skip
    """num_channels: output channels (for GATED, of the gate: W has twice as many rows); out_ptr:
    the output [rows, channels]. SPLIT: each program writes its float32 partial sums to
    partial_ptr [splits, rows, channels (x2 when GATED)], for `reduce_kernel`, or with FOLD for
    the last of its tile's programs to arrive, which adds them and finishes (finish.py).
    ROW_GROUPS: FMA on int4 values (int4_row.py). INT4_BLOCKS: W in int4's blocks layout, on
    FMA tiles (int4_blocks.py) or tensor cores (int4_blocks_dot.py), widened by PTX (1) or by
    Triton's operations (2: the interpreter, and dot tiles for rows other than bf16).
    ACC_COLUMNS: an accumulator column per row (DOT), per column of the tile (FMA), or per
    group of K (ROW_GROUPS; with INT4_BLOCKS per block of 32). WIDE_X (FMA, stored
    formats, not NORMED): x's slice loaded in the W tile's shape [BLOCK_N, BLOCK_K], every row
    the same, so Triton gives it W's register layout and no step exchanges it through shared
    memory. WORDS (int8): widened a 32-bit word at a time by PTX (1; on FMA tiles four float32,
    on tensor cores two bf16 pairs; the interpreter: 2, the same values by Triton's operations,
    widening.py). NORMED (add_norm.py):
    x is the row before the residual add and the norm; residual and residual_out laid out as x;
    with SPLIT, squares_ptr takes each slice's sums of squares [splits, rows] (FOLD: each
    tile's, [tiles, splits, rows]). PREFETCH_LINES (with PDL): the lines of each of the
    program's W rows (LINE_UNITS stored units a line) fetched into L2 while it waits on the
    kernel before. FMA_STAGES (Tiles.pipelined): the K loop's loads issued this many steps
    ahead, through shared memory; None leaves the loop to Triton, which pipelines only loads
    that feed a dot. AHEAD (INT4_BLOCKS, Tiles.ahead): each step reads the next step's words,
    scales and offsets into registers before it multiplies its own, which were read during the
    step before (int4_blocks_loop.py: the last step is peeled off the loop, so none reads past
    its slice). X_ROWS (int4's raw tiles, x not normed): each step's sums of x taken over x's
    first X_ROWS rows (1, or MAX_ROWS) loaded again, not the 16 the tensor cores are given.
    EARLY (finish.py): the epilogue's operands loaded before its first store, and where this
    kernel finishes the product (no split, or FOLD) and PREFETCH_LINES, its per-channel
    constants fetched into L2 while it waits."""
    tile, split = tl.program_id(0), tl.program_id(1)
    channels = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    in_range = channels < num_channels
    if PREFETCH_LINES > 0:  # weights: no kernel of the step writes them
        _prefetch_rows(w_ptr, channels, in_range, split * k_per_split // INT4_PER_UNIT, stride_w,
                       PREFETCH_LINES, LINE_UNITS)  # fmt: skip
        if GATED:
            _prefetch_rows(w_ptr, channels + num_channels, in_range,
                           split * k_per_split // INT4_PER_UNIT, stride_w, PREFETCH_LINES,
                           LINE_UNITS)  # fmt: skip
        if EARLY and (FOLD or not SPLIT):
            _prefetch_constants(scale_ptr, bias_ptr, norm_weight_ptr, tile * BLOCK_N,
                                num_channels, SCALED, HAS_BIAS, GATED, NORM_OUT, BLOCK_N)  # fmt: skip
    wait_for_previous_kernel(PDL)
    rows = tl.arange(0, BLOCK_M)
    compute_dtype = x_ptr.dtype.element_ty
    gate_acc = tl.zeros((BLOCK_N, ACC_COLUMNS), dtype=tl.float32)
    up_acc = tl.zeros((BLOCK_N, ACC_COLUMNS), dtype=tl.float32)
    squares_sum = tl.zeros((BLOCK_M,), dtype=tl.float32)
    write_sum = tile == 0  # h written once, by the first tile's programs
    # FMA tiles widen straight to float32 (e4m3 and int8: one conversion, not two).
    tile_dtype = compute_dtype if DOT else tl.float32
    if A8:  # e4m3 tiles as stored
        tile_dtype = w_ptr.dtype.element_ty
    first = split * k_per_split
    if INT4_BLOCKS:
        gate_acc, up_acc, squares_sum = int4_blocks_loop(
            gate_acc, up_acc, squares_sum, x_ptr, w_ptr, group_scale_ptr, group_offset_ptr,
            residual_ptr, norm_weight_ptr, residual_out_ptr, write_sum, channels, in_range, rows,
            num_rows, num_channels, first, k_per_split, stride_x, stride_w, stride_group_row,
            stride_group, depth, compute_dtype, GATED, DOT, IEEE, EVEN_K, INT4_GROUP, NORMED,
            HAS_RESIDUAL, INT4_BLOCKS, AHEAD, BLOCK_N, BLOCK_K, FMA_STAGES, BITS, X_ROWS,
        )  # fmt: skip
    else:
        gate_acc, up_acc, squares_sum = _stored_loop(
            gate_acc, up_acc, squares_sum, x_ptr, w_ptr, group_scale_ptr, group_offset_ptr,
            residual_ptr, norm_weight_ptr, residual_out_ptr, write_sum, channels, in_range, rows,
            num_rows, num_channels, first, k_per_split, stride_x, stride_w, stride_group_row,
            stride_group, depth, tile_dtype, GATED, DOT, IEEE, A8, BITS, EVEN_K, INT4_GROUP,
            INT4_PER_UNIT, INT4_LOW_FIRST, NORMED, HAS_RESIDUAL, ROW_GROUPS, WIDE_X, WORDS,
            BLOCK_N, BLOCK_K, FMA_STAGES,
        )  # fmt: skip
    gate, up = _finish(gate_acc, DOT), _finish(up_acc, DOT)
    out_mask = (channels[:, None] < num_channels) & (rows[None, :] < num_rows)
    if PRENORMED and not SPLIT:  # (split: the reduce kernel reads them)
        squares_sum = squares_total(squares_ptr, rows, num_rows, num_squares, SQUARES_P2)
    if SPLIT:
        width = num_channels * 2 if GATED else num_channels
        at = rows[None, :] * width + channels[:, None]
        tl.store(partial_ptr + split * stride_split + at, gate, mask=out_mask)
        if GATED:
            tl.store(partial_ptr + split * stride_split + at + num_channels, up, mask=out_mask)
        if NORMED:  # every tile's slice sums the same squares: the reduce kernel reads tile 0's
            squares_tile = tile if FOLD else 0
            squares_at = (squares_tile * tl.num_programs(1) + split) * num_rows + rows
            tl.store(squares_ptr + squares_at, squares_sum,
                     mask=tl.where(tile == squares_tile, rows < num_rows, False))  # fmt: skip
        if FOLD:
            fold(
                partial_ptr, counter_ptr, squares_ptr, scale_ptr, bias_ptr, out_ptr, tile, at,
                channels, rows, num_rows, num_channels, depth, stride_split, stride_out, eps,
                out_mask, residual_ptr, norm_weight_ptr, residual_out_ptr, NORMED, SCALED,
                HAS_BIAS, GATED, NORM_OUT, EARLY,
            )  # fmt: skip
    else:
        store_output(gate, up, squares_sum, scale_ptr, bias_ptr, out_ptr, channels, rows,
                     num_rows, num_channels, depth, stride_out, eps, out_mask, residual_ptr,
                     norm_weight_ptr, residual_out_ptr, squares_ptr, tile, NORMED or PRENORMED,
                     SCALED, HAS_BIAS, GATED, NORM_OUT, EARLY)  # fmt: skip


@triton.jit
def _stored_loop(
    gate_acc, up_acc, squares_sum, x_ptr, w_ptr, group_scale_ptr, group_offset_ptr,
    residual_ptr, norm_weight_ptr, residual_out_ptr, write_sum, channels, in_range, rows,
    num_rows, num_channels, first, k_per_split, stride_x, stride_w, stride_group_row,
    stride_group, depth, tile_dtype, GATED: tl.constexpr, DOT: tl.constexpr, IEEE: tl.constexpr,
    A8: tl.constexpr, BITS: tl.constexpr, EVEN_K: tl.constexpr, INT4_GROUP: tl.constexpr,
    INT4_PER_UNIT: tl.constexpr, INT4_LOW_FIRST: tl.constexpr, NORMED: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr, ROW_GROUPS: tl.constexpr, WIDE_X: tl.constexpr,
    WORDS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, FMA_STAGES: tl.constexpr,
):  # fmt: skip
    """The K loop on every layout but int4's blocks: int4 values one row at a time
    (ROW_GROUPS, int4_row.py), or a stored tile a step (`_stored_step`)."""
    for start in tl.range(0, k_per_split, BLOCK_K, num_stages=FMA_STAGES):
        k0 = first + start
        if ROW_GROUPS:
            gate_acc, up_acc, squares_sum = _int4_row_steps(
                gate_acc, up_acc, squares_sum, x_ptr, w_ptr, group_scale_ptr, group_offset_ptr,
                residual_ptr, norm_weight_ptr, residual_out_ptr, write_sum, channels, in_range,
                num_channels, k0, stride_w, stride_group_row, stride_group, depth, GATED, BITS,
                EVEN_K, INT4_GROUP, INT4_PER_UNIT, INT4_LOW_FIRST, NORMED, HAS_RESIDUAL, BLOCK_K,
            )  # fmt: skip
        else:
            gate_acc, up_acc, squares_sum = _stored_step(
                gate_acc, up_acc, squares_sum, x_ptr, w_ptr, group_scale_ptr, group_offset_ptr,
                residual_ptr, norm_weight_ptr, residual_out_ptr, write_sum, channels, in_range,
                rows, num_rows, num_channels, k0, stride_x, stride_w, stride_group_row,
                stride_group, depth, tile_dtype, GATED, DOT, IEEE, A8, BITS, EVEN_K, INT4_GROUP,
                INT4_PER_UNIT, INT4_LOW_FIRST, NORMED, HAS_RESIDUAL, WIDE_X, WORDS, BLOCK_N,
                BLOCK_K,
            )  # fmt: skip
    return gate_acc, up_acc, squares_sum


@triton.jit
def _prefetch_constants(scale_ptr, bias_ptr, norm_weight_ptr, first, num_channels,
                        SCALED: tl.constexpr, HAS_BIAS: tl.constexpr, GATED: tl.constexpr,
                        NORM_OUT: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    """The lines of the epilogue's per-channel constants (finish.epilogue_constants) for the
    channels from `first` into L2: after a step has streamed its weights through L2 they come
    from memory otherwise, on the product's last steps."""
    if SCALED:
        _prefetch_vector(scale_ptr, first, num_channels, BLOCK_N)
        if GATED:
            _prefetch_vector(scale_ptr + num_channels, first, num_channels, BLOCK_N)
    if HAS_BIAS:
        _prefetch_vector(bias_ptr, first, num_channels, BLOCK_N)
    if NORM_OUT:
        _prefetch_vector(norm_weight_ptr, first, num_channels, BLOCK_N)


@triton.jit
def _prefetch_vector(pointer, first, length, BLOCK_N: tl.constexpr):
    """Lines of pointer[first : first + BLOCK_N] (every 32nd element: a line of float32, half a
    line of bf16), indices past `length` clamped to its last element."""
    at = first + tl.arange(0, (BLOCK_N + 31) // 32) * 32
    prefetch_to_l2(pointer + tl.minimum(at, length - 1))


@triton.jit
def _prefetch_rows(w_ptr, w_rows, in_range, first_unit, stride_w, LINES: tl.constexpr,
                   LINE_UNITS: tl.constexpr):  # fmt: skip
    """The first LINES lines of W's rows `w_rows` from stored unit `first_unit` into L2 (rows
    past the end fetch row 0's lines instead: no address outside W)."""
    rows = tl.where(in_range, w_rows, 0)
    units = first_unit + tl.arange(0, LINES) * LINE_UNITS
    prefetch_to_l2(w_ptr + rows[:, None] * stride_w + units[None, :])


@triton.jit
def _stored_step(
    gate_acc, up_acc, squares_sum, x_ptr, w_ptr, group_scale_ptr, group_offset_ptr,
    residual_ptr, norm_weight_ptr, residual_out_ptr, write_sum, channels, in_range, rows,
    num_rows, num_channels, k0, stride_x, stride_w, stride_group_row, stride_group, depth,
    tile_dtype, GATED: tl.constexpr, DOT: tl.constexpr, IEEE: tl.constexpr, A8: tl.constexpr,
    BITS: tl.constexpr, EVEN_K: tl.constexpr, INT4_GROUP: tl.constexpr,
    INT4_PER_UNIT: tl.constexpr, INT4_LOW_FIRST: tl.constexpr, NORMED: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr, WIDE_X: tl.constexpr, WORDS: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """One step of K: x's rows (normed: add_norm.py), times W's tile (and the up rows' when
    GATED), accumulated."""
    x, x_scale, squares_sum = x_step(
        squares_sum, x_ptr, residual_ptr, norm_weight_ptr, residual_out_ptr, write_sum, rows,
        num_rows, k0, stride_x, depth, A8, EVEN_K, NORMED, HAS_RESIDUAL, WIDE_X, 0, BLOCK_N,
        BLOCK_K,
    )  # fmt: skip
    gate_acc = _rows_step(
        gate_acc, x, x_scale, w_ptr, group_scale_ptr, group_offset_ptr, channels, in_range, k0,
        stride_w, stride_group_row, stride_group, depth, tile_dtype, DOT, IEEE, A8, BITS,
        EVEN_K, INT4_GROUP, INT4_PER_UNIT, INT4_LOW_FIRST, WORDS, BLOCK_N, BLOCK_K,
    )  # fmt: skip
    if GATED:
        up_acc = _rows_step(
            up_acc, x, x_scale, w_ptr, group_scale_ptr, group_offset_ptr,
            channels + num_channels, in_range, k0, stride_w, stride_group_row, stride_group,
            depth, tile_dtype, DOT, IEEE, A8, BITS, EVEN_K, INT4_GROUP, INT4_PER_UNIT,
            INT4_LOW_FIRST, WORDS, BLOCK_N, BLOCK_K,
        )  # fmt: skip
    return gate_acc, up_acc, squares_sum


@triton.jit
def _rows_step(
    acc, x, x_scale, w_ptr, group_scale_ptr, group_offset_ptr, w_rows, in_range, k0, stride_w,
    stride_group_row, stride_group, depth, tile_dtype, DOT: tl.constexpr, IEEE: tl.constexpr,
    A8: tl.constexpr, BITS: tl.constexpr, EVEN_K: tl.constexpr, INT4_GROUP: tl.constexpr,
    INT4_PER_UNIT: tl.constexpr, INT4_LOW_FIRST: tl.constexpr, WORDS: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """acc plus x times W's rows `w_rows` over one step of K: the tile widened then multiplied,
    or for int4 on tensor cores with BITS, q - 8 multiplied as is and the step's group scale and
    offset applied to the sums (s * sum (q - 8) x + o * sum x): no per-value scaling."""
    if DOT and WORDS == 1:  # int8 in bf16 pairs by PTX, for bf16 rows (weight_tiles.py)
        w = int8_pairs_tile(w_ptr, w_rows, in_range, k0, stride_w, depth, EVEN_K, BLOCK_N,
                            BLOCK_K)  # fmt: skip
        acc = accumulate(acc, x, x_scale, w, DOT, IEEE, A8)
    elif INT4_GROUP > 0 and DOT and BITS:
        q = int4_values(w_ptr, w_rows, in_range, k0, stride_w, depth, tile_dtype, BITS, EVEN_K,
                        INT4_PER_UNIT, INT4_LOW_FIRST, BLOCK_N, BLOCK_K)  # fmt: skip
        sums = accumulate(tl.zeros(acc.shape, dtype=tl.float32), x, x_scale, q, DOT, IEEE, A8)
        s, o = int4_group_scales(group_scale_ptr, group_offset_ptr, w_rows, in_range, k0,
                                 stride_group_row, stride_group, depth, INT4_GROUP)  # fmt: skip
        x_sums = tl.sum(x.to(tl.float32), axis=1)
        acc += sums * s[:, None] + o[:, None] * x_sums[None, :]
    else:
        w = weight_tile(
            w_ptr, group_scale_ptr, group_offset_ptr, w_rows, in_range, k0, stride_w,
            stride_group_row, stride_group, depth, tile_dtype, BITS, EVEN_K, INT4_GROUP,
            INT4_PER_UNIT, INT4_LOW_FIRST, BLOCK_N, BLOCK_K, WORDS,
        )  # fmt: skip
        acc = accumulate(acc, x, x_scale, w, DOT, IEEE, A8)
    return acc


@triton.jit
def _int4_row_steps(
    gate_acc, up_acc, squares_sum, x_ptr, w_ptr, group_scale_ptr, group_offset_ptr,
    residual_ptr, norm_weight_ptr, residual_out_ptr, write_sum, channels, in_range,
    num_channels, k0, stride_w, stride_group_row, stride_group, depth, GATED: tl.constexpr,
    BITS: tl.constexpr, EVEN_K: tl.constexpr, INT4_GROUP: tl.constexpr,
    INT4_PER_UNIT: tl.constexpr, INT4_LOW_FIRST: tl.constexpr, NORMED: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """One step of K of one row times int4 values (int4_row.py): the gate rows', and the up
    rows' when GATED (the up rows' step reads x again, from cache; its squares are the gate
    step's, not added twice)."""
    gate_acc, squares_sum = int4_row_step(
        gate_acc, squares_sum, x_ptr, w_ptr, group_scale_ptr, group_offset_ptr, residual_ptr,
        norm_weight_ptr, residual_out_ptr, write_sum, channels, in_range, k0, stride_w,
        stride_group_row, stride_group, depth, BITS, EVEN_K, INT4_GROUP, INT4_PER_UNIT,
        INT4_LOW_FIRST, NORMED, HAS_RESIDUAL, BLOCK_K,
    )  # fmt: skip
    if GATED:
        up_acc, _ = int4_row_step(
            up_acc, squares_sum, x_ptr, w_ptr, group_scale_ptr, group_offset_ptr, residual_ptr,
            norm_weight_ptr, residual_out_ptr, write_sum, channels + num_channels, in_range, k0,
            stride_w, stride_group_row, stride_group, depth, BITS, EVEN_K, INT4_GROUP,
            INT4_PER_UNIT, INT4_LOW_FIRST, NORMED, HAS_RESIDUAL, BLOCK_K,
        )  # fmt: skip
    return gate_acc, up_acc, squares_sum
