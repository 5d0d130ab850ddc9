"""The gated feed-forward block, down(silu(gate(x)) * up(x)), split across tensor-parallel
ranks: Llama-family MLPs, and the shared experts of MoE models."""

from __future__ import annotations

import torch
from torch import nn

from aioworker.compute.layers.linear import RowParallelLinear, column_parallel
from aioworker.compute.layers.linear_method import LinearMethod, gated_product, normed_product
from aioworker.compute.layers.norm import RMSNorm
from aioworker.compute.parallel import TensorParallel


class GatedMLP(nn.Module):
    """`reduce=False` leaves the output as this rank's partial sum, for a caller that adds more
    partial sums (the routed experts) before one all-reduce."""

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        bias: bool,
        tp: TensorParallel,
        method: LinearMethod,
        reduce: bool = True,
    ) -> None:
        super().__init__()
        size = intermediate_size
        self.gate_up_proj = column_parallel(hidden_size, [size, size], bias, tp, method)
        self.down_proj = RowParallelLinear(
            size, hidden_size, bias, tp, linear_method=method, reduce=reduce
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, D] -> [T, D]
        return self.down_proj(gated_product(self.gate_up_proj, x))

    def forward_normed(
        self,
        norm: RMSNorm,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        next_norm: RMSNorm | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(forward(norm(x + residual)), x + residual), the add and norm inside the gate/up
        product where its method can. next_norm: the norm the output goes into next (with the
        residual returned), which the down product may half do (forward_then_norm)."""
        h, residual = normed_product(self.gate_up_proj, norm, x, residual, gated=True)
        if next_norm is not None:
            return self.down_proj.forward_then_norm(h, residual, next_norm), residual
        return self.down_proj(h), residual
