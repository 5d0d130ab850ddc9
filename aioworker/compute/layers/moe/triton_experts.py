"""The experts' products fused in Triton for the GPU: the routed rows grouped by expert
(align.py), one grouped GEMM for gate and up with SiLU(gate) * up applied in its epilogue, one
for down scaled by the routing weight, and a combine of each token's K rows. Shapes and results
are those of reference.py's `reference_experts`, which it is tested against.

Each kernel rounds where the reference rounds (the products to the activation dtype, SiLU and
its product with up too), so that bfloat16 results differ from it only by accumulation order.
Quantized weights (int8, float8_e4m3fn) are converted in registers; their per-output-column
scale multiplies the float32 accumulator once, after the loop over the inputs.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from aioworker.compute.layers.moe.align_kernel import align_by_expert_fused


class BlockSizes(NamedTuple):
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int = 3


def block_sizes(num_choices: int, num_experts: int, dtype: torch.dtype) -> BlockSizes:
    """Tiles by the mean rows an expert gets, as tools/moe_tiles.py measured them on the H200
    (one Qwen3-30B-A3B layer replayed from a CUDA graph; docs/benchmarks.md). Decode gives each
    expert a few rows: a short BLOCK_M pads little, the work is reading weights, and long K
    tiles keep the loads wide (1 to 64 tokens: best or within 1% of it). From 16 rows an
    expert, taller tiles reuse each weight tile across more rows (256 tokens: 6% faster), and a
    prefill's hundreds of rows an expert take the largest tiles that fit (4,096 tokens: 14%
    faster than 64 x 128)."""
    rows_per_expert = num_choices / num_experts
    if rows_per_expert < 16:
        tiles = BlockSizes(block_m=16, block_n=64, block_k=128, num_warps=4)
    elif rows_per_expert < 64:
        tiles = BlockSizes(block_m=32, block_n=64, block_k=128, num_warps=4)
    else:
        tiles = BlockSizes(block_m=128, block_n=128, block_k=64, num_warps=8)
    if dtype.itemsize > 2:
        # The same bytes a stage for float32: the gate-up kernel's three pipelined stages of
        # x's tile and two weight tiles would otherwise pass the 227 KiB of shared memory a
        # Hopper block gets.
        tiles = tiles._replace(block_k=tiles.block_k // 2)
    return tiles


@triton.jit
def _block_rows(choice_ptr, block_expert_ptr, num_choices, BLOCK_M: tl.constexpr):
    """This program's rows: their choice ids, which are real (not padding), and their expert."""
    block = tl.program_id(0)
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    choices = tl.load(choice_ptr + rows)
    expert = tl.load(block_expert_ptr + block).to(tl.int64)  # int64: E * 2I * D passes 2^31
    return rows, choices, choices < num_choices, expert


