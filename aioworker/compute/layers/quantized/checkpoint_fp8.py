"""FP8 checkpoints as they are shipped: e4m3 weights with their scales, loaded as stored.

- Per channel or per tensor (compressed-tensors `float-quantized`, what llm-compressor writes):
  `weight` [N, K] e4m3 and `weight_scale` [N, 1] or one per tensor. A per-tensor scale becomes
  one per row while loading (merged q/k/v keep each part's own), so every layout multiplies
  through the same rowwise `torch._scaled_mm` as model.quantization "fp8" (fp8.py).
- Blocks of 128 x 128 (DeepSeek's and Qwen3's `-FP8` releases, `weight_scale_inv`; and
  compressed-tensors' `block` strategy, `weight_scale`): loaded as stored and multiplied with
  activations quantized in groups of 128, by torch's block-scaled product (cuBLAS's 1x128 by
  128x128 recipe: Hopper, CUDA 12.9 and later). Where there is none, a dequantized copy is
  multiplied instead. (Requantizing the blocks per row would keep the rowwise product, but
  rounds every weight twice: 6% off dequantize-then-multiply, measured.)

Activations are quantized on the fly in every case (per token; in groups of 128 for blocks): a
checkpoint's static `input_scale` tensors are not used (ignored_suffixes).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from aioworker.compute.layers.linear_method import NothingDerived
from aioworker.compute.layers.param_loading import ParamLoading
from aioworker.compute.layers.quantized.fp8 import (
    E4M3,
    quantize_activations,
    scaled_product,
)
from aioworker.compute.layers.quantized.on_load import finish, kernel_rows, refresh

BLOCK = 128


def _rows_of(scale: torch.Tensor, rows: int) -> torch.Tensor:
    """A per-tensor scale ([], [1], [1, 1]) repeated per row; a per-channel one ([N, 1]) flat."""
    if scale.numel() == 1:
        return scale.reshape(1).expand(rows)
    return scale.reshape(-1)


class Fp8Checkpoint(NothingDerived):
    ignored_suffixes = (".input_scale",)

    def __init__(self, strategy: str) -> None:
        self.name = f"fp8 ({strategy}, checkpoint)"

    def create_weights(self, layer: nn.Module, out_features: int, in_features: int) -> None:
        layer.weight = nn.Parameter(
            torch.empty(out_features, in_features, dtype=E4M3), requires_grad=False
        )
        layer.weight_scale = nn.Parameter(
            torch.empty(out_features, dtype=torch.float32), requires_grad=False
        )
        layer.weight_scale.loading = ParamLoading(in_block=0, expand=_rows_of)  # fmt: skip

    def apply(
        self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        return scaled_product(x, layer.weight, layer.weight_scale, bias)

    def weight_bytes(self, layer: nn.Module) -> int:
        return layer.weight.numel() + layer.weight_scale.numel() * 4


def dequantize_blocks(weight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """e4m3 [N, K] with one scale per 128 x 128 block ([ceil(N/128), ceil(K/128)]) -> float32."""
    rows, columns = weight.shape
    per_element = scales.float().repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)
    return weight.float() * per_element[:rows, :columns]


def quantize_groups(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows in groups of 128 inputs, one scale each (the activations' side of the recipe)."""
    rows, columns = x.shape
    q, scales = quantize_activations(x.contiguous().reshape(rows * columns // BLOCK, BLOCK))
    return q.reshape(rows, columns), scales.reshape(rows, columns // BLOCK)


# How this torch wants the scales of a 1x128 by 128x128 product laid out, found by trying
# (_find_block_layout): (activation scales outer-dim-major?, weight scales transposed?). torch
# 2.11 with CUDA 13 on the H200 takes the first: [M, K/128] stored column-major, and the
# weight's [N/128, K/128] seen transposed.
_LAYOUTS = ((True, True), (True, False), (False, True), (False, False))
_chosen_layout: dict[torch.device, tuple[bool, bool] | None] = {}


def block_product(x, weight, scales, layout, bias) -> torch.Tensor:
    rows = kernel_rows(x)
    padded = -(-len(rows) // 4) * 4  # cuBLAS wants rows in fours
    if padded != len(rows):
        rows = F.pad(rows, (0, 0, 0, padded - len(rows)))
    xq, x_scales = quantize_groups(rows)
    outer_major, transposed = layout
    scale_a = x_scales.t().contiguous().t() if outer_major else x_scales
    scale_b = scales.t() if transposed else scales
    y = torch._scaled_mm(xq, weight.t(), scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16)
    return finish(y[: len(kernel_rows(x))], x, bias)


def _find_block_layout(device: torch.device) -> tuple[bool, bool] | None:
    """The first layout whose product equals dequantize-then-multiply on a random problem; None
    where the device has no block-scaled product (before Hopper, CUDA before 12.9, the CPU)."""
    if device not in _chosen_layout:
        _chosen_layout[device] = None
        if device.type == "cuda":
            w = torch.randn(384, 512, device=device).to(E4M3)
            s = torch.rand(3, 4, device=device) + 0.5
            dense = dequantize_blocks(w, s)
            for layout in _LAYOUTS:
                try:
                    if _agrees(w, s, dense, layout):
                        _chosen_layout[device] = layout
                        break
                except (RuntimeError, ValueError):  # "Invalid scaling configuration"
                    continue
    return _chosen_layout[device]


def _agrees(weight, scales, dense, layout) -> bool:
    """The block product equals dequantize-then-multiply on random rows: probes the layout,
    and checks each layer once per load (cuBLAS on the H200 gets layers of 256 inputs wrong,
    60-99% off, and others right)."""
    x = torch.randn(16, weight.shape[1], device=weight.device, dtype=torch.bfloat16)
    want = x.float() @ dense.t()
    got = block_product(x, weight, scales, layout, None).float()
    return bool((got - want).abs().max() <= 0.1 * want.abs().max())


class Fp8BlockCheckpoint:
    """Multiplied by torch's block-scaled product where the device has one (its layout probed
    once); elsewhere by the dense GEMM on a dequantized copy in the model's dtype (which holds
    three bytes a weight: correct everywhere, fast nowhere)."""

    ignored_suffixes = (".input_scale",)

    def __init__(self, scale_name: str) -> None:
        self.name = "fp8 (128x128 blocks, checkpoint)"
        self.scale_name = scale_name  # "weight_scale_inv" or "weight_scale"

    def create_weights(self, layer: nn.Module, out_features: int, in_features: int) -> None:
        blocks = (-(-out_features // BLOCK), -(-in_features // BLOCK))
        layer.weight = nn.Parameter(
            torch.empty(out_features, in_features, dtype=E4M3), requires_grad=False
        )
        scales = nn.Parameter(torch.empty(blocks, dtype=torch.float32), requires_grad=False)
        scales.loading = ParamLoading(out_block=BLOCK, in_block=BLOCK)
        setattr(layer, self.scale_name, scales)
        layer.dense_dtype = torch.get_default_dtype()  # fmt: skip

    def process_after_loading(self, layer: nn.Module) -> None:
        weight, scales = layer.weight, getattr(layer, self.scale_name)
        dense = dequantize_blocks(weight, scales)
        layout = _find_block_layout(weight.device) if weight.shape[1] % BLOCK == 0 else None
        layer.block_layout = layout if layout and _agrees(weight, scales, dense, layout) else None
        if layer.block_layout is None:
            refresh(layer, "dequantized", dense.to(layer.dense_dtype))

    def drop_derived(self, layer: nn.Module) -> None:
        layer.dequantized = None

    def apply(
        self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        if layer.block_layout is None:
            return F.linear(x, layer.dequantized.to(x.dtype), bias)
        scales = getattr(layer, self.scale_name)
        return block_product(x, layer.weight, scales, layer.block_layout, bias)

    def weight_bytes(self, layer: nn.Module) -> int:
        if layer.block_layout is None:
            return layer.dequantized.numel() * layer.dequantized.element_size()
        return layer.weight.numel() + getattr(layer, self.scale_name).numel() * 4
