"""Arrival counts for kernels whose last program to finish completes the work (a product's split
K folded, gemv/product.py): each program adds one to its count by an atomic, and the last sets
it back to zero. One zeroed int32 buffer per device, shared by every such kernel: a device's
kernels of a step run one at a time, in stream order (the executor's stream, or the graph
replaying them; with PDL each waits for the one before it to finish before it touches memory),
so every count is zero again when the next kernel starts."""

from __future__ import annotations

import torch

MAX_COUNTS = 1 << 14
_counts: dict[torch.device, torch.Tensor] = {}


def arrival_counts(device: torch.device) -> torch.Tensor:
    """The device's MAX_COUNTS counts, all zero between kernels."""
    if device not in _counts:
        _counts[device] = torch.zeros(MAX_COUNTS, dtype=torch.int32, device=device)
    return _counts[device]
