"""The elementwise steps of a decoder layer: fused Triton kernels on CUDA, plain torch elsewhere
(the CPU path, and the reference the fused kernels are tested against)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from aioworker.compute.layers.gemv.add_norm_input import PreNormed
from aioworker.compute.layers.norm import RMSNorm
from aioworker.compute.layers.rotary import apply_rotary


def add_rms_norm(
    norm: RMSNorm, x: torch.Tensor | PreNormed, residual: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm(x + residual), x + residual), or (norm(x), x) for the first layer. A PreNormed x
    holds the sum already (gemv/add_norm_input.py): (norm(x.h), x.h)."""
    if isinstance(x, PreNormed):
        x, residual = x.h, None
    if x.is_cuda:
        from aioworker.compute.layers import fused

        return fused.add_rms_norm(x, residual, norm.weight, norm.eps)
    if residual is not None:
        x = x + residual
    return norm(x), x


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    if gate_up.is_cuda:
        from aioworker.compute.layers import fused

        return fused.silu_and_mul(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def norm_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    rope: tuple[torch.Tensor, torch.Tensor],
    q_norm: RMSNorm | None,
    k_norm: RMSNorm | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-head RMSNorm (Qwen3) then rotary; q: [T, Hq, D], k: [T, Hkv, D]; rope: fp32 [T, D]."""
    cos, sin = rope
    if q.is_cuda:
        from aioworker.compute.layers import fused

        fused.norm_rope_(q, cos, sin, None if q_norm is None else q_norm.weight, _eps(q_norm))
        fused.norm_rope_(k, cos, sin, None if k_norm is None else k_norm.weight, _eps(k_norm))
        return q, k
    if q_norm is not None:
        q, k = q_norm(q), k_norm(k)
    return apply_rotary(q, k, cos, sin)


def _eps(norm: RMSNorm | None) -> float:
    return norm.eps if norm is not None else 0.0
