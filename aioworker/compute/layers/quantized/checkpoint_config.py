"""Which linear method loads a quantized checkpoint, from config.json's `quantization_config`.

Understood: compressed-tensors with one group of Linear layers (fp8 per channel, per tensor or
in 128 x 128 blocks; int4 groups `pack-quantized`), and the `fp8` method with 128 x 128 blocks
(`weight_block_size`, DeepSeek's and Qwen3's releases). Anything else stops start-up with a
message naming the field and what it holds; quantized layers other than the decoder's
projections are refused the same way (only the LM head may be left out, and it is dense).
"""

from __future__ import annotations

import json
from typing import Any

from aioworker.compute.layers.quantized.checkpoint_fp8 import (
    BLOCK,
    Fp8BlockCheckpoint,
    Fp8Checkpoint,
)
from aioworker.compute.layers.quantized.checkpoint_int4 import Int4Checkpoint

_LM_HEAD = ("lm_head", "re:.*lm_head", "re:lm_head")


class UnsupportedQuantization(ValueError):
    pass


def checkpoint_method(quant_method: str, config_json: str):
    config = json.loads(config_json) if config_json else {}
    if quant_method == "compressed-tensors":
        return _compressed_tensors(config)
    if quant_method == "fp8":
        return _fp8_blocks(config)
    raise UnsupportedQuantization(
        f"quantization_config.quant_method {quant_method!r} is not one this version loads "
        "('compressed-tensors' fp8 or int4, 'fp8' with 128x128 blocks); give a bf16 checkpoint "
        "and set model.quantization instead"
    )


def _fp8_blocks(config: dict[str, Any]):
    block = config.get("weight_block_size")
    if list(block or []) != [BLOCK, BLOCK]:
        raise UnsupportedQuantization(
            f"quantization_config.weight_block_size is {block!r}; this version loads fp8 "
            f"checkpoints in blocks of [{BLOCK}, {BLOCK}]"
        )
    return Fp8BlockCheckpoint("weight_scale_inv")


def _compressed_tensors(config: dict[str, Any]):
    groups = config.get("config_groups") or {}
    if len(groups) != 1:
        raise UnsupportedQuantization(
            f"quantization_config.config_groups has {len(groups)} groups; this version loads "
            "one group quantizing every Linear layer"
        )
    [(group_name, group)] = groups.items()
    where = f"quantization_config.config_groups.{group_name}"
    if group.get("targets") != ["Linear"]:
        raise UnsupportedQuantization(
            f"{where}.targets is {group.get('targets')!r}; expected ['Linear']"
        )
    ignored = [name for name in config.get("ignore") or [] if name not in _LM_HEAD]
    if ignored:
        raise UnsupportedQuantization(
            f"quantization_config.ignore leaves {ignored[:3]!r} unquantized; this version "
            "quantizes every decoder projection alike (only the LM head may be left out)"
        )
    weights = group.get("weights") or {}
    kind = (weights.get("type"), weights.get("num_bits"))
    if kind == ("float", 8):
        return _ct_fp8(weights, where)
    if kind == ("int", 4):
        return _ct_int4(weights, group.get("format") or config.get("format"), where)
    raise UnsupportedQuantization(
        f"{where}.weights are {kind[0]} of {kind[1]} bits; this version loads float 8-bit and "
        "int 4-bit weights"
    )


def _ct_fp8(weights: dict[str, Any], where: str):
    strategy = weights.get("strategy")
    if strategy in ("channel", "tensor"):
        return Fp8Checkpoint(strategy)
    if strategy == "block" and list(weights.get("block_structure") or []) == [BLOCK, BLOCK]:
        return Fp8BlockCheckpoint("weight_scale")
    raise UnsupportedQuantization(
        f"{where}.weights.strategy is {strategy!r} (block_structure "
        f"{weights.get('block_structure')!r}); this version loads 'channel', 'tensor' and "
        f"'block' [{BLOCK}, {BLOCK}]"
    )


def _ct_int4(weights: dict[str, Any], fmt: str | None, where: str):
    if fmt != "pack-quantized":
        raise UnsupportedQuantization(
            f"{where}: int4 weights in format {fmt!r}; expected 'pack-quantized'"
        )
    if weights.get("strategy") != "group" or weights.get("actorder") not in (None, False):
        raise UnsupportedQuantization(
            f"{where}.weights: strategy {weights.get('strategy')!r}, actorder "
            f"{weights.get('actorder')!r}; this version loads int4 groups without activation "
            "reordering"
        )
    return Int4Checkpoint(int(weights["group_size"]), bool(weights.get("symmetric", True)))
