"""The mixture-of-experts part of a model's config.json, read into one Struct whichever family
wrote it: Qwen2-MoE and Qwen3-MoE (`num_experts`, `decoder_sparse_step`, `mlp_only_layers`),
Mixtral (`num_local_experts`, every layer sparse) and ERNIE 4.5 (`moe_num_experts`, `moe_k`,
`moe_layer_start_index`..`moe_layer_end_index`). Torch-free, like model_config.py.
"""

from __future__ import annotations

from typing import Any

import msgspec


class MoeConfig(msgspec.Struct, frozen=True, kw_only=True):
    num_experts: int
    top_k: int
    # Each routed expert's hidden size.
    intermediate_size: int
    # Layer indices whose feed-forward is the experts (the others are one dense MLP).
    sparse_layers: tuple[int, ...]
    # Routing: softmax over every expert, the top_k chosen; renormalize: their weights divided
    # by their sum (clamped below by norm_min, ERNIE's moe_norm_min).
    renormalize: bool = True
    norm_min: float = 0.0
    # ERNIE: a learned bias added to the probabilities to choose the experts, not to weigh them;
    # its router runs in float32 whatever the model's dtype.
    correction_bias: bool = False
    router_fp32: bool = False
    # Experts every token goes through (Qwen2-MoE's shared_expert, ERNIE's shared_experts as one
    # MLP of their summed size); shared_expert_gate: Qwen2-MoE scales it by sigmoid(x w).
    shared_intermediate_size: int = 0
    shared_expert_gate: bool = False


def moe_config(architecture: str, raw: dict[str, Any], num_layers: int) -> MoeConfig | None:
    """The MoE section for an architecture, None for a dense one."""
    reader = _READERS.get(architecture)
    return None if reader is None else reader(raw, num_layers)


def _qwen(raw: dict[str, Any], num_layers: int, shared_gate: bool) -> MoeConfig:
    step = int(raw.get("decoder_sparse_step", 1)) or 1
    dense = set(raw.get("mlp_only_layers") or ())
    return MoeConfig(
        num_experts=_num_experts(raw, "num_experts", "num_local_experts"),
        top_k=int(raw["num_experts_per_tok"]),
        intermediate_size=int(raw["moe_intermediate_size"]),
        sparse_layers=tuple(i for i in range(num_layers) if i not in dense and (i + 1) % step == 0),
        renormalize=bool(raw.get("norm_topk_prob", False)),
        shared_intermediate_size=int(raw.get("shared_expert_intermediate_size") or 0)
        if shared_gate
        else 0,
        shared_expert_gate=shared_gate,
    )


def _qwen2(raw: dict[str, Any], num_layers: int) -> MoeConfig:
    return _qwen(raw, num_layers, shared_gate=True)


def _qwen3(raw: dict[str, Any], num_layers: int) -> MoeConfig:
    return _qwen(raw, num_layers, shared_gate=False)


def _mixtral(raw: dict[str, Any], num_layers: int) -> MoeConfig:
    return MoeConfig(
        num_experts=_num_experts(raw, "num_local_experts", "num_experts"),
        top_k=int(raw["num_experts_per_tok"]),
        intermediate_size=int(raw["intermediate_size"]),
        sparse_layers=tuple(range(num_layers)),
    )


def _ernie(raw: dict[str, Any], num_layers: int) -> MoeConfig:
    start = int(raw.get("moe_layer_start_index", 0))
    end = int(raw.get("moe_layer_end_index", num_layers - 1))
    end = num_layers - 1 if end < 0 else end
    interval = int(raw.get("moe_layer_interval", 1)) or 1
    intermediate = int(raw.get("moe_intermediate_size") or raw["intermediate_size"])
    return MoeConfig(
        num_experts=_num_experts(raw, "moe_num_experts", "num_experts"),
        top_k=int(raw.get("moe_k") or raw["num_experts_per_tok"]),
        intermediate_size=intermediate,
        sparse_layers=tuple(
            i for i in range(num_layers) if (i + 1) % interval == 0 and start <= i <= end
        ),
        norm_min=float(raw.get("moe_norm_min", 1e-12)),
        correction_bias=True,
        router_fp32=True,
        shared_intermediate_size=intermediate * int(raw.get("moe_num_shared_experts") or 0),
    )


def _num_experts(raw: dict[str, Any], *keys: str) -> int:
    for key in keys:
        value = raw.get(key)
        if isinstance(value, list):  # ERNIE's multimodal configs list one count per modality
            value = value[0]
        if value:
            return int(value)
    raise ValueError(f"config.json names no expert count ({' or '.join(keys)})")


_READERS = {
    "Qwen2MoeForCausalLM": _qwen2,
    "Qwen3MoeForCausalLM": _qwen3,
    "MixtralForCausalLM": _mixtral,
    "Ernie4_5_MoeForCausalLM": _ernie,
}
