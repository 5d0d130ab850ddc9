"""A mixture-of-experts feed-forward block: the router, the routed experts, and the shared
experts every token also goes through (Qwen2-MoE gates theirs by sigmoid(x w)). Each part
leaves a partial sum, and one all-reduce joins them across the group."""

from __future__ import annotations

import torch
from torch import nn

from aioworker.checkpoint.model_config import ModelConfig
from aioworker.compute.layers.gated_mlp import GatedMLP
from aioworker.compute.layers.linear_method import LinearMethods
from aioworker.compute.layers.moe.experts import FusedExperts
from aioworker.compute.layers.moe.routing import Router
from aioworker.compute.layers.moe.storage import FORMATS, ExpertStorage
from aioworker.compute.parallel import TensorParallel


class SparseMoeBlock(nn.Module):
    def __init__(self, cfg: ModelConfig, tp: TensorParallel, methods: LinearMethods) -> None:
        super().__init__()
        moe = cfg.moe
        assert moe is not None
        self.tp = tp
        self.gate = Router(cfg.hidden_size, moe)
        self.experts = FusedExperts(
            moe.num_experts,
            moe.top_k,
            cfg.hidden_size,
            moe.intermediate_size,
            tp,
            experts_storage(methods),
        )
        self.shared_expert = (
            GatedMLP(
                cfg.hidden_size,
                moe.shared_intermediate_size,
                False,
                tp,
                methods.projections,
                reduce=False,
            )
            if moe.shared_intermediate_size
            else None
        )
        self.shared_expert_gate = (
            nn.Linear(cfg.hidden_size, 1, bias=False) if moe.shared_expert_gate else None
        )
        if self.shared_expert_gate is not None:
            self.shared_expert_gate.weight.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, D] -> [T, D]
        topk_weights, topk_ids = self.gate(x)
        out = self.experts(x, topk_ids, topk_weights)
        if self.shared_expert is not None:
            shared = self.shared_expert(x)
            if self.shared_expert_gate is not None:
                shared = torch.sigmoid(self.shared_expert_gate(x)) * shared
            out = out + shared
        return self.tp.all_reduce(out)


def experts_storage(methods: LinearMethods) -> ExpertStorage:
    """The experts' format follows the projections' quantization where the MoE layer has one."""
    name = methods.projections.name
    name = "none" if name in ("none", "cpu-packed") else name
    if name.endswith("checkpoint)"):
        raise ValueError(
            f"this MoE checkpoint is quantized ({name}); its experts have no format here yet: "
            'load its bf16 release, with model.quantization "fp8" or "wint8" to quantize '
            "the experts while loading"
        )
    if name not in FORMATS:
        raise ValueError(
            f"model.quantization {name!r} has no MoE expert format; set it to one of "
            f"{', '.join(repr(f) for f in FORMATS)} for a MoE model"
        )
    return ExpertStorage(FORMATS[name])
