"""A linear method that multiplies decode's few rows (1 to MAX_ROWS) with the small-rows kernels
and leaves every other product (prefill, large batches) to the method it wraps.

It holds and loads weights exactly as the wrapped method does, so checkpoints, weights updates,
release and resume, and tensor-parallel shards are unchanged: only `apply` differs. A format
says where its kernel operands are (`OPERANDS`); formats without an entry are not wrapped.

`apply_gated` is the MLP's gate/up product with silu(gate) * up fused into it; `apply_normed`
takes a product's input before the layer's residual add and RMSNorm and does them in its kernel
(with `fuse_norm`). With `norm_finish`, `apply_then_norm` does half of the residual add and
RMSNorm after a product in its finish, and `apply_prenormed` the rest in the next product's
(PreNormed), so that the norm launches no kernel.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from aioworker.compute.layers.cpu_packing import CpuPacked
from aioworker.compute.layers.gemv.add_norm_input import (
    NORMED_DTYPES,
    AddNorm,
    NormOut,
    PreNormed,
)
from aioworker.compute.layers.gemv.choice import tiles_for
from aioworker.compute.layers.gemv.tiles import MAX_ROWS, Tiles
from aioworker.compute.layers.linear_method import LinearMethod, Unquantized
from aioworker.compute.layers.norm import RMSNorm
from aioworker.compute.layers.ops import silu_and_mul
from aioworker.compute.layers.quantized.checkpoint_int4 import Int4Checkpoint
from aioworker.compute.layers.quantized.fp8 import Fp8OnLoad
from aioworker.compute.layers.quantized.head_copy import QuantizedCopy
from aioworker.compute.layers.quantized.weight_only import Int4OnLoad, Int8OnLoad


@dataclass(frozen=True)
class KernelOperands:
    """What the kernels read for one layer: its weight as stored, its per-output-channel scale,
    and for int4 its per-group (scales, offsets) and, where derived, its blocks layout (the
    one-row kernel's: int4_blocks.py)."""

    weight: torch.Tensor
    scale: torch.Tensor | None = None
    int4_groups: tuple[torch.Tensor, torch.Tensor] | None = None
    int4_blocks: torch.Tensor | None = None


# By the method's exact class: a subclass may hold its weights otherwise (the CPU's weight-only
# formats keep a dense weight beside their quantized one).
OPERANDS: dict[type, Callable[[nn.Module], KernelOperands]] = {
    Unquantized: lambda layer: KernelOperands(layer.weight),
    CpuPacked: lambda layer: KernelOperands(layer.weight),
    Fp8OnLoad: lambda layer: KernelOperands(layer.weight, layer.weight_scale),
    Int8OnLoad: lambda layer: KernelOperands(layer.weight, layer.weight_scale),
    Int4OnLoad: lambda layer: KernelOperands(
        layer.weight,
        None,
        (layer.weight_scale, layer.weight_offset),
        getattr(layer, "int4_blocks", None),
    ),
    # The checkpoint's int32 words as loaded; scales and offsets read in place from the
    # [G, N, 2] tensor derived for torch's kernel (w = (q - 8) s + o, o = -z s).
    Int4Checkpoint: lambda layer: KernelOperands(
        layer.weight_packed,
        None,
        (layer.int4_scales_and_offsets[..., 0].t(), layer.int4_scales_and_offsets[..., 1].t()),
        getattr(layer, "int4_blocks", None),
    ),
}
ACTIVATION_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _operands_of(method: LinearMethod) -> Callable[[nn.Module], KernelOperands]:
    """What the kernels read of a layer of this method: for an LM head's quantized copy, the
    copy's operands as its format holds them."""
    if isinstance(method, QuantizedCopy):
        of_format = OPERANDS[type(method.format)]
        return lambda layer: of_format(method.copy_of(layer))
    return OPERANDS[type(method)]


# Set by tests (with TRITON_INTERPRET=1 set before Triton is imported) to run the kernels whole
# on the CPU. Not the environment variable alone: a test process that sets it for a few tests
# would send every CPU engine after them through the interpreter.
INTERPRET_ON_CPU = False


def kernel_devices() -> tuple[str, ...]:
    """Where the kernels run: CUDA, and CPU tensors too where tests ask for Triton's interpreter
    (INTERPRET_ON_CPU)."""
    interpreted = INTERPRET_ON_CPU and os.environ.get("TRITON_INTERPRET") == "1"
    return ("cuda", "cpu") if interpreted else ("cuda",)


class SmallRows:
    def __init__(
        self,
        inner: LinearMethod,
        fuse_norm: bool = False,
        norm_finish: bool = False,
        early_loads: bool = False,
    ) -> None:
        self.inner = inner
        self.fuse_norm = fuse_norm
        self.norm_finish = norm_finish
        self.early_loads = early_loads
        self.name = inner.name
        # What the loader asks of a format: checkpoint tensors it leaves unread.
        self.ignored_suffixes = getattr(inner, "ignored_suffixes", ())
        self.operands = _operands_of(inner)
        self.devices = kernel_devices()
        self.fitted: dict[tuple, Tiles] = {}  # the tiling with stages that fit, by key below

    def create_weights(self, layer: nn.Module, out_features: int, in_features: int) -> None:
        self.inner.create_weights(layer, out_features, in_features)

    def process_after_loading(self, layer: nn.Module) -> None:
        self.inner.process_after_loading(layer)

    def drop_derived(self, layer: nn.Module) -> None:
        self.inner.drop_derived(layer)

    def fill_dummy(self, layer: nn.Module, fill: Callable[[torch.Tensor], None]) -> None:
        """Random weights (model.load_format 'dummy') as the wrapped format makes them. Without
        this the loader found no `fill_dummy` here and left a format's quantized weights as
        torch.empty had them: W4's wint8 and wint4 engines ran on NaN from the first layer."""
        fill_dummy = getattr(self.inner, "fill_dummy", None)
        if fill_dummy is not None:  # dense formats' parameters are filled directly
            fill_dummy(layer, fill)

    def weight_bytes(self, layer: nn.Module) -> int:
        return self.inner.weight_bytes(layer)

    def _takes(self, x: torch.Tensor) -> bool:
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        on_device = x.device.type in self.devices and x.dtype in ACTIVATION_DTYPES
        return 1 <= rows <= MAX_ROWS and on_device

    def _product(
        self,
        layer: nn.Module,
        x: torch.Tensor,
        gated: bool,
        bias: torch.Tensor | None,
        add_norm: AddNorm | None = None,
        norm_out: NormOut | None = None,
        prenormed: PreNormed | None = None,
    ) -> torch.Tensor | PreNormed | None:
        """The kernels' product ([rows, N]; with norm_out, PreNormed), or None where they do
        not take it."""
        if not self._takes(x):
            return None
        operands = self.operands(layer)
        rows = x.reshape(-1, x.shape[-1])
        groups = operands.int4_groups
        int4_group = rows.shape[1] // groups[0].shape[1] if groups is not None else 0
        tiles = tiles_for(rows.shape[0], operands.weight, gated, int4_group)
        weight = operands.weight
        if tiles is not None and tiles.blocks:
            # The FMA blocks tiles take x as it is: with the norm to fuse, the caller norms
            # (a prenormed x is taken as it is).
            weight = operands.int4_blocks if add_norm is None or tiles.dot else None
        if tiles is None or weight is None:
            return None
        from triton.runtime.errors import OutOfResources

        from aioworker.compute.layers.gemv.product import small_rows_product

        # A tiling tuned for bf16 rows may need more shared memory than an SM has with float32
        # rows or the norm's extra operands: fewer pipeline stages, else torch's product.
        key = (tiles, x.dtype, gated, add_norm is not None, norm_out is not None)
        fitted = self.fitted.get(key)
        stages = dict.fromkeys((tiles.num_stages, 2, 1))
        tried = [fitted] if fitted else [dataclasses.replace(tiles, num_stages=s) for s in stages]
        for cut in tried:
            try:
                y = small_rows_product(rows.contiguous(), weight, cut, operands.scale,
                                       gated, bias, operands.int4_groups, add_norm, norm_out,
                                       prenormed, early_loads=self.early_loads)  # fmt: skip
            except OutOfResources:
                continue
            self.fitted[key] = cut
            return y
        return None

    def apply(
        self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        y = self._product(layer, x, False, bias)
        return self.inner.apply(layer, x, bias) if y is None else y.reshape(*x.shape[:-1], -1)

    def apply_then_norm(
        self, layer: nn.Module, x: torch.Tensor, residual: torch.Tensor, norm: RMSNorm
    ) -> PreNormed | None:
        """The product x W^T gone on into half of `norm`(product + residual) (NormOut); None
        where norm_finish is off or the kernels do not take it."""
        if not self.norm_finish or x.dtype not in NORMED_DTYPES or x.dim() != 2:
            return None
        residual = residual.contiguous()
        norm_out = NormOut(residual, norm.weight, norm.eps, torch.empty_like(residual))
        return self._product(layer, x, False, None, norm_out=norm_out)

    def apply_prenormed(self, layer: nn.Module, x: PreNormed, gated: bool) -> torch.Tensor | None:
        """The product of the norm that x's PreNormed finishes, gated where asked; None where
        the kernels do not take it."""
        return self._product(layer, x.x, gated, None if gated else layer.bias, prenormed=x)

    def apply_gated(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """silu(x gate^T) * (x up^T) for a layer holding [gate; up] and no bias."""
        y = self._product(layer, x, True, None)
        if y is None:
            return silu_and_mul(self.inner.apply(layer, x, None))
        return y.reshape(*x.shape[:-1], -1)

    def apply_normed(
        self,
        layer: nn.Module,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        norm: RMSNorm,
        gated: bool,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(the product of norm(x + residual), gated where asked, x + residual) in one kernel,
        x and residual [T, K]; None where the kernels do not take it (the caller adds and
        norms first)."""
        if not self.fuse_norm or x.dtype not in NORMED_DTYPES or x.dim() != 2:
            return None
        x = x.contiguous()
        residual = residual.contiguous() if residual is not None else None
        residual_out = torch.empty_like(x) if residual is not None else None
        add_norm = AddNorm(residual, norm.weight, norm.eps, residual_out)
        y = self._product(layer, x, gated, None if gated else layer.bias, add_norm)
        if y is None:
            return None
        return y, (x if residual_out is None else residual_out)


def small_rows(
    method: LinearMethod,
    fuse_norm: bool = False,
    norm_finish: bool = False,
    early_loads: bool = False,
) -> LinearMethod:
    """`method` wrapped where its format has small-rows kernels, else `method` itself.
    `fuse_norm`: its products may take the residual add and RMSNorm before them
    (`apply_normed`); `norm_finish`: split it between the products around it
    (`apply_then_norm`, `apply_prenormed`); `early_loads`: device.early_epilogue_loads."""
    inner = method.format if isinstance(method, QuantizedCopy) else method
    if type(inner) not in OPERANDS:
        return method
    return SmallRows(method, fuse_norm, norm_finish, early_loads)
