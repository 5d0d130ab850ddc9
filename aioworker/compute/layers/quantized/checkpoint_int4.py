"""Int4 weight-only checkpoints as compressed-tensors stores them (`pack-quantized`, what
llm-compressor's W4A16 writes): `weight_packed` [N, K / 8] int32, eight values a word, the first
in the low bits, each stored as value + 8; `weight_scale` [N, K / G]; and, where asymmetric,
`weight_zero_point` [N / 8, K / G] packed the same way along the rows. w = (q - z) s.

Loaded as stored (a shard slices whole words and groups), then the kernel's layout is derived
(weight_only.Int4Kernels): torch's convention is w = (q' - 8) s + o with q' = q + 8, so the
offset is o = -z s.
"""

from __future__ import annotations

import torch
from torch import nn

from aioworker.compute.layers.param_loading import ParamLoading
from aioworker.compute.layers.quantized.weight_only import Int4Kernels, dequantize_int4_values

PACK = 8  # int4 values per int32


def unpack_int32(packed: torch.Tensor, dim: int) -> torch.Tensor:
    """Values 0..15 (value + 8) from int32 words along `dim`, the first value in the low bits."""
    shifts = torch.arange(0, 32, 4, device=packed.device, dtype=torch.int32)
    moved = packed.movedim(dim, -1)
    values = (moved[..., None] >> shifts) & 0xF
    return values.reshape(*moved.shape[:-1], -1).movedim(-1, dim)


class Int4Checkpoint(Int4Kernels):
    ignored_suffixes = (".weight_shape",)

    def __init__(self, group: int, symmetric: bool) -> None:
        self.group, self.symmetric = group, symmetric
        kind = "symmetric" if symmetric else "asymmetric"
        self.name = f"w4a16 (groups of {group}, {kind}, checkpoint)"

    def create_weights(self, layer: nn.Module, out_features: int, in_features: int) -> None:
        if in_features % self.group or in_features % PACK:
            raise ValueError(
                f"a layer of {in_features} input features does not hold whole groups of "
                f"{self.group} and words of {PACK}: this checkpoint's tensor-parallel shards do "
                "not fit; use a tensor-parallel size that keeps them whole"
            )
        groups = in_features // self.group
        layer.weight_packed = _parameter(
            (out_features, in_features // PACK), torch.int32, ParamLoading(in_block=PACK)
        )
        layer.weight_scale = _parameter(
            (out_features, groups), torch.get_default_dtype(), ParamLoading(in_block=self.group)
        )
        if not self.symmetric:
            zeros = ParamLoading(out_block=PACK, in_block=self.group)
            layer.weight_zero_point = _parameter(
                (-(-out_features // PACK), groups), torch.int32, zeros
            )
        layer.dense_shape = (out_features, in_features)  # fmt: skip

    def process_after_loading(self, layer: nn.Module) -> None:
        self.derive(layer, unpack_int32(layer.weight_packed, 1), *self._scales_and_offsets(layer))

    def _scales_and_offsets(self, layer: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        scales = layer.weight_scale.float()
        if self.symmetric:
            return scales, torch.zeros_like(scales)
        zeros = unpack_int32(layer.weight_zero_point, 0)[: scales.shape[0]] - 8
        return scales, -zeros * scales

    def dequantized(self, layer: nn.Module, dtype: torch.dtype) -> torch.Tensor:
        values = unpack_int32(layer.weight_packed, 1)
        return dequantize_int4_values(values, *self._scales_and_offsets(layer), dtype)

    def weight_bytes(self, layer: nn.Module) -> int:
        return sum(
            t.numel() * t.element_size() for t in (layer.int4_tiled, layer.int4_scales_and_offsets)
        )


def _parameter(shape: tuple[int, int], dtype: torch.dtype, loading: ParamLoading) -> nn.Parameter:
    param = nn.Parameter(torch.empty(shape, dtype=dtype), requires_grad=False)
    param.loading = loading
    return param
