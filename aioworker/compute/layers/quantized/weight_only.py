"""Weight-only int8 and int4 whose parameters are the quantized values (model.quantization
"wint8" / "wint4" on a GPU; the CPU keeps its dense copy for prefill, layers/weight_only.py).

- int8: one scale per output channel, as on the CPU; `torch._weight_int8pack_mm`.
- int4: asymmetric groups of 32 inputs by default (layers/weight_only.py says why 32;
  model.int4_group: 64 or 128), w ~ (q - 8) s + z as torch's tinygemm has it. Stored plainly,
  two values a byte ([N, K / 2], high nibble first) with scales and offsets [N, K / G], so a
  shard's rows load and stage anywhere; after loading, the kernels' own layouts are derived
  (tinygemm's tiles on CUDA, the CPU kernel's on the CPU, and where the small-rows kernels run,
  their blocks layout: `pack_int4_blocks`).

Both kernels are built for a few rows. Past MAX_KERNEL_ROWS (prefill, large decode batches) the
weight is dequantized into a bfloat16 scratch and multiplied by the dense GEMM, which then costs
a write and a read of the dense weight on top of the product.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from aioworker.compute.layers import weight_only as cpu
from aioworker.compute.layers.gemv.tiles import INT4_BLOCK
from aioworker.compute.layers.quantized.on_load import (
    QuantizedOnLoad,
    finish,
    kernel_rows,
    refresh,
)

KERNEL_DTYPE = torch.bfloat16
MAX_KERNEL_ROWS = 16


class Int8OnLoad(QuantizedOnLoad):
    name = "wint8"

    def shapes(self, out_features: int, in_features: int) -> dict[str, torch.Tensor]:
        return {
            "weight": torch.empty(out_features, in_features, dtype=torch.int8),
            "weight_scale": torch.empty(out_features, dtype=KERNEL_DTYPE),
        }

    def quantize(self, dense: torch.Tensor) -> dict[str, torch.Tensor]:
        q, scales = cpu.quantize_int8(dense)
        return {"weight": q, "weight_scale": scales.to(KERNEL_DTYPE)}

    def apply(
        self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        rows = kernel_rows(x).to(KERNEL_DTYPE)
        if len(rows) <= MAX_KERNEL_ROWS and not rows.is_cuda:
            y = torch._weight_int8pack_mm(rows, layer.weight, layer.weight_scale)
        else:  # CUDA's int8 kernel reads at 5% of bandwidth: 62 ms a token (docs/benchmarks.md)
            y = F.linear(rows, layer.weight.to(KERNEL_DTYPE)) * layer.weight_scale
        return finish(y, x, bias)


def quantize_int4_rows(
    w: torch.Tensor, group: int = cpu.INT4_GROUP
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(values [N, K / 2] uint8, scales [N, K / G], offsets [N, K / G])."""
    q, scales_and_zeros, _ = cpu.quantize_int4(w, group)
    sz = scales_and_zeros.transpose(0, 1)  # [N, K / G, 2]
    return pack_nibbles(q), sz[..., 0], sz[..., 1]


def pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    return (q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8)


