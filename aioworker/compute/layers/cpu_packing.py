"""oneDNN-packed weights for linear layers on the CPU.

On the CPU, torch's default GEMM (MKL) runs the skinny matmuls of decoding at a fraction of what
oneDNN reaches with weights reordered once into its blocked layout (measured on a 2-core EPYC:
2.4x at 16 rows, 2.5x at one row, fp32; see docs/benchmarks.md). The dense weight stays the source
of truth for loading; the packed copy is made after loading (a LinearMethod, linear_method.py)
and used by `forward`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from aioworker.compute.layers.linear_method import Unquantized

# oneDNN picks its blocking for this many rows; measured fastest from 1 to 256 rows.
_BATCH_HINT = 64


def is_available(device: torch.device) -> bool:
    return device.type == "cpu" and torch.backends.mkldnn.is_available()


def pack(weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), _BATCH_HINT)


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


class CpuPacked(Unquantized):
    """The dense weight, and after loading a packed copy that `apply` multiplies by (the
    dense one stays the source of truth for loading and updates)."""

    name = "cpu-packed"

    def process_after_loading(self, layer: nn.Module) -> None:
        layer.packed_weight = pack(layer.weight)

    def drop_derived(self, layer: nn.Module) -> None:
        layer.packed_weight = None

    def apply(
        self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        packed = getattr(layer, "packed_weight", None)
        if packed is None:  # not loaded yet, or released
            return F.linear(x, layer.weight, bias)
        return packed_linear(x, packed, bias)


CPU_PACKED = CpuPacked()
