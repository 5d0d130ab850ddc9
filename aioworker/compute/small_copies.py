"""Small host values (indices, per-row settings) onto the device without making the host wait."""

from __future__ import annotations

import torch


def to_device(device: torch.device, values, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A small tensor on `device` without blocking the host: a pageable copy would wait for
    the steps already queued on the stream, and the next step is launched behind this one."""
    tensor = torch.as_tensor(values, dtype=dtype)
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor


def pinned_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A copy to pinned host memory, queued behind the stream's work (read it after an event)."""
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    host.copy_(tensor, non_blocking=True)
    return host
