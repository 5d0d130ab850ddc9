"""Paged decode attention's splits merged into each query row's output: the partial results of
the splits a sequence's context was cut into, weighted by their log-sum-exps. By a kernel of its
own (`merge_splits`, after the decode kernel), or by the decode kernel's last split program to
finish (triton_decode.py, `fold`); both call `merge_row`, so the outputs are the same bits."""

from __future__ import annotations

import triton
import triton.language as tl

from aioworker.compute.layers.gdc import wait_for_previous_kernel


@triton.jit
def merge_row(partial_ptr, lse_ptr, out_ptr, row, head, stride_p_seq, stride_p_head,
               stride_p_split, stride_l_seq, stride_l_head, stride_o_seq, stride_o_head,
               num_splits, SPLITS_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
               IN_PLACE: tl.constexpr):  # fmt: skip
    """Query row `row`'s output for `head`: its splits' partial results [splits, D] weighted by
    their log-sum-exps (a split that saw no key of the row has -inf, weight 0, and a partial of
    0/0). IN_PLACE (the splits' last program merging them): the splits given are those that
    saw keys, so all are loaded at once, past L1 (other programs wrote them); else only those
    of weight above 0 are, after the log-sum-exps."""
    offs_s = tl.arange(0, SPLITS_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    in_range = offs_s < num_splits
    lse_row = lse_ptr + row * stride_l_seq + head * stride_l_head
    p_ptrs = (partial_ptr + row * stride_p_seq + head * stride_p_head
              + offs_s[:, None] * stride_p_split + offs_d[None, :])  # fmt: skip
    if IN_PLACE:
        lse = tl.load(lse_row + offs_s, mask=in_range, other=float("-inf"), cache_modifier=".cg")
        partial = tl.load(p_ptrs, mask=in_range[:, None], other=0.0, cache_modifier=".cg")
    else:
        lse = tl.load(lse_row + offs_s, mask=in_range, other=float("-inf"))
    weights = tl.exp(lse - tl.max(lse, axis=0))
    weights = tl.where(in_range & (lse > float("-inf")), weights, 0.0)
    if IN_PLACE:
        partial = tl.where((weights > 0)[:, None], partial, 0.0)
    else:
        partial = tl.load(p_ptrs, mask=(weights > 0)[:, None], other=0.0)
    out = tl.sum(partial * weights[:, None], axis=0) / tl.sum(weights, axis=0)
    out_row = out_ptr + row * stride_o_seq + head * stride_o_head
    tl.store(out_row + offs_d, out.to(out_ptr.dtype.element_ty))


@triton.jit
def merge_splits(
    partial_ptr, lse_ptr, out_ptr, stride_p_seq, stride_p_head, stride_p_split, stride_l_seq,
    stride_l_head, stride_o_seq, stride_o_head, num_splits, SPLITS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    wait_for_previous_kernel(PDL)
    merge_row(partial_ptr, lse_ptr, out_ptr, tl.program_id(0), tl.program_id(1), stride_p_seq,
               stride_p_head, stride_p_split, stride_l_seq, stride_l_head, stride_o_seq,
               stride_o_head, num_splits, SPLITS_PAD, HEAD_DIM, False)  # fmt: skip