@triton.jit
def _gate_up_kernel(
    x_ptr, w_ptr, scale_ptr, out_ptr, choice_ptr, block_expert_ptr, num_blocks_ptr,
    stride_x, stride_we, stride_wn, stride_wk, stride_se, stride_o,
    num_choices, top_k, hidden_size, inter_size,
    IS_QUANTIZED: tl.constexpr, DOT_IN_FLOAT32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """out[row, n] = silu(x[token] . w[e, n]) * (x[token] . w[e, I + n]) for the block's rows."""
    if tl.program_id(0) >= tl.load(num_blocks_ptr):
        return  # past the used blocks: the grid is sized for the worst case
    rows, choices, is_row, expert = _block_rows(choice_ptr, block_expert_ptr, num_choices, BLOCK_M)
    tokens = choices // top_k
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    is_col = cols < inter_size
    ks = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + tokens[:, None] * stride_x + ks[None, :]  # [BLOCK_M, BLOCK_K]
    gate_ptrs = w_ptr + expert * stride_we + cols[None, :] * stride_wn + ks[:, None] * stride_wk
    up_ptrs = gate_ptrs + inter_size * stride_wn  # [BLOCK_K, BLOCK_N]: w's rows I + n
    gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for start in range(0, hidden_size, BLOCK_K):
        is_k = ks < hidden_size - start
        a = tl.load(x_ptrs, mask=is_row[:, None] & is_k[None, :], other=0.0)
        if DOT_IN_FLOAT32:
            a = a.to(tl.float32)
        w_mask = is_k[:, None] & is_col[None, :]
        w_gate = tl.load(gate_ptrs, mask=w_mask, other=0.0).to(a.dtype)
        w_up = tl.load(up_ptrs, mask=w_mask, other=0.0).to(a.dtype)
        gate = tl.dot(a, w_gate, gate, input_precision="ieee")
        up = tl.dot(a, w_up, up, input_precision="ieee")
        x_ptrs += BLOCK_K
        gate_ptrs += BLOCK_K * stride_wk
        up_ptrs += BLOCK_K * stride_wk
    if IS_QUANTIZED:
        scale_ptrs = scale_ptr + expert * stride_se + cols
        gate *= tl.load(scale_ptrs, mask=is_col, other=0.0)[None, :]
        up *= tl.load(scale_ptrs + inter_size, mask=is_col, other=0.0)[None, :]
    dtype = out_ptr.dtype.element_ty
    g = gate.to(dtype).to(tl.float32)
    activated = (g * tl.sigmoid(g)).to(dtype).to(tl.float32)
    hidden = (activated * up.to(dtype).to(tl.float32)).to(dtype)
    out_ptrs = out_ptr + rows[:, None] * stride_o + cols[None, :]
    tl.store(out_ptrs, hidden, mask=is_row[:, None] & is_col[None, :])


@triton.jit
def _down_kernel(
    h_ptr, w_ptr, scale_ptr, routing_ptr, out_ptr, choice_ptr, block_expert_ptr, num_blocks_ptr,
    stride_h, stride_we, stride_wn, stride_wk, stride_se, stride_o,
    num_choices, hidden_size, inter_size,
    IS_QUANTIZED: tl.constexpr, DOT_IN_FLOAT32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """out[choice, n] = routing[choice] * (h[row] . w[e, n]), in float32, for the block's rows."""
    if tl.program_id(0) >= tl.load(num_blocks_ptr):
        return
    rows, choices, is_row, expert = _block_rows(choice_ptr, block_expert_ptr, num_choices, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    is_col = cols < hidden_size
    ks = tl.arange(0, BLOCK_K)
    h_ptrs = h_ptr + rows[:, None] * stride_h + ks[None, :]  # [BLOCK_M, BLOCK_K]
    w_ptrs = w_ptr + expert * stride_we + cols[None, :] * stride_wn + ks[:, None] * stride_wk
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for start in range(0, inter_size, BLOCK_K):
        is_k = ks < inter_size - start
        # padding rows were never written: masked, not read
        a = tl.load(h_ptrs, mask=is_row[:, None] & is_k[None, :], other=0.0)
        if DOT_IN_FLOAT32:
            a = a.to(tl.float32)
        w = tl.load(w_ptrs, mask=is_k[:, None] & is_col[None, :], other=0.0).to(a.dtype)
        acc = tl.dot(a, w, acc, input_precision="ieee")
        h_ptrs += BLOCK_K
        w_ptrs += BLOCK_K * stride_wk
    if IS_QUANTIZED:
        acc *= tl.load(scale_ptr + expert * stride_se + cols, mask=is_col, other=0.0)[None, :]
    routing = tl.load(routing_ptr + choices, mask=is_row, other=0.0)
    y = acc.to(h_ptr.dtype.element_ty).to(tl.float32) * routing[:, None]
    out_ptrs = out_ptr + choices[:, None] * stride_o + cols[None, :]
    tl.store(out_ptrs, y, mask=is_row[:, None] & is_col[None, :])


@triton.jit
def _combine_kernel(
    y_ptr, ids_ptr, out_ptr, stride_y, stride_o, hidden_size, top_k, BLOCK: tl.constexpr
):
    """out[t] = sum over k of y[t * K + k], skipping the choices computed on another rank."""
    token = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    total = tl.zeros((BLOCK,), dtype=tl.float32)
    for k in range(top_k):
        choice = token * top_k + k
        # another rank's choice: y's row was never written, none of it is read
        num_cols = tl.where(tl.load(ids_ptr + choice) >= 0, hidden_size, 0)
        total += tl.load(y_ptr + choice * stride_y + cols, mask=cols < num_cols, other=0.0)
    out = total.to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + token * stride_o + cols, out, mask=cols < hidden_size)


class _Grouping(NamedTuple):
    """align_by_expert's result, and the tiles it was aligned for."""

    sorted_choice_ids: torch.Tensor  # [rows] int32
    block_expert_ids: torch.Tensor  # [rows / BLOCK_M] int32
    num_valid_blocks: torch.Tensor  # [1] int32
    tiles: BlockSizes


def fused_experts(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w13_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
    expert_counts: torch.Tensor | None = None,
) -> torch.Tensor:
    """reference_experts' result (reference.py gives the shapes), with no host synchronisation:
    every size follows from the shapes, so a CUDA graph can capture it. `expert_counts` [E]
    int64, where given, gets each expert's choices added (the rank's expert load)."""
    _check_scales(w13, w13_scale, "w13")
    _check_scales(w2, w2_scale, "w2")
    num_tokens, top_k = topk_ids.shape
    out = torch.empty_like(x)  # [T, D]
    if num_tokens == 0:
        return out
    num_experts = w13.shape[0]
    tiles = block_sizes(num_tokens * top_k, num_experts, x.dtype)
    topk_ids = topk_ids.contiguous()
    aligned = align_by_expert_fused(topk_ids, num_experts, tiles.block_m, expert_counts)
    grouping = _Grouping(*aligned, tiles)
    hidden = _gate_up(x.contiguous(), w13, w13_scale, grouping, top_k)  # [rows, I]
    routing = topk_weights.reshape(-1).to(torch.float32)  # [T * K]
    y = _down(hidden, w2, w2_scale, routing, grouping)  # [T * K, D] float32
    _combine(y, topk_ids, out)
    return out


def _check_scales(weight: torch.Tensor, scale: torch.Tensor | None, name: str) -> None:
    if scale is None and weight.dtype in (torch.int8, torch.float8_e4m3fn):
        raise ValueError(f"{name} is {weight.dtype} but {name}_scale is None; pass its scales")


def _scale_args(scale: torch.Tensor | None, weight: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(pointer, expert stride) for a scale; dense weights pass any pointer, never read."""
    if scale is None:
        return weight, 0
    scale = scale.contiguous()
    return scale, scale.stride(0)


def _dot_in_float32(x: torch.Tensor) -> bool:
    # Triton's interpreter (tensors on the CPU) multiplies bfloat16's raw bits in tl.dot
    # (triton 3.9): it is handed float32, which holds each product of bfloat16 values exactly.
    return x.dtype == torch.bfloat16 and not x.is_cuda


def _gate_up(
    x: torch.Tensor,
    w13: torch.Tensor,
    w13_scale: torch.Tensor | None,
    grouping: _Grouping,
    top_k: int,
) -> torch.Tensor:
    num_rows = grouping.sorted_choice_ids.shape[0]
    inter_size = w13.shape[1] // 2
    hidden = torch.empty(num_rows, inter_size, dtype=x.dtype, device=x.device)
    scale, stride_se = _scale_args(w13_scale, w13)
    tiles = grouping.tiles
    grid = (grouping.block_expert_ids.shape[0], triton.cdiv(inter_size, tiles.block_n))
    _gate_up_kernel[grid](
        x, w13, scale, hidden,
        grouping.sorted_choice_ids, grouping.block_expert_ids, grouping.num_valid_blocks,
        x.stride(0), w13.stride(0), w13.stride(1), w13.stride(2), stride_se, hidden.stride(0),
        x.shape[0] * top_k, top_k, x.shape[1], inter_size,
        IS_QUANTIZED=w13_scale is not None, DOT_IN_FLOAT32=_dot_in_float32(x),
        BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k,
        num_warps=tiles.num_warps, num_stages=tiles.num_stages,
    )  # fmt: skip
    return hidden


def _down(
    hidden: torch.Tensor,
    w2: torch.Tensor,
    w2_scale: torch.Tensor | None,
    routing: torch.Tensor,
    grouping: _Grouping,
) -> torch.Tensor:
    # float32 rows, as the reference sums its weighted products in float32: the combine then
    # differs from it only in the order of its K additions. The price is twice the bytes of
    # an activation-dtype buffer (prefill of 4096 tokens, K=8, D=2048: 256 MiB written once and
    # read once), small beside the GEMMs' time at those sizes.
    hidden_size, inter_size = w2.shape[1], w2.shape[2]
    num_choices = routing.shape[0]
    y = torch.empty(num_choices, hidden_size, dtype=torch.float32, device=hidden.device)
    scale, stride_se = _scale_args(w2_scale, w2)
    tiles = grouping.tiles
    grid = (grouping.block_expert_ids.shape[0], triton.cdiv(hidden_size, tiles.block_n))
    _down_kernel[grid](
        hidden, w2, scale, routing, y,
        grouping.sorted_choice_ids, grouping.block_expert_ids, grouping.num_valid_blocks,
        hidden.stride(0), w2.stride(0), w2.stride(1), w2.stride(2), stride_se, y.stride(0),
        num_choices, hidden_size, inter_size,
        IS_QUANTIZED=w2_scale is not None, DOT_IN_FLOAT32=_dot_in_float32(hidden),
        BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k,
        num_warps=tiles.num_warps, num_stages=tiles.num_stages,
    )  # fmt: skip
    return y


def _combine(y: torch.Tensor, topk_ids: torch.Tensor, out: torch.Tensor) -> None:
    # Each program sums one token's K rows in a fixed order, where atomic adds into out would
    # sum them in whatever order the programs ran: the same inputs give the same bits on every
    # run, so a graph's replay equals the eager run exactly and runs can be compared.
    num_tokens, hidden_size = out.shape
    block = min(1024, triton.next_power_of_2(hidden_size))
    grid = (num_tokens, triton.cdiv(hidden_size, block))
    _combine_kernel[grid](
        y, topk_ids, out, y.stride(0), out.stride(0), hidden_size, topk_ids.shape[1], BLOCK=block
    )
