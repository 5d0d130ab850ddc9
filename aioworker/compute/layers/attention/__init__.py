"""Attention backends over the paged KV cache. `torch` is the CPU path and the reference."""

from __future__ import annotations

from typing import Any

from aioworker.compute.layers.attention.backend import AttentionBackend
from aioworker.compute.layers.attention.torch_backend import TorchAttentionBackend

__all__ = ["AttentionBackend", "AttentionContext", "TorchAttentionBackend", "select_cuda_backend"]


def select_cuda_backend(
    name: str,
    block_size: int,
    rope_in_decode: bool = False,
    decode_warps: int = 4,
) -> AttentionBackend:
    """`auto` and `triton`: our Triton paged decode (`rope_in_decode`: a decode step's norms,
    rotary and cache write inside it; `decode_warps`: its programs' warps); `xformers`:
    xformers' paged decode kernel. Both prefill through FlashAttention-2's varlen kernel."""
    if name in ("auto", "triton"):
        from aioworker.compute.layers.attention.cuda_backend import CudaAttentionBackend

        return CudaAttentionBackend(block_size, rope_in_decode, decode_warps)
    if name == "xformers":
        from aioworker.compute.layers.attention.xformers_backend import XformersAttentionBackend

        return XformersAttentionBackend(block_size)
    raise ValueError(
        f"attention backend {name!r} does not run on CUDA; use auto, triton or xformers"
    )


class AttentionContext:
    """What every attention layer needs for one step: the backend and this step's metadata."""

    __slots__ = ("backend", "metadata")

    def __init__(self, backend: AttentionBackend, metadata: Any) -> None:
        self.backend = backend
        self.metadata = metadata
