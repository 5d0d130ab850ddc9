"""A split-K product's partial sums, not yet added (device.norm_adds_split_sums).

The small-rows kernels split K over several programs for the o and down products, and a second
kernel (finish.reduce_kernel) adds the splits' float32 partial sums. Both products feed a
residual add and RMSNorm, itself a kernel of its own. So where the caller says its product goes
straight into that norm, the product hands back its partial sums instead and the norm's kernel
adds them (sums_norm.py): one launch fewer a product, with the same roundings, hence the same
values. Anything else that meets them calls `summed()` for the tensor.

No Triton here: the model's code checks for this type on every device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SplitSums:
    """partial: [splits, rows, N] float32, one slice per split of K; scale: [N] per-channel
    scale or None; bias: [N] or None; dtype: the product's output dtype. The product's output
    is the slices' sum, scaled, biased and rounded to dtype, as reduce_kernel computes it."""

    partial: torch.Tensor
    scale: torch.Tensor | None
    bias: torch.Tensor | None
    dtype: torch.dtype

    @property
    def shape(self) -> tuple[int, int]:
        return self.partial.shape[1], self.partial.shape[2]

    def summed(self) -> torch.Tensor:
        """The product's output [rows, N], added by reduce_kernel."""
        from aioworker.compute.layers.gemv.sums_norm import sum_splits

        return sum_splits(self)
