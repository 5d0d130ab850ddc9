"""How a small-rows product's float32 sums become its output: normed (add_norm.py), scaled per
channel, biased or gated, and rounded; and with split K, the partial sums added first, by the
last of a tile's programs to arrive (`fold`) or by a second kernel (`reduce_kernel`). With
NORM_OUT the output then goes through half of the residual add and RMSNorm after it
(`norm_out_values`: add_norm_input.NormOut).

These kernels are short and their time is mostly the latency of loads that wait on each other.
With EARLY (device.early_epilogue_loads) every load an epilogue needs is issued before its first
use: the reduce kernel loads the model's per-channel constants (`epilogue_constants`) before it
waits on the product before it (PDL), then every split's partial sums and the residual at once;
`store_output` loads its operands before any store. Otherwise the splits are added one load
after another and the norm's weight is loaded after the residual's store, a second trip to
memory (the norm's weight is not in L2 by then: the step has read gigabytes of weights since)."""

from __future__ import annotations

import triton
import triton.language as tl

from aioworker.compute.layers.gdc import wait_for_previous_kernel
from aioworker.compute.layers.gemv.add_norm import inverse_rms


@triton.jit
def epilogue_constants(scale_ptr, bias_ptr, norm_weight_ptr, channels, num_channels,
                       SCALED: tl.constexpr, HAS_BIAS: tl.constexpr, GATED: tl.constexpr,
                       NORM_OUT: tl.constexpr):  # fmt: skip
    """The epilogue's per-channel constants, float32 [channels]: (scale, up's scale, bias, the
    next norm's weight), zeros where unused. Model weights, which no kernel of a step writes, so
    a kernel launched with PDL may load them before it waits (gdc.py)."""
    in_range = channels < num_channels
    zero = tl.zeros(channels.shape, dtype=tl.float32)
    scale, up_scale, bias, norm_weight = zero, zero, zero, zero
    if SCALED:
        scale = tl.load(scale_ptr + channels, mask=in_range, other=0.0).to(tl.float32)
        if GATED:
            up_scale = tl.load(scale_ptr + num_channels + channels, mask=in_range,
                               other=0.0).to(tl.float32)  # fmt: skip
    if HAS_BIAS:
        bias = tl.load(bias_ptr + channels, mask=in_range, other=0.0).to(tl.float32)
    if NORM_OUT:
        norm_weight = tl.load(norm_weight_ptr + channels, mask=in_range, other=0.0).to(tl.float32)
    return scale, up_scale, bias, norm_weight


@triton.jit
def _epilogue(gate, up, scale_ptr, bias_ptr, channels, num_channels, SCALED: tl.constexpr,
              HAS_BIAS: tl.constexpr, GATED: tl.constexpr):  # fmt: skip
    """Sums [BLOCK_N, BLOCK_M] (float32) -> the output values: scaled, then biased (a plain
    product) or gated."""
    scale, up_scale, bias, _ = epilogue_constants(scale_ptr, bias_ptr, scale_ptr, channels,
                                                  num_channels, SCALED, HAS_BIAS, GATED, False)  # fmt: skip
    return _epilogue_of(gate, up, scale, up_scale, bias, SCALED, HAS_BIAS, GATED)


@triton.jit
def _epilogue_of(gate, up, scale, up_scale, bias, SCALED: tl.constexpr, HAS_BIAS: tl.constexpr,
                 GATED: tl.constexpr):  # fmt: skip
    """`_epilogue` with its constants loaded (`epilogue_constants`)."""
    if SCALED:
        gate = gate * scale[:, None]
        if GATED:
            up = up * up_scale[:, None]
    if HAS_BIAS:
        gate += bias[:, None]
    return gate * tl.sigmoid(gate) * up if GATED else gate


@triton.jit
def norm_out_values(
    y, at, residual_ptr, norm_weight_ptr, residual_out_ptr, squares_out_ptr, slot, channels,
    rows, num_rows, num_channels, out_mask,
):  # fmt: skip
    """The product's output y ([BLOCK_N, BLOCK_M], rounded to the output dtype) added to the
    residual (laid out as the output, at `at`) and rounded as torch's add rounds: h, written to
    residual_out; this program's sums of h^2 over its channels, one a row, written to slot
    `slot` of squares_out [slots, rows]; returns h * the norm's weight (float32, for the caller
    to round), as add_norm.normed_values makes it."""
    r = tl.load(residual_ptr + at, mask=out_mask, other=0.0)
    h = _residual_sum(y, r, at, residual_out_ptr, squares_out_ptr, slot, rows, num_rows, out_mask)
    n = tl.load(norm_weight_ptr + channels, mask=channels < num_channels, other=0.0)
    return h * n.to(tl.float32)[:, None]


