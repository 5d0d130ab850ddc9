"""oneDNN-packed weights for linear layers on the CPU.

On the CPU, torch's default GEMM (MKL) runs the skinny matmuls of decoding at a fraction of what
oneDNN reaches with weights reordered once into its blocked layout (measured on a 2-core EPYC:
2.4x at 16 rows, 2.5x at one row, fp32; see docs/benchmarks.md). The dense weight stays the source
of truth for loading; the packed copy is made after loading and used by `forward`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# oneDNN picks its blocking for this many rows; measured fastest from 1 to 256 rows.
_BATCH_HINT = 64


def is_available(device: torch.device) -> bool:
    return device.type == "cpu" and torch.backends.mkldnn.is_available()


def pack(weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), _BATCH_HINT)


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def pack_model(model: nn.Module) -> int:
    """Give every layer that supports it a packed copy of its weight; returns how many."""
    layers = [m for m in model.modules() if hasattr(m, "pack_for_cpu")]
    for layer in layers:
        layer.pack_for_cpu()
    return len(layers)


class PackableLinear:
    """Mixin for modules with a `weight` [out, in]: `matmul` uses the packed copy once there is one."""

    weight: torch.Tensor
    packed_weight: torch.Tensor | None = None

    def pack_for_cpu(self) -> None:
        self.packed_weight = pack(self.weight)

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if self.packed_weight is not None:
            return packed_linear(x, self.packed_weight, bias)
        return F.linear(x, self.weight, bias)
