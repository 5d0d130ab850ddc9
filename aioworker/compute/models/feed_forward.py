"""Each decoder layer's feed-forward block, chosen by the layer's index: one gated MLP, or, in a
mixture-of-experts model's sparse layers, the routed experts (moe_block.py)."""

from __future__ import annotations

import torch
from torch import nn

from aioworker.checkpoint.model_config import ModelConfig
from aioworker.compute.layers.gated_mlp import GatedMLP
from aioworker.compute.layers.linear_method import LinearMethods
from aioworker.compute.layers.norm import RMSNorm
from aioworker.compute.layers.ops import add_rms_norm
from aioworker.compute.parallel import TensorParallel


def feed_forward(
    cfg: ModelConfig, layer_index: int, tp: TensorParallel, methods: LinearMethods
) -> nn.Module:
    if cfg.moe is not None and layer_index in cfg.moe.sparse_layers:
        from aioworker.compute.models.moe_block import SparseMoeBlock

        return SparseMoeBlock(cfg, tp, methods)
    return GatedMLP(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias, tp, methods.projections)


def normed_feed_forward(
    block: nn.Module,
    norm: RMSNorm,
    x: torch.Tensor,
    residual: torch.Tensor | None,
    next_norm: RMSNorm | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(block(norm(x + residual)), x + residual): a block that can take the add and norm into
    its first product does (`forward_normed`, which may also start `next_norm`, the norm its
    output goes into); the routed experts' router needs the normed row itself."""
    fused = getattr(block, "forward_normed", None)
    if fused is not None:
        return fused(norm, x, residual, next_norm)
    x, residual = add_rms_norm(norm, x, residual)
    return block(x), residual