@triton.jit
def _residual_sum(y, r, at, residual_out_ptr, squares_out_ptr, slot, rows, num_rows, out_mask):
    """h = y + the residual r, rounded and written as `norm_out_values` says, with its sums of
    squares; returns h in float32 (zero outside out_mask)."""
    h = (y.to(tl.float32) + r.to(tl.float32)).to(y.dtype)
    tl.store(residual_out_ptr + at, h, mask=out_mask)
    h32 = tl.where(out_mask, h.to(tl.float32), 0.0)
    tl.store(squares_out_ptr + slot * num_rows + rows, tl.sum(h32 * h32, axis=0),
             mask=rows < num_rows)  # fmt: skip
    return h32


@triton.jit
def squares_total(squares_ptr, rows, num_rows, num_squares, SQUARES_P2: tl.constexpr):
    """Each row's total of the num_squares sums of squares [num_squares, rows] at squares_ptr,
    loaded at once (up to 256 of them: a product of one program per output tile left them)."""
    slots = tl.arange(0, SQUARES_P2)
    mask = (slots[:, None] < num_squares) & (rows[None, :] < num_rows)
    sums = tl.load(squares_ptr + slots[:, None] * num_rows + rows[None, :], mask=mask, other=0.0)
    return tl.sum(sums, axis=0)


@triton.jit
def fold(
    partial_ptr, counter_ptr, squares_ptr, scale_ptr, bias_ptr, out_ptr, tile, at, channels,
    rows, num_rows, num_channels, depth, stride_split, stride_out, eps, out_mask,
    residual_ptr, norm_weight_ptr, residual_out_ptr,
    NORMED: tl.constexpr, SCALED: tl.constexpr, HAS_BIAS: tl.constexpr, GATED: tl.constexpr,
    NORM_OUT: tl.constexpr, EARLY: tl.constexpr = False,
):  # fmt: skip
    """Split K finished without a second kernel: the last of the tile's programs to arrive
    (counted at counter_ptr[tile], which it sets back to 0 for the next product) adds every
    split's partial sums (and squares) and stores the output."""
    # Every thread's partials are written before the count says so (release); the last to
    # arrive sees every split's (acquire), read past L1, which may hold no copy anyway.
    tl.debug_barrier()
    splits = tl.num_programs(1)
    arrived = tl.atomic_add(counter_ptr + tile, 1, sem="acq_rel")
    if arrived == splits - 1:
        gate = tl.zeros(out_mask.shape, dtype=tl.float32)
        up = tl.zeros(out_mask.shape, dtype=tl.float32)
        squares_sum = tl.zeros(rows.shape, dtype=tl.float32)
        for other in range(splits):
            from_split = partial_ptr + other * stride_split + at
            gate += tl.load(from_split, mask=out_mask, other=0.0, cache_modifier=".cg")
            if GATED:
                up += tl.load(from_split + num_channels, mask=out_mask, other=0.0,
                              cache_modifier=".cg")  # fmt: skip
            if NORMED:
                squares_at = (tile * splits + other) * num_rows + rows
                squares_sum += tl.load(squares_ptr + squares_at, mask=rows < num_rows,
                                       other=0.0, cache_modifier=".cg")  # fmt: skip
        store_output(gate, up, squares_sum, scale_ptr, bias_ptr, out_ptr, channels, rows,
                     num_rows, num_channels, depth, stride_out, eps, out_mask, residual_ptr,
                     norm_weight_ptr, residual_out_ptr, squares_ptr, tile, NORMED, SCALED,
                     HAS_BIAS, GATED, NORM_OUT, EARLY)  # fmt: skip
        tl.atomic_xchg(counter_ptr + tile, 0)


