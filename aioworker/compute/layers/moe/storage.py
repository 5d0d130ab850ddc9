"""How experts' weights are held: dense in the model's dtype, or quantized while loading to int8
(model.quantization "wint8") or fp8 e4m3 ("fp8") with one float32 scale per output channel of
each expert, the formats of issue 15's linear methods, read by the same MoE layer."""

from __future__ import annotations

import torch

from aioworker.compute.layers.quantized.fp8 import E4M3, quantize_rows

# model.quantization -> the experts' stored dtype (None: dense).
FORMATS: dict[str, torch.dtype | None] = {"none": None, "wint8": torch.int8, "fp8": E4M3}


def quantize_int8_rows(dense: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 values, float32 scale per row): w ~ q * s, s = max|row| / 127."""
    w = dense.float()
    scales = (w.abs().amax(dim=-1) / 127).clamp_min(1e-12)
    return torch.round(w / scales[..., None]).clamp(-127, 127).to(torch.int8), scales


class ExpertStorage:
    """One format's parameters and how a dense slice of a checkpoint tensor is stored in them."""

    def __init__(self, quantized_dtype: torch.dtype | None) -> None:
        self.quantized_dtype = quantized_dtype

    @property
    def is_quantized(self) -> bool:
        return self.quantized_dtype is not None

    def weight(self, *shape: int) -> torch.Tensor:
        return torch.empty(*shape, dtype=self.quantized_dtype)

    def scale(self, *shape: int) -> torch.Tensor | None:
        return torch.ones(*shape, dtype=torch.float32) if self.is_quantized else None

    def quantize(self, dense: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Dense rows [..., N, K] -> (stored values, scales [..., N] or None)."""
        if self.quantized_dtype is None:
            return dense, None
        if self.quantized_dtype is torch.int8:
            return quantize_int8_rows(dense)
        return quantize_rows(dense.float())

    def store(self, kind: str, target: torch.Tensor, dense: torch.Tensor) -> None:
        """Write `dense` rows' `kind` ("weight" or "scale") into `target`."""
        values, scales = self.quantize(dense)
        source = values if kind == "weight" else scales
        if tuple(source.shape) != tuple(target.shape):
            raise ValueError(
                f"checkpoint slice has shape {tuple(dense.shape)}, expected {tuple(target.shape)}"
            )
        target.copy_(source)
