"""A split product's partial sums added inside the residual add and RMSNorm that reads the
product (split_sums.py says when): one program a row adds the splits, scales, biases and rounds
them as finish.reduce_kernel does, then adds the residual and norms as fused.add_rms_norm does,
so the values are the unfused path's, bit for bit."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from aioworker.compute.layers.fused import add_norm_row
from aioworker.compute.layers.gdc import wait_for_previous_kernel
from aioworker.compute.layers.gemv.split_sums import SplitSums
from aioworker.compute.layers.pdl import launch_options


@triton.jit
def _sums_add_rms_norm_kernel(
    partial_ptr, scale_ptr, bias_ptr, residual_ptr, weight_ptr, out_ptr, residual_out_ptr,
    num_channels, stride_split, stride_row, stride_r, stride_o, stride_ro, eps,
    SPLITS: tl.constexpr, SCALED: tl.constexpr, HAS_BIAS: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    wait_for_previous_kernel(PDL)
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < num_channels
    # Added in reduce_kernel's order, from 0.0; unrolled so that every split's load is in
    # flight at once.
    sums = tl.zeros((BLOCK,), dtype=tl.float32)
    for split in tl.static_range(SPLITS):
        at = partial_ptr + split * stride_split + row * stride_row + cols
        sums += tl.load(at, mask=mask, other=0.0)
    if SCALED:  # then biased: finish._epilogue's order
        sums = sums * tl.load(scale_ptr + cols, mask=mask, other=0.0)
    if HAS_BIAS:
        sums += tl.load(bias_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = sums.to(out_ptr.dtype.element_ty)  # the product's output, as the reduce stores it
    # Without a residual the product's output is the residual stream: always stored.
    add_norm_row(y, row, cols, mask, residual_ptr, weight_ptr, out_ptr, residual_out_ptr,
                 stride_r, stride_o, stride_ro, num_channels, eps, HAS_RESIDUAL, True)  # fmt: skip


def add_rms_norm_of_sums(
    sums: SplitSums, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(y + residual), y + residual) for the product y whose partial sums `sums` holds
    (with no residual, (rms_norm(y), y)), in one kernel; residual: [rows, N] or None."""
    splits, num_rows, num_channels = sums.partial.shape
    if residual is not None and tuple(residual.shape) != (num_rows, num_channels):
        raise ValueError(f"residual {tuple(residual.shape)} for a product of {sums.shape}")
    placeholder = sums.partial
    out = torch.empty(num_rows, num_channels, dtype=sums.dtype, device=placeholder.device)
    residual_out = torch.empty_like(out)
    r = residual if residual is not None else out
    block = triton.next_power_of_2(num_channels)
    options = launch_options()
    _sums_add_rms_norm_kernel[(num_rows,)](
        placeholder, sums.scale if sums.scale is not None else placeholder,
        sums.bias if sums.bias is not None else placeholder, r, weight, out, residual_out,
        num_channels, placeholder.stride(0), placeholder.stride(1), r.stride(0), out.stride(0),
        residual_out.stride(0), eps, SPLITS=splits, SCALED=sums.scale is not None,
        HAS_BIAS=sums.bias is not None, HAS_RESIDUAL=residual is not None, BLOCK=block,
        PDL=bool(options), num_warps=min(16, max(4, block // 512)), **options,
    )  # fmt: skip
    return out, residual_out


def sum_splits(sums: SplitSums) -> torch.Tensor:
    """The product's output [rows, N] from its partial sums, by reduce_kernel."""
    from aioworker.compute.layers.gemv.product import reduce_splits

    num_rows, num_channels = sums.shape
    out = torch.empty(num_rows, num_channels, dtype=sums.dtype, device=sums.partial.device)
    reduce_splits(sums.partial, sums.scale, sums.bias, out, depth=1, squares=None, eps=0.0)
    return out
