"""Weight-only quantization (model.quantization "wint8" and "wint4"): linear methods that
quantize each layer's weight after it is loaded and multiply activations, which stay in the
model's dtype, by the quantized weight.

- int8: symmetric, one scale per output channel: w ~ q * s, q in -127..127, s = max|row| / 127.
  Multiplied by torch's `_weight_int8pack_mm` (x @ q^T, then * s).
- int4: asymmetric groups of 32 input features, llama.cpp's Q4_1 block: w ~ (q - 8) s + z with
  q in 0..15, s = (max - min) / 15 and z = min + 8 s per group, packed once for torch's
  `_weight_int4pack_mm_for_cpu`. Groups of 32, not 128: the embedded model's weights come from
  a 4-bit GGUF on exactly this grid, which 32 reproduces (next-token agreement 100%) and 64 or
  128 do not (70%; tests/test_quantization.py, docs/benchmarks.md). model.int4_group picks
  64 or 128 for models quantized from 16-bit weights, where 128 is the usual grid (gpt-fast,
  GPTQ and AWQ checkpoints) and reads 0.09 fewer bytes a weight (two bf16 numbers a group).

Both kernels are fast only with bfloat16 activations (on the 2-core EPYC, avx512_bf16: a
576 x 3072 product at one row takes 72 us in bf16 against 947 us in float32, and 86 us for
float32 with packed dense weights), so the product runs in bfloat16 whatever the model's
dtype, and its result is cast back. And they are fast only for a few rows: at 8 rows and more a dense weight in oneDNN's packed
layout is faster (576 x 3072: 189 us packed against 270 int8 and 236 int4 at 8 rows; 95 against
73 and 68 at one). So a product of more than MAX_QUANTIZED_ROWS rows (prefill, large decode
batches, drafts verified) multiplies by the dequantized weight, packed: the same values as the
kernels, so a request's tokens do not hang on its step's row count. (Packing the original dense
weight instead made verified drafts and decoding read different weights, which changed greedy
tokens on weights off the int4 grid: tests/test_quantization_composes.py.)

The dense weight stays on the layer as the source of truth: loads and weights updates write it,
and `process_after_loading` quantizes it again (after a load, a commit, a resume). So updates,
rollback, release and resume work unchanged, at the price of keeping the dense copy in memory
(the GPU's formats, quantized/, hold only the quantized values).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from aioworker.compute.layers import cpu_packing

INT4_GROUP = 32
KERNEL_DTYPE = torch.bfloat16
MAX_QUANTIZED_ROWS = 4


class _WeightOnly(cpu_packing.CpuPacked):
    """Quantized products for a few rows, and for more the dequantized weight in oneDNN's packed
    layout: every product multiplies by the same (quantized) values, so a request's tokens do
    not depend on how many rows its step had (drafts verified, a prefix-cache hit, a batch)."""

    def process_after_loading(self, layer: nn.Module) -> None:
        dequantized = self.quantize(layer).to(layer.weight.dtype)
        if cpu_packing.is_available(layer.weight.device):
            layer.packed_weight, layer.dequantized_weight = cpu_packing.pack(dequantized), None
        else:
            layer.packed_weight, layer.dequantized_weight = None, dequantized

    def drop_derived(self, layer: nn.Module) -> None:
        layer.packed_weight = layer.dequantized_weight = None
        self.forget(layer)

    def apply(
        self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        if not self.ready(layer):  # not loaded yet, or released
            return F.linear(x, layer.weight, bias)
        if len(rows) > MAX_QUANTIZED_ROWS:
            if layer.packed_weight is not None:
                return cpu_packing.packed_linear(x, layer.packed_weight, bias)
            return F.linear(x, layer.dequantized_weight, bias)
        y = self.multiply(layer, rows.to(KERNEL_DTYPE)).to(x.dtype)
        y = y.reshape(*x.shape[:-1], y.shape[-1])
        return y if bias is None else y + bias


class WeightOnlyInt8(_WeightOnly):
    name = "wint8"

    def quantize(self, layer: nn.Module) -> torch.Tensor:
        q, scales = quantize_int8(layer.weight.data)
        layer.int8_weight, layer.int8_scales = q, scales.to(KERNEL_DTYPE)
        return dequantize_int8(q, layer.int8_scales)

    def forget(self, layer: nn.Module) -> None:
        layer.int8_weight = layer.int8_scales = None

    def ready(self, layer: nn.Module) -> bool:
        return getattr(layer, "int8_weight", None) is not None

    def multiply(self, layer: nn.Module, rows: torch.Tensor) -> torch.Tensor:
        return torch._weight_int8pack_mm(rows, layer.int8_weight, layer.int8_scales)

    def weight_bytes(self, layer: nn.Module) -> int:
        return _bytes(layer.int8_weight, layer.int8_scales)


class WeightOnlyInt4(_WeightOnly):
    name = "wint4"

    def __init__(self, group: int = INT4_GROUP) -> None:
        self.group = group

    def quantize(self, layer: nn.Module) -> torch.Tensor:
        q, scales_and_zeros, group = quantize_int4(layer.weight.data, self.group)
        layer.int4_weight = torch._convert_weight_to_int4pack_for_cpu(q, 1)
        layer.int4_scales_and_zeros = scales_and_zeros.to(KERNEL_DTYPE)
        layer.int4_group = group
        return dequantize_int4(q, layer.int4_scales_and_zeros, group)

    def forget(self, layer: nn.Module) -> None:
        layer.int4_weight = layer.int4_scales_and_zeros = None

    def ready(self, layer: nn.Module) -> bool:
        return getattr(layer, "int4_weight", None) is not None

    def multiply(self, layer: nn.Module, rows: torch.Tensor) -> torch.Tensor:
        return torch._weight_int4pack_mm_for_cpu(
            rows, layer.int4_weight, layer.int4_group, layer.int4_scales_and_zeros
        )

    def weight_bytes(self, layer: nn.Module) -> int:
        return _bytes(layer.int4_weight, layer.int4_scales_and_zeros)


def _bytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


WINT8 = WeightOnlyInt8()
WINT4 = WeightOnlyInt4()


@functools.cache
def wint4(group: int) -> WeightOnlyInt4:
    """The int4 method of `group` inputs a group (one instance a group: WINT4 for 32)."""
    return WINT4 if group == INT4_GROUP else WeightOnlyInt4(group)


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q [N, K] int8, scales [N] in the weight's dtype)."""
    w = weight.float()
    scales = (w.abs().amax(dim=1) / 127).clamp_min(1e-12)
    q = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scales.to(weight.dtype)


