"""Write a dense tiny checkpoint's projections in the layouts quantized checkpoints ship in
(compressed-tensors fp8 per channel / per tensor / in blocks, `fp8` with `weight_scale_inv`
blocks, compressed-tensors int4 `pack-quantized`), and beside it the dequantized weights as a
dense checkpoint: the reference the quantized one must run like. Written from the formats'
descriptions, not with the worker's own code."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
E4M3 = torch.float8_e4m3fn


def fp8_channel(w):
    scale = w.abs().amax(dim=1, keepdim=True) / 448
    q = (w / scale).to(E4M3)
    return {"weight": q, "weight_scale": scale}, q.float() * scale


def fp8_tensor(w):
    scale = w.abs().amax().reshape(1) / 448
    q = (w / scale).to(E4M3)
    return {"weight": q, "weight_scale": scale}, q.float() * scale


def fp8_blocks(scale_name: str):
    def quantize(w):
        n, k = w.shape
        blocks = w.reshape(n // 128, 128, k // 128, 128)
        scale = blocks.abs().amax(dim=(1, 3)) / 448  # [n / 128, k / 128]
        q = (blocks / scale[:, None, :, None]).to(E4M3)
        dequantized = (q.float() * scale[:, None, :, None]).reshape(n, k)
        return {"weight": q.reshape(n, k), scale_name: scale}, dequantized

    return quantize


def pack_int32(values: torch.Tensor, dim: int) -> torch.Tensor:
    """Signed int4 values, stored as value + 8, eight to a word along `dim`, first in the low bits."""
    unsigned = (values + 8).to(torch.int64).movedim(dim, -1)
    words = unsigned.reshape(*unsigned.shape[:-1], -1, 8)
    packed = sum(words[..., i] << (4 * i) for i in range(8))
    packed = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)
    return packed.movedim(-1, dim)


def int4_groups(group: int, symmetric: bool):
    def quantize(w):
        n, k = w.shape
        g = w.reshape(n, k // group, group)
        if symmetric:
            scale = g.abs().amax(dim=-1) / 7.5
            zero = torch.zeros_like(scale, dtype=torch.int64)
        else:
            low, high = g.amin(dim=-1), g.amax(dim=-1)
            scale = (high - low) / 15
            zero = torch.round(-low / scale).to(torch.int64) - 8  # so that low maps to -8
        q = torch.round(g / scale[..., None] + zero[..., None]).clamp(-8, 7).to(torch.int64)
        tensors = {
            "weight_packed": pack_int32(q.reshape(n, k), 1),
            "weight_scale": scale.to(torch.bfloat16),
            "weight_shape": torch.tensor([n, k], dtype=torch.int32),
        }
        if not symmetric:
            tensors["weight_zero_point"] = pack_int32(zero, 0)
        # the reference uses the scales as stored (bfloat16)
        dequantized = ((q - zero[..., None]) * scale.to(torch.bfloat16).float()[..., None]).reshape(
            n, k
        )
        return tensors, dequantized

    return quantize


def _config_group(weights: dict, fmt: str) -> dict:
    return {
        "quant_method": "compressed-tensors",
        "format": fmt,
        "config_groups": {
            "group_0": {"targets": ["Linear"], "weights": weights, "input_activations": None}
        },
        "ignore": ["lm_head"],
    }


def layouts() -> dict[str, tuple]:
    """name -> (quantize(w) -> (tensors, dequantized), quantization_config)."""
    fp8 = {"type": "float", "num_bits": 8, "symmetric": True}
    int4 = {"type": "int", "num_bits": 4, "strategy": "group", "group_size": 128}
    return {
        "ct-fp8-channel": (fp8_channel, _config_group({**fp8, "strategy": "channel"}, "float-quantized")),
        "ct-fp8-tensor": (fp8_tensor, _config_group({**fp8, "strategy": "tensor"}, "float-quantized")),
        "ct-fp8-block": (
            fp8_blocks("weight_scale"),
            _config_group({**fp8, "strategy": "block", "block_structure": [128, 128]}, "float-quantized"),
        ),
        "fp8-block": (
            fp8_blocks("weight_scale_inv"),
            {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]},
        ),
        "ct-w4a16": (int4_groups(128, True), _config_group({**int4, "symmetric": True}, "pack-quantized")),
        "ct-w4a16-asym": (int4_groups(128, False), _config_group({**int4, "symmetric": False}, "pack-quantized")),
    }  # fmt: skip


def write_quantized(dense_dir: Path, layout: str, out_dir: Path, reference_dir: Path) -> None:
    quantize, quantization_config = layouts()[layout]
    tensors = load_file(str(dense_dir / "model.safetensors"))
    quantized, reference = {}, {}
    for name, tensor in tensors.items():
        module = name.removesuffix(".weight")
        if name.endswith(".weight") and module.rsplit(".", 1)[-1] in PROJECTIONS:
            stored, dequantized = quantize(tensor.float())
            quantized.update({f"{module}.{key}": value for key, value in stored.items()})
            reference[name] = dequantized
        else:
            quantized[name] = reference[name] = tensor
    for directory, weights in ((out_dir, quantized), (reference_dir, reference)):
        directory.mkdir(parents=True, exist_ok=True)
        for extra in dense_dir.iterdir():
            if extra.name != "model.safetensors" and extra.is_file():
                shutil.copy(extra, directory / extra.name)
        save_file(
            {k: v.contiguous() for k, v in weights.items()}, str(directory / "model.safetensors")
        )
    config = json.loads((out_dir / "config.json").read_text())
    config["quantization_config"] = quantization_config
    (out_dir / "config.json").write_text(json.dumps(config))
