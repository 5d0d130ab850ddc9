"""routing.route in one Triton kernel for the GPU, a program per token: the softmax, the top k
taken by repeated argmax (descending, as torch.topk returns them), the correction bias and the
renormalisation, where torch takes half a dozen kernels a MoE layer in every decode step."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from aioworker.checkpoint.moe_config import MoeConfig


@triton.jit
def _route_kernel(
    logits_ptr, bias_ptr, weights_ptr, ids_ptr, stride_logits, num_experts, norm_min,
    TOP_K: tl.constexpr, BINS: tl.constexpr, HAS_BIAS: tl.constexpr, RENORMALIZE: tl.constexpr,
):  # fmt: skip
    token = tl.program_id(0)
    bins = tl.arange(0, BINS)
    is_expert = bins < num_experts
    logits = tl.load(
        logits_ptr + token * stride_logits + bins, mask=is_expert, other=-float("inf")
    ).to(tl.float32)
    exps = tl.where(is_expert, tl.exp(logits - tl.max(logits, axis=0)), 0.0)
    probs = exps / tl.sum(exps, axis=0)
    scores = probs
    if HAS_BIAS:
        scores += tl.load(bias_ptr + bins, mask=is_expert, other=0.0)
    scores = tl.where(is_expert, scores, -float("inf"))
    chosen = tl.zeros((BINS,), dtype=tl.int32)  # 1 + the rank of each chosen expert
    for k in tl.static_range(TOP_K):
        best = tl.argmax(scores, axis=0)
        chosen = tl.where(bins == best, k + 1, chosen)
        scores = tl.where(bins == best, -float("inf"), scores)
    total = tl.sum(tl.where(chosen > 0, probs, 0.0), axis=0)
    scale = 1.0 / tl.maximum(total, norm_min) if RENORMALIZE else 1.0
    ranks = chosen - 1
    out = token * TOP_K + ranks
    tl.store(ids_ptr + out, bins, mask=chosen > 0)
    tl.store(weights_ptr + out, probs * scale, mask=chosen > 0)


def route_fused(
    logits: torch.Tensor, moe: MoeConfig, correction_bias: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """routing.route's result: (weights float32 [T, K], expert ids int32 [T, K])."""
    num_tokens, num_experts = logits.shape
    weights = torch.empty(num_tokens, moe.top_k, dtype=torch.float32, device=logits.device)
    ids = torch.empty(num_tokens, moe.top_k, dtype=torch.int32, device=logits.device)
    if num_tokens == 0:
        return weights, ids
    bias = correction_bias.reshape(-1).float() if correction_bias is not None else weights
    _route_kernel[(num_tokens,)](
        logits, bias, weights, ids, logits.stride(0), num_experts, moe.norm_min,
        TOP_K=moe.top_k, BINS=triton.next_power_of_2(num_experts),
        HAS_BIAS=correction_bias is not None, RENORMALIZE=moe.renormalize,
    )  # fmt: skip
    return weights, ids
