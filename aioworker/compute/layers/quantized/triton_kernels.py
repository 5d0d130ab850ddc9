"""Triton kernels for the quantized formats on the GPU, each one pass over memory where torch
needs a chain of kernels (measured on the H200, Llama-3.1-8B shape: fp8's per-token activation
quantization in torch launched eight kernels per product and cost the batch-256 decode step
more than fp8's faster GEMM saved; int4's dequantization in torch took 83 ms a step at batch 64).
On the CPU the torch versions run instead (fp8.py, weight_only.py)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from aioworker.compute.layers.quantized.fp8 import E4M3, E4M3_MAX


@triton.jit
def _fp8_rows_kernel(
    x_ptr, q_ptr, scale_ptr, stride_x, stride_q, num_cols,
    FP8_MAX: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < num_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(x), axis=0) / FP8_MAX, 1e-12)
    q = tl.clamp(x / scale, -FP8_MAX, FP8_MAX)
    tl.store(q_ptr + row * stride_q + cols, q.to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(scale_ptr + row, scale)


def fp8_quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (e4m3 [M, K], float32 scales [M]), one program a row."""
    rows, columns = x.shape
    q = torch.empty(rows, columns, dtype=E4M3, device=x.device)
    scales = torch.empty(rows, dtype=torch.float32, device=x.device)
    if rows:
        block = triton.next_power_of_2(columns)
        _fp8_rows_kernel[(rows,)](
            x, q, scales, x.stride(0), q.stride(0), columns,
            FP8_MAX=E4M3_MAX, BLOCK=block, num_warps=8 if block >= 4096 else 4,
        )  # fmt: skip
    return q, scales


@triton.jit
def _int4_dequantize_kernel(
    packed_ptr, scale_ptr, offset_ptr, out_ptr, num_rows, num_bytes, num_groups,
    BYTES_PER_GROUP: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)  # byte columns
    mask = (rows < num_rows)[:, None] & (cols < num_bytes)[None, :]
    packed = tl.load(packed_ptr + rows[:, None] * num_bytes + cols[None, :], mask=mask, other=0)
    packed = packed.to(tl.int32)
    groups = rows[:, None] * num_groups + (cols // BYTES_PER_GROUP)[None, :]
    scale = tl.load(scale_ptr + groups, mask=mask, other=0.0).to(tl.float32)
    offset = tl.load(offset_ptr + groups, mask=mask, other=0.0).to(tl.float32)
    high = (((packed >> 4) & 0xF) - 8).to(tl.float32) * scale + offset
    low = ((packed & 0xF) - 8).to(tl.float32) * scale + offset
    # Interleaved in registers, so that the store is one contiguous run per row.
    values = tl.interleave(high, low).to(out_ptr.dtype.element_ty)
    out_cols = tl.program_id(1) * 2 * BLOCK_C + tl.arange(0, 2 * BLOCK_C)
    out_mask = (rows < num_rows)[:, None] & (out_cols < 2 * num_bytes)[None, :]
    tl.store(out_ptr + rows[:, None] * (2 * num_bytes) + out_cols[None, :], values, mask=out_mask)


def int4_dequantize(
    packed: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """[N, K / 2] two values a byte (high nibble first), scales and offsets [N, K / G] ->
    [N, K]: w = (q - 8) s + o."""
    rows, num_bytes = packed.shape
    packed, scales, offsets = packed.contiguous(), scales.contiguous(), offsets.contiguous()
    out = torch.empty(rows, 2 * num_bytes, dtype=dtype, device=packed.device)
    bytes_per_group = 2 * num_bytes // scales.shape[1] // 2
    grid = (triton.cdiv(rows, 32), triton.cdiv(num_bytes, 256))
    _int4_dequantize_kernel[grid](
        packed, scales, offsets, out, rows, num_bytes, scales.shape[1],
        BYTES_PER_GROUP=bytes_per_group, BLOCK_R=32, BLOCK_C=256, num_warps=8,
    )  # fmt: skip
    return out
