"""Each decoder layer's feed-forward block, chosen by the layer's index: one gated MLP, or, in a
mixture-of-experts model's sparse layers, the routed experts (moe_block.py)."""

from __future__ import annotations

from torch import nn

from aioworker.checkpoint.model_config import ModelConfig
from aioworker.compute.layers.gated_mlp import GatedMLP
from aioworker.compute.layers.linear_method import LinearMethods
from aioworker.compute.parallel import TensorParallel


def feed_forward(
    cfg: ModelConfig, layer_index: int, tp: TensorParallel, methods: LinearMethods
) -> nn.Module:
    if cfg.moe is not None and layer_index in cfg.moe.sparse_layers:
        from aioworker.compute.models.moe_block import SparseMoeBlock

        return SparseMoeBlock(cfg, tp, methods)
    return GatedMLP(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias, tp, methods.projections)