def dequantize_int8(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return q.float() * scales.float()[:, None]


def int4_group(in_features: int, group: int = INT4_GROUP) -> int:
    if in_features % group == 0:
        return group
    smaller = " or a smaller model.int4_group" if group > INT4_GROUP else ""
    raise ValueError(
        f"a layer of {in_features} input features cannot be quantized to int4 in groups of "
        f"{group}; use model.quantization = 'wint8' or 'none'{smaller}"
    )


def quantize_int4(
    weight: torch.Tensor, group: int = INT4_GROUP
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(q [N, K] int32 in 0..15, scales and zeros [K / G, N, 2] in the weight's dtype, G)."""
    out_features, in_features = weight.shape
    group = int4_group(in_features, group)
    w = weight.float().reshape(out_features, in_features // group, group)
    low, high = w.amin(dim=-1, keepdim=True), w.amax(dim=-1, keepdim=True)
    scales = ((high - low) / 15).clamp_min(1e-12)
    q = torch.round((w - low) / scales).clamp(0, 15).to(torch.int32)
    zeros = low + 8 * scales
    scales_and_zeros = torch.stack([scales.squeeze(-1), zeros.squeeze(-1)], dim=-1)
    scales_and_zeros = scales_and_zeros.transpose(0, 1).contiguous().to(weight.dtype)
    return q.reshape(out_features, in_features), scales_and_zeros, group


def dequantize_int4(q: torch.Tensor, scales_and_zeros: torch.Tensor, group: int) -> torch.Tensor:
    out_features, in_features = q.shape
    sz = scales_and_zeros.float().transpose(0, 1)  # [N, K / G, 2]
    grouped = q.float().reshape(out_features, in_features // group, group)
    w = (grouped - 8) * sz[..., :1] + sz[..., 1:]
    return w.reshape(out_features, in_features)
