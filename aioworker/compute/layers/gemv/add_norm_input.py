"""What a small-rows product takes to do its input's residual add and RMSNorm itself
(add_norm.py), kept apart from the kernels so that the linear method imports no Triton."""

from __future__ import annotations

from dataclasses import dataclass

import torch

NORMED_DTYPES = (torch.bfloat16, torch.float32)  # not fp16: add_norm.py says why


@dataclass(frozen=True)
class AddNorm:
    """The product multiplies rms_norm(x + residual) * weight, not x (add_norm.py), and writes
    x + residual to `residual_out` (no residual: x is the sum, and nothing is written).
    residual and residual_out are laid out as x."""

    residual: torch.Tensor | None
    weight: torch.Tensor
    eps: float
    residual_out: torch.Tensor | None = None
