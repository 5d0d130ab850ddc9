"""Launching the small-rows product kernels (kernels.py) with a tile configuration: one call,
y = x W^T for 1 to MAX_ROWS rows, optionally scaled per channel and gated (silu(gate) * up), and
optionally of x's residual add and RMSNorm (AddNorm) rather than x."""

from __future__ import annotations

import torch
import triton

from aioworker.compute.layers.arrivals import MAX_COUNTS, arrival_counts
from aioworker.compute.layers.gemv.add_norm_input import (
    NORMED_DTYPES,
    AddNorm,
    NormOut,
    PreNormed,
)
from aioworker.compute.layers.gemv.choice import INT4_VALUES
from aioworker.compute.layers.gemv.finish import reduce_kernel
from aioworker.compute.layers.gemv.kernels import _small_rows_kernel
from aioworker.compute.layers.gemv.tiles import MAX_ROWS, Tiles
from aioworker.compute.layers.pdl import launch_options
from aioworker.compute.layers.quantized.weight_only import INT4_BLOCK

REDUCE_BLOCK = 256
LINE_BYTES = 128  # what a prefetch fetches


def _k_per_split(depth: int, tiles: Tiles) -> tuple[int, int]:
    """(K per split rounded up to whole BLOCK_K steps, the splits that leaves)."""
    per_split = triton.cdiv(triton.cdiv(depth, tiles.splits), tiles.block_k) * tiles.block_k
    return per_split, triton.cdiv(depth, per_split)


