"""Paged decode attention's splits merged into each query row's output: the partial results of
the splits a sequence's context was cut into, weighted by their log-sum-exps, by a kernel of its
own launched after the decode kernel (triton_decode.py). Merging them in the decode kernel's
last split program instead was tried twice and measured slower (docs/architecture.md)."""

from __future__ import annotations

import triton
import triton.language as tl

from aioworker.compute.layers.gdc import wait_for_previous_kernel


@triton.jit
def merge_splits(
    partial_ptr, lse_ptr, out_ptr, stride_p_seq, stride_p_head, stride_p_split, stride_l_seq,
    stride_l_head, stride_o_seq, stride_o_head, num_splits, SPLITS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """One program a (query row, head): its splits' partial results [splits, D] weighted by their
    log-sum-exps. A split that saw no key of the row has -inf, weight 0, and a partial of 0/0,
    which is loaded but not used: a load masked by the weights would wait for the log-sum-exps'
    load before it could start, a second round trip to L2 on a kernel that is all latency."""
    wait_for_previous_kernel(PDL)
    row, head = tl.program_id(0), tl.program_id(1)
    offs_s = tl.arange(0, SPLITS_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    in_range = offs_s < num_splits
    lse = tl.load(lse_ptr + row * stride_l_seq + head * stride_l_head + offs_s, mask=in_range,
                  other=float("-inf"))  # fmt: skip
    p_ptrs = (partial_ptr + row * stride_p_seq + head * stride_p_head
              + offs_s[:, None] * stride_p_split + offs_d[None, :])  # fmt: skip
    partial = tl.load(p_ptrs, mask=in_range[:, None])
    weights = tl.exp(lse - tl.max(lse, axis=0))
    weights = tl.where(in_range & (lse > float("-inf")), weights, 0.0)
    partial = tl.where((weights > 0)[:, None], partial, 0.0)
    out = tl.sum(partial * weights[:, None], axis=0) / tl.sum(weights, axis=0)
    out_row = out_ptr + row * stride_o_seq + head * stride_o_head
    tl.store(out_row + offs_d, out.to(out_ptr.dtype.element_ty))
