"""GGUF conversion against transformers' own GGUF reader: same weights, same tokens."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from aioworker.checkpoint.gguf_import import GGUFImportError, convert_gguf, unpermute_rotary
from aioworker.checkpoint.model_config import load_model_config
from aioworker.checkpoint.source import embedded_gguf_path, resolve_model_path
from aioworker.checkpoint.tokenizer import Tokenizer

TEXTS = [
    "Hello world! 12345 ",
    "  multiple   spaces\n\nnew lines\tand tabs",
    "<|im_start|>user\nhi<|im_end|>",
    "Ünïcödé 日本語 emoji 🎉 and don't, we'll, I've",
]


def test_unpermute_inverts_llama_cpp_permutation() -> None:
    heads, head_dim, cols = 3, 8, 5
    original = np.arange(heads * head_dim * cols, dtype=np.float32).reshape(heads * head_dim, cols)
    # llama.cpp's converter: reshape(heads, 2, head_dim // 2, ...) then swap axes 1 and 2.
    permuted = (
        original.reshape(heads, 2, head_dim // 2, cols).swapaxes(1, 2).reshape(original.shape)
    )
    assert np.array_equal(unpermute_rotary(permuted, heads), original)


def test_embedded_conversion_equals_transformers_gguf_loader(embedded_model_dir) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = embedded_gguf_path()
    reference = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    ours = load_file(str(embedded_model_dir / "model.safetensors"))
    reference_state = reference.state_dict()
    assert set(ours) == set(reference_state) - {"lm_head.weight"}  # tied to the embedding
    for name, tensor in ours.items():
        assert torch.equal(tensor, reference_state[name]), name
    reference_tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tokenizer = Tokenizer(embedded_model_dir)
    for text in TEXTS:
        assert tokenizer.encode(text) == reference_tokenizer.encode(text), text
    config = load_model_config(embedded_model_dir)
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (9, 3, 64)
    assert config.tie_word_embeddings and config.eos_token_ids == (2,)
    assert tokenizer.chat_template and "<|im_start|>" in tokenizer.chat_template


def test_conversion_is_cached(embedded_model_dir) -> None:
    marker = embedded_model_dir / "model.safetensors"
    mtime = marker.stat().st_mtime_ns
    assert resolve_model_path("embedded", progress=False) == embedded_model_dir
    assert marker.stat().st_mtime_ns == mtime


def test_unsupported_gguf_architecture_is_named(tmp_path) -> None:
    from gguf import GGUFWriter

    path = tmp_path / "tiny-gpt2.gguf"
    writer = GGUFWriter(str(path), "gpt2")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(
        GGUFImportError, match="GGUF architecture 'gpt2' is not supported; supported: llama"
    ):
        convert_gguf(path, tmp_path / "out")


def test_checkpoint_imports_no_torch() -> None:
    modules = "gguf_import, gguf_tokenizer, model_config, source, tokenizer"
    code = (
        f"from aioworker.checkpoint import {modules}; import sys; assert 'torch' not in sys.modules"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
