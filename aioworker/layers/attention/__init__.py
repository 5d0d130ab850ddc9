"""Attention backends over the paged KV cache. `torch` is the CPU path and the reference."""

from __future__ import annotations

from aioworker.layers.attention.torch_backend import TorchAttentionBackend

__all__ = ["TorchAttentionBackend", "select_backend"]


def select_backend(name: str, device_type: str, block_size: int, sliding_window: int | None):
    """Return the backend named in config; `auto` picks xformers on CUDA when it imports."""
    if name in ("auto", "torch") and (name == "torch" or device_type != "cuda"):
        return TorchAttentionBackend(block_size, sliding_window)
    raise ValueError(
        f"attention backend {name!r} is not available on {device_type}; use 'torch' or 'auto'"
    )


class AttentionContext:
    """What every attention layer needs for one step: the backend and this step's metadata."""

    __slots__ = ("backend", "metadata")

    def __init__(self, backend, metadata) -> None:
        self.backend = backend
        self.metadata = metadata
