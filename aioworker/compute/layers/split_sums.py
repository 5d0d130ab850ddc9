"""A split-K product's partial sums, left for the kernel that reads the product next to add
(device.fused_reduce_norm).

A decode step's small-rows products split K where their N is too small to fill the GPU (the
8B's o and down products at one row, in 2 to 8 splits), and a second kernel adds the splits
(gemv/finish.py, `reduce_kernel`). The o and down products are read next by the residual add
and RMSNorm, which can add the splits themselves: one launch fewer each, twice a layer. The
norm adds, scales, biases and rounds them exactly as the reduce kernel does, so the values are
the same. Anything else that is handed one calls `reduce()`.

Torch only: the kernels load where `reduce()` or the norm runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SplitSums:
    partial: torch.Tensor  # float32 [splits, rows, channels]
    scale: torch.Tensor | None  # [channels]: the format's per-channel scale, or None
    bias: torch.Tensor | None  # [channels] or None
    dtype: torch.dtype  # the product's output dtype (its rows')

    @property
    def rows(self) -> int:
        return self.partial.shape[1]

    @property
    def channels(self) -> int:
        return self.partial.shape[2]

    def reduce(self) -> torch.Tensor:
        """The product itself, [rows, channels] in `dtype`: the reduce kernel the product would
        have launched."""
        from aioworker.compute.layers.gemv.product import reduce_split_sums

        return reduce_split_sums(self)


def as_tensor(x: torch.Tensor | SplitSums) -> torch.Tensor:
    return x.reduce() if isinstance(x, SplitSums) else x
