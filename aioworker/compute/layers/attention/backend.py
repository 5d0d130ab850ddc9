"""What an attention backend is to the model and the runners: the typed seam every backend
(torch, Triton, xformers) fills. A model's attention layer calls `prepare_qkv` then `forward`
with the step's metadata, whose shape only the backend and the runner that builds it agree on.
A backend may also have `attend` (same arguments as both together), which does the whole of a
step's attention in fewer launches where it can and returns None where it cannot."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch


@runtime_checkable
class AttentionBackend(Protocol):
    name: str
    # Whether its decode path may be captured in CUDA graphs (every op graph-safe).
    supports_graphs: bool

    def prepare_qkv(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        q_norm: torch.nn.Module | None,
        k_norm: torch.nn.Module | None,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Norms and rotary on q and k, and this step's k and v written to the cache."""
        ...

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: Any,
        scale: float,
    ) -> torch.Tensor:
        """Attention output [T, Hq, D] for the step's token rows."""
        ...
