from __future__ import annotations

import pytest

from aioworker.checkpoint.model_config import ModelConfigError, model_config_from_dict

BASE = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "vocab_size": 100,
}


def test_fallbacks_for_missing_keys() -> None:
    cfg = model_config_from_dict({**BASE, "architectures": ["LlamaForCausalLM"]})
    assert cfg.head_dim == 16  # hidden_size / num_attention_heads
    assert cfg.rope_theta == 10000.0
    assert cfg.num_key_value_heads == 4
    assert not cfg.tie_word_embeddings and not cfg.qkv_bias and not cfg.qk_norm


def test_architecture_variants() -> None:
    qwen2 = model_config_from_dict(
        {
            **BASE,
            "architectures": ["Qwen2ForCausalLM"],
            "sliding_window": 8,
            "use_sliding_window": False,
        }
    )
    assert qwen2.qkv_bias and qwen2.sliding_window is None
    qwen3 = model_config_from_dict({**BASE, "architectures": ["Qwen3ForCausalLM"], "head_dim": 32})
    assert qwen3.qk_norm and qwen3.head_dim == 32
    by_type = model_config_from_dict({**BASE, "model_type": "mistral"})
    assert by_type.architecture == "MistralForCausalLM"


def test_rope_parameters_old_and_new_style() -> None:
    old = model_config_from_dict(
        {
            **BASE,
            "architectures": ["LlamaForCausalLM"],
            "rope_theta": 500000.0,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "original_max_position_embeddings": 8192,
            },
        }
    )
    new = model_config_from_dict(
        {
            **BASE,
            "architectures": ["LlamaForCausalLM"],
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "original_max_position_embeddings": 8192,
            },
        }
    )
    assert old == new and old.rope_theta == 500000.0 and old.rope_scaling.rope_type == "llama3"


def test_eos_ids_merge_generation_config_and_config() -> None:
    cfg = model_config_from_dict(
        {**BASE, "architectures": ["LlamaForCausalLM"], "eos_token_id": 2}, {"eos_token_id": [7, 2]}
    )
    assert cfg.eos_token_ids == (7, 2)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            {**BASE, "architectures": ["BertModel"]},
            "unsupported architecture BertModel; supported: LlamaForCausalLM, Mistral",
        ),
        (
            {**BASE, "architectures": ["LlamaForCausalLM"], "rope_scaling": {"type": "yarn"}},
            "unsupported rope scaling type 'yarn'",
        ),
        ({"architectures": ["LlamaForCausalLM"]}, "config.json has no 'hidden_size'"),
    ],
)
def test_errors_name_the_problem(raw, message) -> None:
    with pytest.raises(ModelConfigError, match=message):
        model_config_from_dict(raw)


def test_a_quantized_checkpoint_is_recognised() -> None:
    section = {"quant_method": "compressed-tensors", "format": "float-quantized"}
    cfg = model_config_from_dict(
        {**BASE, "architectures": ["LlamaForCausalLM"], "quantization_config": section}
    )
    assert cfg.quant_method == "compressed-tensors"
    assert '"format": "float-quantized"' in cfg.quantization_config
    plain = model_config_from_dict({**BASE, "architectures": ["LlamaForCausalLM"]})
    assert plain.quant_method == "" and plain.quantization_config == ""
