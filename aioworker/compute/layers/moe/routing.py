"""Which experts each token goes to, and with what weight, as each family's reference does it:
a softmax over every expert's logit, the top k taken (ERNIE chooses by the probabilities plus a
learned correction bias but weighs by the probabilities alone), then, where the family does,
the k weights divided by their sum (ERNIE clamps that sum below by moe_norm_min)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from aioworker.checkpoint.moe_config import MoeConfig


def route(
    logits: torch.Tensor, moe: MoeConfig, correction_bias: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """logits: [T, E] -> (weights float32 [T, K], expert ids int32 [T, K])."""
    probs = F.softmax(logits.float(), dim=-1)
    if correction_bias is None:
        weights, ids = torch.topk(probs, moe.top_k, dim=-1)
    else:
        _, ids = torch.topk(probs + correction_bias.float().reshape(1, -1), moe.top_k, dim=-1)
        weights = torch.gather(probs, -1, ids)
    if moe.renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True).clamp_min(moe.norm_min)
    return weights, ids.to(torch.int32)


class Router(nn.Module):
    """The gate: a [E, D] weight every rank holds whole (routing is computed on every rank, so
    no rank waits for another to learn where its tokens go)."""

    def __init__(self, hidden_size: int, moe: MoeConfig) -> None:
        super().__init__()
        self.moe = moe
        dtype = torch.float32 if moe.router_fp32 else None
        self.weight = nn.Parameter(
            torch.empty(moe.num_experts, hidden_size, dtype=dtype), requires_grad=False
        )
        self.e_score_correction_bias = (
            nn.Parameter(torch.zeros(1, moe.num_experts, dtype=torch.float32), requires_grad=False)
            if moe.correction_bias
            else None
        )

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # x: [T, D] -> (weights float32 [T, K], ids int32 [T, K])
        if self.moe.router_fp32:
            logits = F.linear(x.float(), self.weight.float())
        else:
            logits = F.linear(x, self.weight)
        if logits.is_cuda:
            from aioworker.compute.layers.moe.routing_kernel import route_fused

            return route_fused(logits, self.moe, self.e_score_correction_bias)
        return route(logits, self.moe, self.e_score_correction_bias)