@triton.jit
def store_output(
    gate, up, squares_sum, scale_ptr, bias_ptr, out_ptr, channels, rows, num_rows, num_channels,
    depth, stride_out, eps, out_mask, residual_ptr, norm_weight_ptr, residual_out_ptr,
    squares_out_ptr, slot, NORMED: tl.constexpr, SCALED: tl.constexpr, HAS_BIAS: tl.constexpr,
    GATED: tl.constexpr, NORM_OUT: tl.constexpr, EARLY: tl.constexpr = False,
):  # fmt: skip
    """The sums [BLOCK_N, BLOCK_M] (NORMED: times 1 / rms) through the epilogue, rounded into
    the output rows; with NORM_OUT, first through `norm_out_values` (this program's sums of
    squares in slot `slot`). EARLY: every operand loaded before the first store."""
    at = rows[None, :] * stride_out + channels[:, None]
    if EARLY:
        scale, up_scale, bias, norm_weight = epilogue_constants(
            scale_ptr, bias_ptr, norm_weight_ptr, channels, num_channels, SCALED, HAS_BIAS,
            GATED, NORM_OUT,
        )  # fmt: skip
        r = gate
        if NORM_OUT:
            r = tl.load(residual_ptr + at, mask=out_mask, other=0.0)
    if NORMED:
        inv_rms = inverse_rms(squares_sum, depth, eps)[None, :]
        gate, up = gate * inv_rms, up * inv_rms
    if EARLY:
        y = _output_of(gate, up, scale, up_scale, bias, norm_weight, r, at, out_ptr,
                       residual_out_ptr, squares_out_ptr, slot, rows, num_rows, out_mask, SCALED,
                       HAS_BIAS, GATED, NORM_OUT)  # fmt: skip
    else:
        y = _output(gate, up, at, out_ptr, scale_ptr, bias_ptr, residual_ptr, norm_weight_ptr,
                    residual_out_ptr, squares_out_ptr, slot, channels, rows, num_rows,
                    num_channels, out_mask, SCALED, HAS_BIAS, GATED, NORM_OUT)  # fmt: skip
    tl.store(out_ptr + at, y, mask=out_mask)


@triton.jit
def _output(
    gate, up, at, out_ptr, scale_ptr, bias_ptr, residual_ptr, norm_weight_ptr, residual_out_ptr,
    squares_out_ptr, slot, channels, rows, num_rows, num_channels, out_mask,
    SCALED: tl.constexpr, HAS_BIAS: tl.constexpr, GATED: tl.constexpr, NORM_OUT: tl.constexpr,
):  # fmt: skip
    """The sums [BLOCK_N, BLOCK_M] through the epilogue in the output's dtype, then (NORM_OUT)
    through `norm_out_values`, each operand loaded where it is first used."""
    y = _epilogue(gate, up, scale_ptr, bias_ptr, channels, num_channels, SCALED, HAS_BIAS, GATED)
    y = y.to(out_ptr.dtype.element_ty)
    if NORM_OUT:
        y = norm_out_values(y, at, residual_ptr, norm_weight_ptr, residual_out_ptr,
                            squares_out_ptr, slot, channels, rows, num_rows, num_channels,
                            out_mask).to(out_ptr.dtype.element_ty)  # fmt: skip
    return y


@triton.jit
def _output_of(
    gate, up, scale, up_scale, bias, norm_weight, r, at, out_ptr, residual_out_ptr,
    squares_out_ptr, slot, rows, num_rows, out_mask, SCALED: tl.constexpr,
    HAS_BIAS: tl.constexpr, GATED: tl.constexpr, NORM_OUT: tl.constexpr,
):  # fmt: skip
    """`_output` with its operands loaded: the constants (`epilogue_constants`) and the residual
    r (NORM_OUT)."""
    y = _epilogue_of(gate, up, scale, up_scale, bias, SCALED, HAS_BIAS, GATED)
    y = y.to(out_ptr.dtype.element_ty)
    if NORM_OUT:
        h = _residual_sum(y, r, at, residual_out_ptr, squares_out_ptr, slot, rows, num_rows,
                          out_mask)  # fmt: skip
        y = (h * norm_weight[:, None]).to(out_ptr.dtype.element_ty)
    return y


