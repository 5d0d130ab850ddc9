"""FP8 W8A8 (model.quantization "fp8"): e4m3 weights with one scale per output channel, and
activations quantized per token on the fly, multiplied by `torch._scaled_mm` (Hopper and Ada
tensor cores run fp8 at twice bf16's rate, and the weights are half the bytes).

y = (x_q W_q^T) * s_x s_w, with x_q = x / s_x, s_x = max|x_row| / 448 per token, and
W_q = W / s_w, s_w = max|W_row| / 448 per output channel. The product accumulates in float32 and
comes out in bfloat16 (the only output rowwise scaling allows on CUDA).
"""

from __future__ import annotations

import torch
from torch import nn

from aioworker.compute.layers.quantized.on_load import QuantizedOnLoad, finish, kernel_rows

E4M3 = torch.float8_e4m3fn
E4M3_MAX = torch.finfo(E4M3).max  # 448
# Hopper's fp8 tensor cores accumulate in reduced precision unless told not to; measured in
# docs/benchmarks.md (W8): prefill 1.59x bf16 with it, 1.48x without; vLLM's Hopper fp8 GEMMs
# accumulate so too.
FAST_ACCUMULATION = True


def quantize_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 values, float32 scale per row): w ~ q * s."""
    scales = (w.abs().amax(dim=-1).float() / E4M3_MAX).clamp_min(1e-12)
    inverse = (1.0 / scales).to(w.dtype)[..., None]
    q = (w * inverse).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
    return q, scales


def dequantize_rows(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return q.float() * scales.float()[..., None]


def quantize_activations(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: one Triton kernel on the GPU (triton_kernels.py), torch's ops elsewhere."""
    if rows.is_cuda:
        from aioworker.compute.layers.quantized.triton_kernels import fp8_quantize_rows

        return fp8_quantize_rows(rows.contiguous())
    return quantize_rows(rows)


def scaled_product(
    x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """x [..., K] times an e4m3 weight [N, K] with per-channel scales [N]."""
    rows = kernel_rows(x)
    xq, x_scale = quantize_activations(rows)
    y = torch._scaled_mm(
        xq,
        weight.t(),
        scale_a=x_scale[:, None],
        scale_b=weight_scale[None, :],
        out_dtype=torch.bfloat16,
        use_fast_accum=FAST_ACCUMULATION,
    )
    return finish(y, x, bias)


class Fp8OnLoad(QuantizedOnLoad):
    name = "fp8"

    def shapes(self, out_features: int, in_features: int) -> dict[str, torch.Tensor]:
        return {
            "weight": torch.empty(out_features, in_features, dtype=E4M3),
            "weight_scale": torch.empty(out_features, dtype=torch.float32),
        }

    def quantize(self, dense: torch.Tensor) -> dict[str, torch.Tensor]:
        q, scales = quantize_rows(dense.float())
        return {"weight": q, "weight_scale": scales}

    def apply(
        self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        return scaled_product(x, layer.weight, layer.weight_scale, bias)


FP8 = Fp8OnLoad()
