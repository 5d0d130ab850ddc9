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


@dataclass(frozen=True)
class NormOut:
    """A product (o, down) whose output goes straight into a residual add and RMSNorm
    (device.norms_in_product_finish): its finish adds `residual`, writes the sum h to
    `residual_out`, and gives the next product h * weight with each program's sums of squares of
    h (PreNormed), so that the norm launches no kernel of its own."""

    residual: torch.Tensor
    weight: torch.Tensor
    eps: float
    residual_out: torch.Tensor


@dataclass(frozen=True)
class PreNormed:
    """A row whose residual add and RMSNorm the product before it half did (NormOut): x = h * n
    rounded to the activation dtype, h = the residual stream, squares: [slots, rows] float32,
    each slot one program's sums of h^2 over its channels. norm(h) = (h * n) / rms(h), and
    1 / rms(h) factors out of a product's sum over K (add_norm.py), so the next product
    multiplies x and scales its sums by it. `weight` and `eps` say whose norm it is."""

    x: torch.Tensor
    h: torch.Tensor
    squares: torch.Tensor
    weight: torch.Tensor
    eps: float