def pack_int4_blocks(values: torch.Tensor) -> torch.Tensor:
    """[N, K] values 0..15 (K a multiple of 32) -> [N, K / 8] int32 in the small-rows kernel's
    blocks layout (gemv/int4_blocks.py says why): K in blocks of 32, four words a block, the
    value at k = 32 b + 4 i + u in word u of block b, at bits 4i+3 .. 4i+6 (mod 32: the word is
    rotated left by 3, so the kernels' first pair of values needs no rotation). Built one value
    place at a time: no temporary larger than the result."""
    rows, depth = values.shape
    if depth % INT4_BLOCK:
        raise ValueError(f"the int4 blocks layout takes K in blocks of {INT4_BLOCK}, not {depth}")
    places = values.reshape(rows, depth // INT4_BLOCK, 8, 4)  # [N, blocks, i, u]
    words = torch.zeros(rows, depth // INT4_BLOCK, 4, dtype=torch.int32, device=values.device)
    for i in range(8):  # int32 shifts wrap: the top value lands in the sign bit, as wanted
        words |= places[:, :, i, :].to(torch.int32) << (4 * i + BLOCKS_ROTATION) % 32
        if 4 * i + BLOCKS_ROTATION + 4 > 32:  # the value rotated across the word's end
            words |= places[:, :, i, :].to(torch.int32) >> (32 - 4 * i - BLOCKS_ROTATION)
    return words.reshape(rows, -1)


def unpack_int4_blocks(words: torch.Tensor) -> torch.Tensor:
    """The inverse of pack_int4_blocks: [N, K / 8] int32 -> [N, K] uint8 values 0..15."""
    rows = words.shape[0]
    bits = words.to(torch.int64) & 0xFFFFFFFF
    unrotated = (bits >> BLOCKS_ROTATION) | ((bits << (32 - BLOCKS_ROTATION)) & 0xFFFFFFFF)
    shifts = (4 * torch.arange(8, device=words.device)).reshape(1, 1, 8, 1)
    nibbles = (unrotated.reshape(rows, -1, 1, 4) >> shifts) & 0xF
    return nibbles.to(torch.uint8).reshape(rows, -1)


BLOCKS_ROTATION = 3  # each word rotated left by this many bits


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """[N, K / 2] uint8 -> [N, K] uint8 values 0..15."""
    return torch.stack([packed >> 4, packed & 0xF], dim=-1).reshape(packed.shape[0], -1)


def dequantize_int4_values(
    values: torch.Tensor,
    scales: torch.Tensor,
    offsets: torch.Tensor,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Values [N, K] in 0..15, scales and offsets [N, K / G] -> w = (q - 8) s + o."""
    q = values.to(dtype)
    group = q.shape[1] // scales.shape[1]
    grouped = q.reshape(q.shape[0], -1, group)
    w = (grouped - 8) * scales.to(dtype)[..., None] + offsets.to(dtype)[..., None]
    return w.reshape(q.shape)


def dequantize_int4_rows(
    packed: torch.Tensor,
    scales: torch.Tensor,
    offsets: torch.Tensor,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    return dequantize_int4_values(unpack_nibbles(packed), scales, offsets, dtype)


def _blocks_wanted(values: torch.Tensor) -> bool:
    """The small-rows kernels' blocks layout, where they run (`kernel_devices`: CUDA, and the
    CPU only where tests ask for Triton's interpreter; not because the environment variable is
    set, which a test process's CPU workers inherit). K must come in blocks of 32."""
    from aioworker.compute.layers.gemv.method import kernel_devices  # it imports this module

    return values.device.type in kernel_devices() and values.shape[1] % INT4_BLOCK == 0


def _inner_k_tiles(in_features: int) -> int:
    return next(t for t in (8, 4, 2) if in_features % (16 * t) == 0)


class Int4Kernels:
    """Products by int4 weights through torch's kernels, from a derived copy in the kernel's
    layout (`derive`); past MAX_KERNEL_ROWS, through the dense GEMM on the dequantized weight
    (`dequantized`, the method's own)."""

    def derive(
        self,
        layer: nn.Module,
        values: torch.Tensor,
        scales: torch.Tensor,
        offsets: torch.Tensor,
    ) -> None:
        """`values` [N, K] 0..15, `scales` and `offsets` [N, K / G]: w ~ (q - 8) s + z."""
        if values.is_cuda:
            tiled = torch._convert_weight_to_int4pack(
                pack_nibbles(values), _inner_k_tiles(values.shape[1])
            )
        else:
            tiled = torch._convert_weight_to_int4pack_for_cpu(values.to(torch.int32), 1)
        refresh(layer, "int4_tiled", tiled)
        if _blocks_wanted(values):
            refresh(layer, "int4_blocks", pack_int4_blocks(values))
        scales_and_offsets = torch.stack([scales, offsets], dim=-1).to(KERNEL_DTYPE)
        refresh(layer, "int4_scales_and_offsets", scales_and_offsets.transpose(0, 1).contiguous())
        layer.int4_group = values.shape[1] // scales.shape[1]

    def drop_derived(self, layer: nn.Module) -> None:
        layer.int4_tiled = layer.int4_scales_and_offsets = layer.int4_blocks = None

    def dequantized(self, layer: nn.Module, dtype: torch.dtype) -> torch.Tensor:
        raise NotImplementedError

    def apply(
        self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        rows = kernel_rows(x).to(KERNEL_DTYPE)
        if len(rows) <= MAX_KERNEL_ROWS:
            kernel = (
                torch._weight_int4pack_mm if rows.is_cuda else torch._weight_int4pack_mm_for_cpu
            )
            y = kernel(rows, layer.int4_tiled, layer.int4_group, layer.int4_scales_and_offsets)
        else:
            y = F.linear(rows, self.dequantized(layer, KERNEL_DTYPE))
        return finish(y, x, bias)


class Int4OnLoad(Int4Kernels, QuantizedOnLoad):
    name = "wint4"

    def __init__(self, group: int = cpu.INT4_GROUP) -> None:
        self.group = group

    def shapes(self, out_features: int, in_features: int) -> dict[str, torch.Tensor]:
        groups = in_features // cpu.int4_group(in_features, self.group)
        return {
            "weight": torch.empty(out_features, in_features // 2, dtype=torch.uint8),
            "weight_scale": torch.empty(out_features, groups, dtype=KERNEL_DTYPE),
            "weight_offset": torch.empty(out_features, groups, dtype=KERNEL_DTYPE),
        }

    def quantize(self, dense: torch.Tensor) -> dict[str, torch.Tensor]:
        packed, scales, offsets = quantize_int4_rows(dense, self.group)
        return {"weight": packed, "weight_scale": scales, "weight_offset": offsets}

    def process_after_loading(self, layer: nn.Module) -> None:
        values = unpack_nibbles(layer.weight.data)
        self.derive(layer, values, layer.weight_scale, layer.weight_offset)

    def dequantized(self, layer: nn.Module, dtype: torch.dtype) -> torch.Tensor:
        if layer.weight.is_cuda:
            from aioworker.compute.layers.quantized.triton_kernels import int4_dequantize

            return int4_dequantize(layer.weight, layer.weight_scale, layer.weight_offset, dtype)
        return dequantize_int4_rows(layer.weight, layer.weight_scale, layer.weight_offset, dtype)


WINT8_ON_LOAD = Int8OnLoad()
WINT4_ON_LOAD = Int4OnLoad()


@functools.cache
def wint4_on_load(group: int) -> Int4OnLoad:
    """The int4 method of `group` inputs a group (one instance a group: WINT4_ON_LOAD for 32)."""
    return WINT4_ON_LOAD if group == cpu.INT4_GROUP else Int4OnLoad(group)
