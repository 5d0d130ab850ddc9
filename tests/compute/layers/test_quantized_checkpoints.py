"""Quantized checkpoints as users ship them load and multiply like their dequantized weights:
a tiny model's projections written in each layout (tests/quantized_checkpoints.py), checked
against the same model's dequantized weights, layer by layer through each method's own product
(the identity as input reads the weight back exactly: one-hot rows quantize without error in
fp8 and bfloat16), and, for weight-only int4, token by token against the dense model; formats
this version does not load stop start-up naming the field."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from aioworker.core.sampling_params import SamplingParams
from tests.conftest import make_engine
from tests.quantized_checkpoints import layouts, write_quantized
from tests.tiny_models import build_tiny_model

# Sizes the 128 x 128 blocks and groups of 128 divide, merged q/k/v parts included.
SIZES = dict(hidden_size=256, intermediate_size=512, num_attention_heads=2, num_key_value_heads=1, head_dim=128)  # fmt: skip
PROMPTS = [[5, 17, 200, 31, 9], [300, 2, 2, 71]]
SETTINGS = {"model.dtype": "float32", "cache.num_blocks": 64, "model.max_model_len": 256}
MERGED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


@pytest.fixture(scope="module")
def dense_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("dense")
    build_tiny_model("llama", out, logit_scale=4.0, **SIZES)
    return out


def generate(engine):
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=0)
    return [(c.token_ids, c.logprobs) for c in engine.generate(PROMPTS, params)]


def reference_weight(reference: dict, prefix: str, name: str) -> torch.Tensor:
    parts = MERGED.get(name, (name,))
    return torch.cat([reference[f"{prefix}.{part}.weight"] for part in parts])


def read_back(layer, in_features: int, rows: int) -> torch.Tensor:
    """W[:, :rows] through the method's product: one-hot inputs."""
    device = next(layer.parameters()).device
    eye = torch.eye(in_features, device=device)[:rows]
    return layer.linear_method.apply(layer, eye).float().t()


@pytest.mark.parametrize("layout", list(layouts()))
def test_a_quantized_checkpoint_multiplies_as_its_dequantized_weights(
    dense_dir, tmp_path, layout
) -> None:
    write_quantized(dense_dir, layout, tmp_path / "quantized", tmp_path / "reference")
    reference = load_file(str(tmp_path / "reference" / "model.safetensors"))
    engine = make_engine(tmp_path / "quantized", **SETTINGS)
    try:
        decoder = engine.executor.runner.model.model
        for index, block in enumerate(decoder.layers):
            for owner, name in (("self_attn", "qkv_proj"), ("self_attn", "o_proj"), ("mlp", "gate_up_proj"), ("mlp", "down_proj")):  # fmt: skip
                layer = getattr(getattr(block, owner), name)
                want = reference_weight(reference, f"model.layers.{index}.{owner}", name)
                for rows in (3, want.shape[1]):  # the kernels' few rows, and many
                    got = read_back(layer, want.shape[1], rows)
                    # bfloat16 outputs (and int4 offsets, -zero x scale, held in bfloat16)
                    atol = 2**-8 * want.abs().max().item()
                    torch.testing.assert_close(got, want[:, :rows], rtol=2**-7, atol=atol)
        got = generate(engine)
    finally:
        engine.close()
    assert all(len(tokens) == 6 for tokens, _ in got)
    if "w4a16" in layout:  # weight-only: the dense model's tokens (fp8's activations differ)
        dense = make_engine(tmp_path / "reference", **SETTINGS)
        try:
            expected = generate(dense)
        finally:
            dense.close()
        for (tokens, logprobs), (want_tokens, want_logprobs) in zip(got, expected, strict=True):
            assert tokens == want_tokens
            for entry, want in zip(logprobs, want_logprobs, strict=True):
                assert abs(entry.logprob - want.logprob) < 0.1  # bfloat16 activations


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"quant_method": "awq"}, "quant_method 'awq' is not one this version loads"),
        (
            {"quant_method": "fp8", "weight_block_size": [64, 64]},
            r"weight_block_size is \[64, 64\]",
        ),
        (
            {**layouts()["ct-w4a16"][1], "ignore": ["lm_head", "model.layers.0.mlp.down_proj"]},
            "ignore leaves .*down_proj.* unquantized",
        ),
    ],
)
def test_a_format_not_loaded_stops_start_up_naming_the_field(
    dense_dir, tmp_path, section, message
) -> None:
    write_quantized(dense_dir, "ct-w4a16", tmp_path / "quantized", tmp_path / "reference")
    config_file = tmp_path / "quantized" / "config.json"
    config = json.loads(config_file.read_text())
    config["quantization_config"] = section
    config_file.write_text(json.dumps(config))
    with pytest.raises(ValueError, match=message):
        make_engine(tmp_path / "quantized", **SETTINGS)


def test_a_quantized_checkpoint_with_model_quantization_set_is_refused(dense_dir, tmp_path) -> None:
    write_quantized(dense_dir, "ct-fp8-channel", tmp_path / "quantized", tmp_path / "reference")
    with pytest.raises(ValueError, match="already quantized .* model.quantization to 'none'"):
        make_engine(tmp_path / "quantized", **SETTINGS, **{"model.quantization": "wint8"})
