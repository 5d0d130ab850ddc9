"""Convert a GGUF file (any quantisation the `gguf` package can dequantise) into a Hugging Face
model directory: config.json, model.safetensors, tokenizer.json, tokenizer_config.json and
generation_config.json.

llama.cpp's converter permutes the Q and K projections of `llama` models for its interleaved
rotary layout; we undo that so the weights fit the rotate-half layout Hugging Face uses.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize
from safetensors.numpy import save_file
from tqdm import tqdm

from aioworker.checkpoint.gguf_tokenizer import build_tokenizer

# GGUF architecture -> (config.json architecture, whether Q/K were permuted by llama.cpp).
GGUF_ARCHITECTURES = {
    "llama": ("LlamaForCausalLM", True),
    "mistral": ("MistralForCausalLM", True),
    "qwen2": ("Qwen2ForCausalLM", False),
    "qwen3": ("Qwen3ForCausalLM", False),
}

_LAYER_TENSORS = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_TENSORS = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_LAYER_NAME = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)$")


class GGUFImportError(ValueError):
    """The GGUF file cannot be converted; the message says why."""


def convert_gguf(gguf_path: str | Path, out_dir: str | Path, progress: bool = True) -> Path:
    """Write a model directory for `gguf_path` into `out_dir` (created; must not hold a model)."""
    reader = GGUFReader(str(gguf_path))
    meta = _Metadata(reader)
    arch = meta.get("general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise GGUFImportError(
            f"{gguf_path}: GGUF architecture {arch!r} is not supported; "
            f"supported: {', '.join(GGUF_ARCHITECTURES)}"
        )
    hf_arch, permuted = GGUF_ARCHITECTURES[arch]
    if any(t.name == "rope_freqs.weight" for t in reader.tensors):
        raise GGUFImportError(
            f"{gguf_path}: per-frequency rope factors (rope_freqs) are not supported; "
            "convert the original Hugging Face checkpoint instead"
        )
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    config = _config(meta, arch, hf_arch, reader)
    tensors = _tensors(reader, config, permuted, progress)
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    _write_json(out_dir / "config.json", config)
    _write_json(out_dir / "generation_config.json", _generation_config(meta))
    tokenizer, tokenizer_config = build_tokenizer(meta, config["max_position_embeddings"])
    tokenizer.save(str(out_dir / "tokenizer.json"))
    _write_json(out_dir / "tokenizer_config.json", tokenizer_config)
    return out_dir


class _Metadata:
    def __init__(self, reader: GGUFReader) -> None:
        self._fields = reader.fields

    def get(self, key: str, default: Any = None) -> Any:
        field = self._fields.get(key)
        return default if field is None else field.contents()

    def require(self, key: str) -> Any:
        if key not in self._fields:
            raise GGUFImportError(f"GGUF metadata has no {key!r}")
        return self._fields[key].contents()


def _config(meta: _Metadata, arch: str, hf_arch: str, reader: GGUFReader) -> dict[str, Any]:
    num_heads = int(meta.require(f"{arch}.attention.head_count"))
    hidden_size = int(meta.require(f"{arch}.embedding_length"))
    tokens = meta.require("tokenizer.ggml.tokens")
    names = {t.name for t in reader.tensors}
    config = {
        "architectures": [hf_arch],
        "model_type": arch,
        "hidden_size": hidden_size,
        "intermediate_size": int(meta.require(f"{arch}.feed_forward_length")),
        "num_hidden_layers": int(meta.require(f"{arch}.block_count")),
        "num_attention_heads": num_heads,
        "num_key_value_heads": int(meta.get(f"{arch}.attention.head_count_kv", num_heads)),
        "head_dim": int(meta.get(f"{arch}.attention.key_length", hidden_size // num_heads)),
        "rms_norm_eps": float(meta.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(meta.get(f"{arch}.rope.freq_base", 10000.0)),
        "max_position_embeddings": int(meta.get(f"{arch}.context_length", 2048)),
        "vocab_size": int(meta.get(f"{arch}.vocab_size", len(tokens))),
        "tie_word_embeddings": "output.weight" not in names,
        "attention_bias": "blk.0.attn_q.bias" in names,
        "torch_dtype": "float32",
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
    }
    scaling = meta.get(f"{arch}.rope.scaling.type")
    if scaling == "linear":
        config["rope_scaling"] = {
            "rope_type": "linear",
            "factor": float(meta.require(f"{arch}.rope.scaling.factor")),
        }
    elif scaling not in (None, "none"):
        raise GGUFImportError(
            f"GGUF rope scaling {scaling!r} is not supported; supported: none, linear"
        )
    return config


def _generation_config(meta: _Metadata) -> dict[str, Any]:
    eos = [meta.get("tokenizer.ggml.eos_token_id"), meta.get("tokenizer.ggml.eot_token_id")]
    eos_ids = list(dict.fromkeys(int(t) for t in eos if t is not None))
    return {
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": eos_ids[0] if len(eos_ids) == 1 else eos_ids,
    }


def _tensors(
    reader: GGUFReader, config: dict[str, Any], permuted: bool, progress: bool
) -> dict[str, np.ndarray]:
    """float32 arrays by Hugging Face name, C-contiguous: safetensors writes their raw buffers."""
    out: dict[str, np.ndarray] = {}
    for tensor in tqdm(
        reader.tensors, desc="dequantizing", unit="tensor", disable=not progress, leave=False
    ):
        name = _hf_name(tensor.name)
        values = np.array(
            dequantize(tensor.data, tensor.tensor_type), dtype=np.float32
        )  # writable copy
        if permuted and name.endswith(
            ("q_proj.weight", "k_proj.weight", "q_proj.bias", "k_proj.bias")
        ):
            heads = (
                config["num_attention_heads"]
                if ".q_proj." in name
                else config["num_key_value_heads"]
            )
            values = unpermute_rotary(values, heads)
        out[name] = np.ascontiguousarray(values)
    return out


def unpermute_rotary(values: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation (interleaved pairs -> rotate-half halves) per head."""
    rows = values.shape[0]
    head_dim = rows // num_heads
    grouped = values.reshape(num_heads, head_dim // 2, 2, *values.shape[1:])
    return grouped.swapaxes(1, 2).reshape(values.shape)


def _hf_name(gguf_name: str) -> str:
    base, _, kind = gguf_name.rpartition(".")
    if base in _GLOBAL_TENSORS:
        return f"{_GLOBAL_TENSORS[base]}.{kind}"
    match = _LAYER_NAME.match(gguf_name)
    if match and match.group(2) in _LAYER_TENSORS:
        layer, part, kind = match.groups()
        return f"model.layers.{layer}.{_LAYER_TENSORS[part]}.{kind}"
    raise GGUFImportError(f"GGUF tensor {gguf_name!r} has no Hugging Face counterpart we know")


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
