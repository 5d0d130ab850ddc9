"""Weights fetched into L2 ahead of the products that read them (device.l2_ahead_mb).

At a few sequences a decode step's attention reads little (each sequence's KV cache of the
layer, a few MB) and is bound by latency, so DRAM idles for its few microseconds while every
product after it is bound by reading its weights. So each layer's decode attention kernel also
asks the bulk copy engine to fetch into L2 the weights the next products read, in the order they
read them (this layer's o projection, gate/up and down, then the next layer's qkv) until a byte
budget is spent; an H100's or H200's L2 holds 50 MB. Those products then read what is already
there, or on its way.

A layer's table is int64 [slots, 2]: (address, bytes), each slot one bulk prefetch, shared
among the attention's programs. Addresses are taken when the decode graphs are captured and the
tables dropped with them: weights change place only where graphs are captured again (resume);
updates copy in place.
"""

from __future__ import annotations

import torch
from torch import nn

SLOT_BYTES = 256 * 1024  # one bulk prefetch: a program's share at a batch of one is ~10 of these
# Decode batches up to this many sequences fetch ahead. Beyond, attention reads enough KV cache
# to keep DRAM busy itself, and the products' reads are shared by more rows.
MAX_BATCH = 8


def decode_reads(linear: nn.Module) -> list[torch.Tensor]:
    """The tensors a linear layer's decode product reads: its kernels' operands where its method
    multiplies small batches with our kernels (gemv/method.py's SmallRows), else its weight."""
    operands = getattr(getattr(linear, "linear_method", None), "operands", None)
    if operands is None:
        weight = getattr(linear, "weight", None)
        return [weight] if isinstance(weight, torch.Tensor) else []
    read = operands(linear)
    main = read.int4_blocks if read.int4_blocks is not None else read.weight
    extra = [read.scale, *(read.int4_groups or ())]
    return [main, *(t for t in extra if t is not None)]


def byte_span(tensor: torch.Tensor) -> tuple[int, int]:
    """(first byte, bytes) of the memory a tensor spans, strided or not, widened to multiples
    of 16 (a bulk prefetch's alignment). (0, 0) for an empty tensor."""
    if tensor.numel() == 0:
        return 0, 0
    extent = 1 + sum(
        (size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride(), strict=True)
    )
    first = tensor.data_ptr() // 16 * 16
    end = -(-(tensor.data_ptr() + extent * tensor.element_size()) // 16) * 16
    return first, end - first


def slots(tensors: list[torch.Tensor], budget: int) -> list[tuple[int, int]]:
    """The tensors' spans, in order, cut into slots of at most SLOT_BYTES, until `budget` bytes
    (a multiple of 16) are spent; the last span taken may be cut short."""
    taken: list[tuple[int, int]] = []
    for tensor in tensors:
        first, size = byte_span(tensor)
        size = min(size, budget)
        budget -= size
        taken += [(first + at, min(SLOT_BYTES, size - at)) for at in range(0, size, SLOT_BYTES)]
        if budget <= 0:
            break
    return taken


def read_after_attention(layers: nn.ModuleList, index: int) -> list[nn.Module]:
    """The linear layers a decode step multiplies through after layer `index`'s attention, in
    order: its o projection, its MLP's gate/up and down (routed experts: none, they depend on the
    router), the next layer's qkv."""
    layer = layers[index]
    following = [layer.self_attn.o_proj]
    following += [getattr(layer.mlp, name, None) for name in ("gate_up_proj", "down_proj")]
    if index + 1 < len(layers):
        following.append(layers[index + 1].self_attn.qkv_proj)
    return [linear for linear in following if linear is not None]


def bind(model: nn.Module, budget_bytes: int, device_type: str = "cuda") -> int:
    """Give each decoder layer's attention its table (`l2_ahead`) of the weights held on
    `device_type`; returns how many got one. A model without Llama-style decoder layers
    (model.model.layers) gets none."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if budget_bytes <= 0 or layers is None:
        return 0
    bound = 0
    for index, layer in enumerate(layers):
        linears = read_after_attention(layers, index)
        tensors = [t for linear in linears for t in decode_reads(linear)]
        tensors = [t for t in tensors if t.device.type == device_type]
        table = slots(tensors, budget_bytes // 16 * 16)
        attention = layer.self_attn
        attention.l2_ahead = None
        if table:
            attention.l2_ahead = torch.tensor(table, dtype=torch.int64, device=tensors[0].device)
            bound += 1
    return bound


def unbind(model: nn.Module) -> None:
    """Drop the tables (their addresses may go stale once the graphs are dropped)."""
    for attention in model.attention_layers():
        attention.l2_ahead = None
