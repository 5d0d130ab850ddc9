"""The model's own `config.json`, read into one frozen Struct with the fallbacks Hugging Face uses.

Torch-free: the scheduler and the CLI read the vocabulary size and context length from here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

from aioworker.checkpoint.moe_config import MoeConfig, moe_config

# Architecture name in config.json -> the variant flags of our one Llama-family decoder.
SUPPORTED_ARCHITECTURES: dict[str, dict[str, bool]] = {
    "LlamaForCausalLM": {},
    "MistralForCausalLM": {},
    "Qwen2ForCausalLM": {"qkv_bias": True},
    "Qwen3ForCausalLM": {"qk_norm": True},
    "Qwen2MoeForCausalLM": {"qkv_bias": True},
    "Qwen3MoeForCausalLM": {"qk_norm": True},
    "MixtralForCausalLM": {},
    # ERNIE 4.5 rotates interleaved pairs of each head's dimensions (GPT-J style).
    "Ernie4_5ForCausalLM": {"rope_interleaved": True},
    "Ernie4_5_MoeForCausalLM": {"rope_interleaved": True},
}

_MODEL_TYPE_TO_ARCH = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "ernie4_5": "Ernie4_5ForCausalLM",
    "ernie4_5_moe": "Ernie4_5_MoeForCausalLM",
}


class ModelConfigError(ValueError):
    """The model directory or its config.json cannot be used; the message says why and what to do."""


class RopeScaling(msgspec.Struct, frozen=True, kw_only=True):
    rope_type: str = "default"  # default | linear | llama3
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


class ModelConfig(msgspec.Struct, frozen=True, kw_only=True):
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = RopeScaling()
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False
    mlp_bias: bool = False
    sliding_window: int | None = None
    rope_interleaved: bool = False
    # The experts of a mixture-of-experts model; None for a dense one.
    moe: MoeConfig | None = None
    dtype: str = "float32"
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    # config.json's `quantization_config`: its `quant_method` ("fp8", "compressed-tensors",
    # ...; "" for an unquantized checkpoint) and the whole section as JSON text, for the
    # linear method that reads the format's details.
    quant_method: str = ""
    quantization_config: str = ""

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim


def load_model_config(model_dir: str | Path) -> ModelConfig:
    """Read `config.json` (and `generation_config.json` for EOS ids) from a model directory."""
    model_dir = Path(model_dir)
    config_path = model_dir / "config.json"
    if not model_dir.is_dir():
        raise ModelConfigError(
            f"model path {str(model_dir)!r} is not a directory; pass a Hugging Face model "
            "directory (config.json + *.safetensors), a .gguf file, or 'embedded'"
        )
    if not config_path.is_file():
        raise ModelConfigError(f"{config_path} is missing; a model directory needs config.json")
    raw = _read_json(config_path)
    generation = _read_json(model_dir / "generation_config.json", missing_ok=True)
    return model_config_from_dict(raw, generation)


def model_config_from_dict(
    raw: dict[str, Any], generation: dict[str, Any] | None = None
) -> ModelConfig:
    arch = _architecture(raw)
    variant = SUPPORTED_ARCHITECTURES[arch]
    hidden_size = _required(raw, "hidden_size")
    num_heads = _required(raw, "num_attention_heads")
    head_dim = raw.get("head_dim") or hidden_size // num_heads
    rope_theta, rope_scaling = _rope(raw)
    _refuse_biases(arch, raw)
    num_layers = _required(raw, "num_hidden_layers")
    sliding_window = raw.get("sliding_window")
    if raw.get("use_sliding_window") is False:
        sliding_window = None  # Qwen2/3 carry a window size they do not use
    return ModelConfig(
        architecture=arch,
        vocab_size=_required(raw, "vocab_size"),
        hidden_size=hidden_size,
        intermediate_size=_required(raw, "intermediate_size"),
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=raw.get("num_key_value_heads") or num_heads,
        head_dim=head_dim,
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        qkv_bias=variant.get("qkv_bias", False) or bool(raw.get("attention_bias", False)),
        qk_norm=variant.get("qk_norm", False),
        mlp_bias=bool(raw.get("mlp_bias", False)),
        sliding_window=sliding_window or None,
        rope_interleaved=variant.get("rope_interleaved", False),
        moe=moe_config(arch, raw, num_layers),
        dtype=str(raw.get("torch_dtype") or raw.get("dtype") or "float32"),
        eos_token_ids=_eos_ids(raw, generation or {}),
        bos_token_id=raw.get("bos_token_id"),
        **_quantization(raw),
    )


def _refuse_biases(arch: str, raw: dict[str, Any]) -> None:
    # ERNIE's use_bias puts a bias on every projection and the LM head; its released
    # checkpoints have none, and the decoder here carries biases on q/k/v and the MLP only.
    if raw.get("use_bias"):
        raise ModelConfigError(
            f"{arch} with use_bias=true (a bias on every projection) is not supported; the "
            "released ERNIE 4.5 checkpoints set it to false"
        )


def _quantization(raw: dict[str, Any]) -> dict[str, str]:
    section = raw.get("quantization_config")
    if not section:
        return {}
    if not isinstance(section, dict):
        raise ModelConfigError(
            f"config.json's quantization_config is {section!r}; expected an object with a "
            "quant_method"
        )
    method = str(section.get("quant_method") or "unknown")
    return {"quant_method": method, "quantization_config": json.dumps(section, sort_keys=True)}


def _architecture(raw: dict[str, Any]) -> str:
    names = raw.get("architectures") or []
    if not names and raw.get("model_type") in _MODEL_TYPE_TO_ARCH:
        names = [_MODEL_TYPE_TO_ARCH[raw["model_type"]]]
    for name in names:
        if name in SUPPORTED_ARCHITECTURES:
            return name
    shown = ", ".join(names) or f"model_type={raw.get('model_type')!r}"
    raise ModelConfigError(
        f"unsupported architecture {shown}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
    )


def _rope(raw: dict[str, Any]) -> tuple[float, RopeScaling]:
    # transformers 5 writes `rope_parameters`; older configs write rope_theta + rope_scaling.
    params = dict(raw.get("rope_scaling") or {})
    params.update(raw.get("rope_parameters") or {})
    theta = float(params.pop("rope_theta", raw.get("rope_theta", 10000.0)))
    rope_type = params.get("rope_type") or params.get("type") or "default"
    if rope_type not in ("default", "linear", "llama3"):
        raise ModelConfigError(
            f"unsupported rope scaling type {rope_type!r}; supported: default, linear, llama3"
        )
    fields = {k: params[k] for k in RopeScaling.__struct_fields__ if k in params}
    fields["rope_type"] = rope_type
    return theta, msgspec.convert(fields, RopeScaling, strict=False)


def _eos_ids(raw: dict[str, Any], generation: dict[str, Any]) -> tuple[int, ...]:
    ids: list[int] = []
    for source in (generation.get("eos_token_id"), raw.get("eos_token_id")):
        if source is None:
            continue
        for token_id in source if isinstance(source, list) else [source]:
            if token_id not in ids:
                ids.append(int(token_id))
    return tuple(ids)


def _required(raw: dict[str, Any], key: str) -> int:
    if key not in raw:
        raise ModelConfigError(
            f"config.json has no {key!r}; it is required for a Llama-family model"
        )
    return int(raw[key])


def _read_json(path: Path, missing_ok: bool = False) -> dict[str, Any]:
    if missing_ok and not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ModelConfigError(f"{path} is not valid JSON: {exc}") from exc
