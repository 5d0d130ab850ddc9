"""Attention backends over the paged KV cache. `torch` is the CPU path and the reference."""

from __future__ import annotations

from typing import Any

from aioworker.compute.layers.attention.backend import AttentionBackend
from aioworker.compute.layers.attention.torch_backend import TorchAttentionBackend
from aioworker.config import DeviceOptions

__all__ = ["AttentionBackend", "AttentionContext", "TorchAttentionBackend", "select_cuda_backend"]


def select_cuda_backend(options: DeviceOptions, block_size: int) -> AttentionBackend:
    """The CUDA backend `options.attention_backend` names. `auto` and `triton`: our Triton paged
    decode, built as the device.decode_attention_* settings say (fused_rope_attention: a decode
    step's norms, rotary and cache write inside it); `xformers`: xformers' paged decode kernel.
    Both prefill through FlashAttention-2's varlen kernel."""
    name = options.attention_backend
    if name in ("auto", "triton"):
        from aioworker.compute.layers.attention.cuda_backend import CudaAttentionBackend
        from aioworker.compute.layers.attention.triton_decode import DecodeBuild

        build = DecodeBuild(
            warps=options.decode_attention_warps,
            stages=options.decode_attention_stages or None,
            tile=options.decode_attention_tile,
        )
        return CudaAttentionBackend(
            block_size,
            options.fused_rope_attention,
            build,
            tile_128_from_programs=options.decode_attention_tile_128_from_programs,
        )
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