def small_rows_product(
    x: torch.Tensor,
    weight: torch.Tensor,
    tiles: Tiles,
    scale: torch.Tensor | None = None,
    gated: bool = False,
    bias: torch.Tensor | None = None,
    int4_groups: tuple[torch.Tensor, torch.Tensor] | None = None,
    add_norm: AddNorm | None = None,
    norm_out: NormOut | None = None,
    prenormed: PreNormed | None = None,
    early_loads: bool = False,
) -> torch.Tensor | PreNormed:
    """x: [M, K], M <= MAX_ROWS, rows contiguous; weight: [N, K] (bf16, fp16, float32 or e4m3,
    rows contiguous); scale: [N] or None; bias: [N] or None (not with `gated`); int4_groups:
    (scales, offsets), each [N, K / G], when weight holds two 4-bit values a byte ([N, K / 2]):
    w = (q - 8) s + o; with tiles.blocks, weight is int4's blocks layout ([N, K / 8] int32,
    int4_blocks.py). Returns [M, N] in x's dtype, or with `gated`
    (weight = [gate; up], N = 2I) silu(x gate^T) * (x up^T): [M, I]. add_norm: x is the row
    before a residual add and RMSNorm, done in the kernel. norm_out (a plain product): its
    output goes on into half of the residual add and RMSNorm after it, returned as PreNormed.
    prenormed: x is prenormed.x, the product's sums scaled by 1 / rms of its rows (PreNormed).
    early_loads: the finishing steps' loads issued before their first use (finish.py)."""
    _check_operands(x, weight, tiles, gated, bias, int4_groups, add_norm)
    _check_norms(x, weight, gated, add_norm, norm_out, prenormed)
    num_rows, depth = x.shape
    channels = weight.shape[0] // 2 if gated else weight.shape[0]
    out = torch.empty(num_rows, channels, dtype=x.dtype, device=x.device)
    per_split, splits = _k_per_split(depth, tiles)
    output_tiles = triton.cdiv(channels, tiles.block_n)
    partial, counts = out, out
    fold = tiles.fold and splits > 1 and prenormed is None  # (fold reads only NORMED squares)
    if splits > 1:
        width = channels * 2 if gated else channels
        partial = torch.empty(splits, num_rows, width, dtype=torch.float32, device=x.device)
    if fold:
        if output_tiles > MAX_COUNTS:  # a folding split's programs count per output tile
            raise ValueError(f"{output_tiles} output tiles fold split K: at most {MAX_COUNTS}")
        counts = arrival_counts(x.device)
    group, group_scale, group_offset, per_unit = 0, weight, weight, 1
    if int4_groups is not None:
        group_scale, group_offset = int4_groups
        if group_scale.stride() != group_offset.stride():
            raise ValueError("int4 scales and offsets must be laid out alike")
        group = depth // group_scale.shape[1]
        per_unit = INT4_VALUES[weight.dtype]
        misfit = tiles.int4_misfit(group)
        if misfit:
            raise ValueError(misfit)
        if tiles.blocks:
            _check_blocks(weight, tiles, add_norm)
    block_m = max(16, triton.next_power_of_2(num_rows)) if tiles.dot else 1
    row_groups = not tiles.dot and group > 0
    summed_per = INT4_BLOCK if tiles.blocks else group  # FMA int4: a sum per group, or block
    acc_columns = (
        block_m if tiles.dot else tiles.block_k // summed_per if row_groups else tiles.block_k
    )
    placeholder = scale if scale is not None else weight
    normed = add_norm is not None
    reduced_by_kernel = splits > 1 and not fold
    slots = triton.cdiv(channels, REDUCE_BLOCK) if reduced_by_kernel else output_tiles
    residual, residual_out, norm_weight, eps, squares, num_squares = _norm_operands(
        x, partial, add_norm, norm_out, prenormed, splits, output_tiles if fold else 1, slots
    )
    squares_p2 = triton.next_power_of_2(max(1, num_squares))  # the slots loaded at once
    options = launch_options()
    _small_rows_kernel[(output_tiles, splits)](
        x, weight, placeholder, bias if bias is not None else weight, group_scale, group_offset,
        out, partial, counts, residual, norm_weight, residual_out, squares,
        num_rows, channels, depth, per_split, x.stride(0), weight.stride(0),
        group_scale.stride(0), group_scale.stride(1), partial.stride(0), out.stride(0), eps,
        num_squares, SCALED=scale is not None, HAS_BIAS=bias is not None, GATED=gated, DOT=tiles.dot,
        IEEE=x.dtype == torch.float32, INT4_GROUP=group, INT4_PER_UNIT=per_unit,
        INT4_LOW_FIRST=weight.dtype == torch.int32, NORMED=normed,
        HAS_RESIDUAL=normed and add_norm.residual is not None, A8=tiles.a8, BITS=tiles.bits,
        SPLIT=splits > 1, FOLD=fold, EVEN_K=depth % tiles.block_k == 0 and per_split * splits == depth,
        ROW_GROUPS=row_groups, ACC_COLUMNS=acc_columns,
        WIDE_X=tiles.wide_x and not tiles.dot and not normed and not row_groups,
        WORDS=_words(tiles, weight, x), INT4_BLOCKS=_int4_blocks(tiles, weight, x),
        BLOCK_M=block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k,
        num_warps=tiles.num_warps, num_stages=tiles.num_stages, PDL=bool(options),
        PREFETCH_LINES=_prefetch_lines(tiles, weight, per_unit) if options else 0,
        LINE_UNITS=max(1, LINE_BYTES // weight.element_size()),
        FMA_STAGES=tiles.num_stages if tiles.pipelined and not tiles.dot else None,
        AHEAD=tiles.ahead, X_ROWS=_x_rows(tiles, num_rows, normed),
        PRENORMED=prenormed is not None, NORM_OUT=norm_out is not None,
        SQUARES_P2=squares_p2, EARLY=early_loads, **options,
    )  # fmt: skip
    if reduced_by_kernel:
        reduce_kernel[(num_rows, slots)](
            partial, placeholder, bias if bias is not None else weight, out, squares, splits,
            num_squares, num_rows, channels, depth, partial.stride(0), out.stride(0), eps,
            residual, norm_weight, residual_out, SCALED=scale is not None,
            HAS_BIAS=bias is not None, GATED=gated, NORMED=normed or prenormed is not None,
            NORM_OUT=norm_out is not None, BLOCK=REDUCE_BLOCK, PDL=bool(options),
            SQUARES_P2=squares_p2, EARLY=early_loads,
            SPLITS_P2=triton.next_power_of_2(splits) if early_loads else 1, **options,
        )  # fmt: skip
    if norm_out is not None:
        return PreNormed(out, norm_out.residual_out, squares, norm_out.weight, norm_out.eps)
    return out


def _norm_operands(x, partial, add_norm, norm_out, prenormed, splits, squares_tiles, slots):
    """(residual, residual_out, norm weight, eps, squares, their count) for the kernels: a
    norm's operands where the product takes part in one (AddNorm, NormOut, PreNormed), else
    placeholders. squares: NORMED and split, each slice's sums [squares_tiles, splits, rows];
    NormOut, each program's [slots, rows], written; PreNormed, as given."""
    num_rows = x.shape[0]
    if add_norm is not None:
        residual = add_norm.residual if add_norm.residual is not None else x
        residual_out = add_norm.residual_out if add_norm.residual_out is not None else x
        squares = partial
        if splits > 1:
            squares = torch.empty(squares_tiles, splits, num_rows, dtype=torch.float32,
                                  device=x.device)  # fmt: skip
        return residual, residual_out, add_norm.weight, add_norm.eps, squares, splits
    if norm_out is not None:
        squares = torch.empty(slots, num_rows, dtype=torch.float32, device=x.device)
        return norm_out.residual, norm_out.residual_out, norm_out.weight, 0.0, squares, slots
    if prenormed is not None:
        squares = prenormed.squares
        return x, x, x, prenormed.eps, squares, squares.shape[0]
    return x, x, x, 0.0, partial, 0


def _words(tiles: Tiles, weight: torch.Tensor, x: torch.Tensor) -> int:
    """Tiles.words on int8: by PTX (1), or on FMA tiles for CPU tensors, which only Triton's
    interpreter takes and it runs no PTX, by Triton's operations (2, the same values); else 0.
    On tensor cores the PTX makes bf16 pairs, for bf16 rows only, reading W as int16 (K, the
    row stride and the address multiples of 4); elsewhere the dot tiles widen as they would."""
    if not tiles.words or weight.dtype != torch.int8:
        return 0
    if tiles.dot:
        aligned = not (weight.shape[1] % 4 or weight.stride(0) % 4 or weight.data_ptr() % 4)
        return int(weight.is_cuda and x.dtype == torch.bfloat16 and aligned)
    return 2 if weight.device.type == "cpu" else 1


def _int4_blocks(tiles: Tiles, weight: torch.Tensor, x: torch.Tensor) -> int:
    """Tiles.blocks: widened by PTX (1), or by Triton's operations (2, the same values): for CPU
    tensors, which only the interpreter takes and it runs no PTX, and on tensor cores for rows
    other than bf16 (the PTX makes bf16 pairs); else 0."""
    if not tiles.blocks:
        return 0
    by_ptx = weight.device.type != "cpu" and (not tiles.dot or x.dtype == torch.bfloat16)
    return 1 if by_ptx else 2


def _x_rows(tiles: Tiles, num_rows: int, normed: bool) -> int:
    """int4's raw tiles (blocks, bits, on tensor cores), x not normed: the rows whose sums each
    step takes from x loaded again, 1 or MAX_ROWS, not the 16 the tensor cores are given; else
    0 (from the step's tile)."""
    raw = tiles.dot and tiles.bits and tiles.blocks
    return 0 if not raw or normed else 1 if num_rows == 1 else MAX_ROWS


def _check_blocks(weight: torch.Tensor, tiles: Tiles, add_norm) -> None:
    """ValueError naming what the int4 blocks tiles cannot take (their groups: int4_misfit)."""
    if weight.dtype != torch.int32:
        raise ValueError(f"blocks tiles read int32 words, not {weight.dtype}")
    if add_norm is not None and not tiles.dot:
        raise ValueError("FMA blocks tiles take x as it is: norm it first")


def _prefetch_lines(tiles: Tiles, weight: torch.Tensor, values_per_unit: int) -> int:
    """Tiles.prefetch: the lines of a row's first step of K, at least one; else none."""
    if not tiles.prefetch:
        return 0
    step_bytes = tiles.block_k // values_per_unit * weight.element_size()
    return triton.next_power_of_2(max(1, step_bytes // LINE_BYTES))


def _check_operands(x, weight, tiles: Tiles, gated: bool, bias, int4_groups, add_norm) -> None:
    """ValueError naming what the kernels cannot multiply as asked."""
    num_rows, depth = x.shape
    stored_depth = depth // INT4_VALUES.get(weight.dtype, 1) if int4_groups else depth
    if not 1 <= num_rows <= MAX_ROWS or weight.shape[1] != stored_depth or x.stride(1) != 1:
        raise ValueError(f"takes 1 to {MAX_ROWS} contiguous rows of {weight.shape[1]}: {x.shape}")
    if not tiles.dot and num_rows != 1:
        raise ValueError("the FMA tiles multiply one row only")
    if tiles.ahead and not (tiles.blocks and int4_groups):
        raise ValueError("ahead tiles read int4's blocks layout: set blocks with int4 weights")
    if tiles.a8 and (weight.dtype != torch.float8_e4m3fn or not tiles.dot):
        raise ValueError(f"a8 tiles multiply e4m3 weights on tensor cores, not {weight.dtype}")
    if gated and bias is not None:
        raise ValueError("a gated product takes no bias")
    if add_norm is not None:
        _check_add_norm(x, add_norm)


def _check_norms(x, weight, gated: bool, add_norm, norm_out, prenormed) -> None:
    """ValueError naming a norm the product cannot take part in as asked."""
    if sum(n is not None for n in (add_norm, norm_out, prenormed)) > 1:
        raise ValueError("a product takes one of add_norm, norm_out and prenormed")
    if norm_out is not None:
        if gated or x.dtype not in NORMED_DTYPES:
            raise ValueError(f"norm_out follows a plain bf16 or float32 product, not {x.dtype}")
        shape = (x.shape[0], weight.shape[0])
        for name in ("residual", "residual_out"):
            t = getattr(norm_out, name)
            if tuple(t.shape) != shape or not t.is_contiguous():
                raise ValueError(f"norm_out's {name} must be a contiguous {shape}")
    if prenormed is not None and (
        prenormed.x.data_ptr() != x.data_ptr() or prenormed.squares.shape[1:] != (x.shape[0],)
    ):
        raise ValueError("prenormed: x is prenormed.x, its squares [slots, rows]")


def _check_add_norm(x: torch.Tensor, add_norm: AddNorm) -> None:
    if x.dtype not in NORMED_DTYPES:
        raise ValueError(f"the norm is fused for bf16 and float32 rows, not {x.dtype}")
    if add_norm.weight.shape != (x.shape[1],) or add_norm.weight.stride(0) != 1:
        raise ValueError(f"the norm's weight must be contiguous [{x.shape[1]}]")
    for name in ("residual", "residual_out"):
        t = getattr(add_norm, name)
        if t is not None and (t.shape != x.shape or t.stride() != x.stride()):
            raise ValueError(f"{name} must be laid out as x: {tuple(x.shape)}, {x.stride()}")
    if (add_norm.residual is None) != (add_norm.residual_out is None):
        raise ValueError("a residual and residual_out go together")