@triton.jit
def reduce_kernel(
    partial_ptr, scale_ptr, bias_ptr, out_ptr, squares_ptr, num_splits, num_squares, num_rows,
    num_channels, depth, stride_split, stride_out, eps, residual_ptr, norm_weight_ptr,
    residual_out_ptr, SCALED: tl.constexpr, HAS_BIAS: tl.constexpr, GATED: tl.constexpr,
    NORMED: tl.constexpr, NORM_OUT: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr,
    SQUARES_P2: tl.constexpr = 1, EARLY: tl.constexpr = False, SPLITS_P2: tl.constexpr = 1,
):  # fmt: skip
    """One program per (row, block of channels): the partials' sum, then the epilogue (NORMED:
    first 1 / rms from the num_squares sums of squares [num_squares, rows] at squares_ptr).
    NORM_OUT: then `norm_out_values`, its sums of squares into slot (block of channels) of
    squares_ptr. EARLY (SPLITS_P2 >= num_splits): the epilogue's constants loaded before the
    wait, then the partials of every split and the residual at once."""
    row = tl.program_id(0)
    channels = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = channels < num_channels
    width = num_channels * 2 if GATED else num_channels
    at = row * stride_out + channels[:, None]
    if EARLY:
        scale, up_scale, bias, norm_weight = epilogue_constants(
            scale_ptr, bias_ptr, norm_weight_ptr, channels, num_channels, SCALED, HAS_BIAS,
            GATED, NORM_OUT,
        )  # fmt: skip
    wait_for_previous_kernel(PDL)
    if EARLY:
        gate, up, r = _splits_and_residual(partial_ptr, residual_ptr, at, row, width, channels,
                                           mask, num_channels, num_splits, stride_split, GATED,
                                           NORM_OUT, SPLITS_P2)  # fmt: skip
    else:
        gate = tl.zeros((BLOCK,), dtype=tl.float32)
        up = tl.zeros((BLOCK,), dtype=tl.float32)
        for split in range(num_splits):
            base = partial_ptr + split * stride_split + row * width + channels
            gate += tl.load(base, mask=mask, other=0.0)
            if GATED:
                up += tl.load(base + num_channels, mask=mask, other=0.0)
    if NORMED:
        squares_sum = squares_total(squares_ptr, row + tl.arange(0, 1), num_rows, num_squares,
                                    SQUARES_P2)  # fmt: skip
        inv_rms = inverse_rms(squares_sum, depth, eps)
        gate, up = gate * inv_rms, up * inv_rms
    rows, slot, out_mask = row + tl.arange(0, 1), tl.program_id(1), mask[:, None]
    if EARLY:
        y = _output_of(gate[:, None], up[:, None], scale, up_scale, bias, norm_weight, r, at,
                       out_ptr, residual_out_ptr, squares_ptr, slot, rows, num_rows, out_mask,
                       SCALED, HAS_BIAS, GATED, NORM_OUT)  # fmt: skip
    else:
        y = _output(gate[:, None], up[:, None], at, out_ptr, scale_ptr, bias_ptr, residual_ptr,
                    norm_weight_ptr, residual_out_ptr, squares_ptr, slot, channels, rows,
                    num_rows, num_channels, out_mask, SCALED, HAS_BIAS, GATED, NORM_OUT)  # fmt: skip
    tl.store(out_ptr + at, y, mask=out_mask)


@triton.jit
def _splits_and_residual(
    partial_ptr, residual_ptr, at, row, width, channels, mask, num_channels, num_splits,
    stride_split, GATED: tl.constexpr, NORM_OUT: tl.constexpr, SPLITS_P2: tl.constexpr,
):  # fmt: skip
    """(gate's and up's sums over the splits [channels], the residual at `at` (NORM_OUT, else a
    placeholder)), every load issued before any is used."""
    splits = tl.arange(0, SPLITS_P2)
    parts_at = partial_ptr + splits[:, None] * stride_split + row * width + channels[None, :]
    parts_mask = (splits[:, None] < num_splits) & mask[None, :]
    gate = tl.load(parts_at, mask=parts_mask, other=0.0)
    up = gate
    if GATED:
        up = tl.load(parts_at + num_channels, mask=parts_mask, other=0.0)
    r = gate
    if NORM_OUT:
        r = tl.load(residual_ptr + at, mask=mask[:, None], other=0.0)
    return tl.sum(gate, axis=0), tl.sum(up, axis=0), r
