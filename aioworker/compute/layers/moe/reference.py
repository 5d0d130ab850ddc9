"""The experts' products one expert at a time: the CPU path, and what the fused kernel is
tested against.

Shapes, shared with the fused kernel (triton_experts.py):
- x: [T, D] activations, the model's dtype;
- w13: [E, 2I, D], each expert's gate rows [0, I) then up rows [I, 2I);
- w2: [E, D, I], each expert's down projection;
- topk_ids: [T, K] int, the experts each token was routed to; -1 marks a choice that is not
  computed here (its expert lives on another rank);
- topk_weights: [T, K] float32, the routing weights;
- w13_scale [E, 2I], w2_scale [E, D]: float32 per-output-channel scales when the weights are
  stored quantized (int8 or fp8), None when they are dense.

Returns [T, D] in x's dtype: sum over k of topk_weights[t, k] * expert(x[t]), summed in float32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def dequantized(
    weight: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype
) -> torch.Tensor:
    """One expert's weight [N, K] in `dtype`, its per-row scale applied when it has one."""
    if scale is None:
        return weight.to(dtype)
    return (weight.to(torch.float32) * scale[:, None]).to(dtype)


def reference_experts(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w13_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    flat_ids = topk_ids.reshape(-1)
    flat_weights = topk_weights.reshape(-1).to(torch.float32)
    top_k = topk_ids.shape[1]
    for expert in torch.unique(flat_ids[flat_ids >= 0]).tolist():
        (choices,) = torch.nonzero(flat_ids == expert, as_tuple=True)
        tokens = choices // top_k
        gate_up = F.linear(x[tokens], dequantized(w13[expert], _row(w13_scale, expert), x.dtype))
        gate, up = gate_up.chunk(2, dim=-1)
        hidden = F.silu(gate) * up
        y = F.linear(hidden, dequantized(w2[expert], _row(w2_scale, expert), x.dtype))
        out.index_add_(0, tokens, y.to(torch.float32) * flat_weights[choices, None])
    return out.to(x.dtype)


def _row(scale: torch.Tensor | None, expert: int) -> torch.Tensor | None:
    return None if scale is None else scale[expert]
