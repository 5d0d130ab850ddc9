"""Tiny randomly initialised Hugging Face models of each supported architecture, saved as
safetensors, for parity tests against transformers."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

_COMMON = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=384,
    max_position_embeddings=512,
    rms_norm_eps=1e-5,
)


# Expert sizes that are not multiples of the fused kernel's blocks, and more experts than top_k.
_MOE = dict(moe_intermediate_size=40, num_experts_per_tok=2)


def tiny_configs():
    from transformers import (
        Ernie4_5_MoeConfig,
        Ernie4_5Config,
        LlamaConfig,
        MistralConfig,
        MixtralConfig,
        Qwen2Config,
        Qwen2MoeConfig,
        Qwen3Config,
        Qwen3MoeConfig,
    )

    return {
        # Llama-3 rope scaling with a short original context so every band of the scaling matters.
        "llama": LlamaConfig(
            **_COMMON,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        ),
        # A window shorter than the longest sequence, so the sliding-window mask is exercised.
        "mistral": MistralConfig(**_COMMON, sliding_window=40),
        "qwen2": Qwen2Config(**_COMMON, tie_word_embeddings=True),
        # head_dim differs from hidden_size / num_attention_heads, as in real Qwen3 models.
        "qwen3": Qwen3Config(**_COMMON, head_dim=32),
        # Layer 0 dense (mlp_only_layers), layer 1 routed, weights renormalised.
        "qwen3_moe": Qwen3MoeConfig(
            **_COMMON, **_MOE, head_dim=32, num_experts=8, norm_topk_prob=True, mlp_only_layers=[0]
        ),
        # A shared expert with its sigmoid gate; routing weights not renormalised.
        "qwen2_moe": Qwen2MoeConfig(
            **_COMMON,
            **_MOE,
            num_experts=6,
            shared_expert_intermediate_size=56,
            norm_topk_prob=False,
        ),  # fmt: skip
        "mixtral": MixtralConfig(
            **{**_COMMON, "intermediate_size": 40}, num_local_experts=5, num_experts_per_tok=2
        ),
        "ernie4_5": Ernie4_5Config(**_COMMON, head_dim=16),
        # Layer 0 dense; two shared experts; the correction bias chooses, the weights do not see it.
        "ernie4_5_moe": Ernie4_5_MoeConfig(
            **_COMMON,
            **_MOE,
            num_experts=8,
            moe_num_shared_experts=2,
            moe_layer_start_index=1,
            head_dim=16,
        ),  # fmt: skip
    }


def build_tiny_model(
    name: str,
    out_dir: Path,
    seed: int = 0,
    logit_scale: float = 1.0,
    vocab_size: int = 0,
    **overrides,
):
    """Save a model with every parameter random (biases and norms too) and return it.

    `logit_scale` multiplies the LM head: sharper distributions keep bf16 rounding differences
    from flipping greedy choices between two implementations (a near-tie says nothing).
    `vocab_size` (0: the config's) makes distributions small enough to count. `overrides` set
    other config fields (sizes that quantized formats' blocks divide)."""
    from transformers import AutoModelForCausalLM

    config = tiny_configs()[name]
    if vocab_size:
        config.vocab_size = vocab_size
    for field, value in overrides.items():
        setattr(config, field, value)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param_name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            if "norm" in param_name:
                param.copy_(1.0 + 0.1 * noise)
            else:
                param.copy_(0.08 * noise)
        if logit_scale != 1.0 and not config.tie_word_embeddings:
            model.lm_head.weight.mul_(logit_scale)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    model.save_pretrained(out_dir)
    return model.eval()


def scaled_checkpoint(path: Path, into: Path, part: str) -> Path:
    """A copy of the checkpoint at `path` in `into`, with every tensor whose name holds `part`
    tripled: other tokens from the same shapes (a weights update to check)."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path / "model.safetensors"))
    into.mkdir()
    shutil.copy(path / "config.json", into)
    save_file(
        {n: t * 3 if part in n else t for n, t in tensors.items()}, str(into / "model.safetensors")
    )
    return into
