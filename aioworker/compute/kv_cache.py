"""KV cache tensors: per layer, one K and one V tensor of the shape the attention backend reads
(by default [num_blocks, block_size, num_kv_heads, head_dim], the layout of the GPU kernels)."""

from __future__ import annotations

from collections.abc import Callable

import torch


def bytes_per_block(attention_layers: list, block_size: int, dtype: torch.dtype) -> int:
    """One block's K and V in every layer given (a separate draft's layers count too)."""
    element_size = torch.empty(0, dtype=dtype).element_size()
    per_token = sum(2 * layer.num_kv_heads * layer.head_dim for layer in attention_layers)
    return block_size * per_token * element_size


def num_blocks_for_bytes(budget_bytes: int, block_bytes: int) -> int:
    return max(0, budget_bytes // block_bytes)


def token_major_shape(
    num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int
) -> tuple[int, ...]:
    return (num_blocks, block_size, num_kv_heads, head_dim)


def allocate_kv_cache(
    attention_layers: list,
    num_blocks: int,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device,
    shape_of: Callable[[int, int, int, int], tuple[int, ...]] = token_major_shape,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Allocate one K and one V tensor per attention layer and bind them to the layer;
    `shape_of(num_blocks, block_size, num_kv_heads, head_dim)` is the backend's layout."""
    caches = []
    for layer in attention_layers:
        shape = shape_of(num_blocks, block_size, layer.num_kv_heads, layer.head_dim)
        k_cache = torch.zeros(shape, dtype=dtype, device=device)
        v_cache = torch.zeros(shape, dtype=dtype, device=device)
        layer.k_cache, layer.v_cache = k_cache, v_cache
        caches.append((k_cache, v_cache))
    return caches
