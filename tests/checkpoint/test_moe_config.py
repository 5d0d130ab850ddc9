"""Each MoE family's config.json read into one MoeConfig: which layers are sparse, the routing
details, the shared experts; the real shapes in configs/models/ read as published."""

from __future__ import annotations

from pathlib import Path

import pytest

from aioworker.checkpoint.model_config import (
    ModelConfigError,
    load_model_config,
    model_config_from_dict,
)

MODELS = Path(__file__).resolve().parents[2] / "configs" / "models"
BASE = {
    "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 6, "num_attention_heads": 4,
    "vocab_size": 100,
}  # fmt: skip


def test_qwen3_30b_a3b_every_layer_routes_8_of_128_renormalised() -> None:
    cfg = load_model_config(MODELS / "qwen3-30b-a3b")
    moe = cfg.moe
    assert (moe.num_experts, moe.top_k, moe.intermediate_size) == (128, 8, 768)
    assert moe.sparse_layers == tuple(range(48)) and moe.renormalize
    assert not moe.correction_bias and moe.shared_intermediate_size == 0 and cfg.qk_norm


def test_ernie_21b_a3b_first_layer_dense_two_shared_experts_and_its_bias() -> None:
    cfg = load_model_config(MODELS / "ernie-4.5-21b-a3b")
    moe = cfg.moe
    assert (moe.num_experts, moe.top_k, moe.intermediate_size) == (64, 6, 1536)
    assert moe.sparse_layers == tuple(range(1, 28))
    assert moe.shared_intermediate_size == 2 * 1536 and not moe.shared_expert_gate
    assert moe.correction_bias and moe.router_fp32 and moe.norm_min == 1e-12
    assert cfg.rope_interleaved and cfg.tie_word_embeddings


def test_qwen_sparse_step_and_dense_layers() -> None:
    raw = {
        **BASE, "architectures": ["Qwen2MoeForCausalLM"], "num_experts": 4,
        "num_experts_per_tok": 2, "moe_intermediate_size": 8, "decoder_sparse_step": 2,
        "mlp_only_layers": [3], "shared_expert_intermediate_size": 16,
    }  # fmt: skip
    moe = model_config_from_dict(raw).moe
    # Layers 1, 3, 5 by the step; 3 listed dense.
    assert moe.sparse_layers == (1, 5)
    assert not moe.renormalize and moe.shared_expert_gate and moe.shared_intermediate_size == 16


def test_mixtral_experts_are_its_intermediate_size_every_layer() -> None:
    raw = {
        **BASE,
        "architectures": ["MixtralForCausalLM"],
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
    }
    moe = model_config_from_dict(raw).moe
    assert moe.intermediate_size == 96 and moe.sparse_layers == tuple(range(6)) and moe.renormalize


def test_a_dense_model_has_no_moe_section() -> None:
    assert load_model_config(MODELS / "qwen3-8b").moe is None


def test_ernie_with_biases_everywhere_is_refused_by_name() -> None:
    raw = {**BASE, "architectures": ["Ernie4_5ForCausalLM"], "use_bias": True}
    with pytest.raises(ModelConfigError, match="use_bias=true"):
        model_config_from_dict(raw)
