"""How a checkpoint tensor becomes a linear layer's parameter: the layout the layer slices it by
for its tensor-parallel shard, and what is stored for the slice.

A dense weight is sliced row by row (column-parallel) or column by column (row-parallel) and
copied. Quantized formats differ on both counts, and a parameter says how through its
`ParamLoading`:
- its checkpoint tensor may pack several logical rows or columns into one (`out_block`,
  `in_block`: int4 packs 8 columns into an int32; a group scale covers 128 columns; a block
  scale covers 128 x 128); `in_block` 0 means the tensor is not split along the input (a
  per-channel scale of a row-parallel layer);
- `expand` reshapes the tensor before slicing (a per-tensor scale becomes one per row);
- `store` writes the slice: a copy, or, for weights quantized while loading, the quantized
  values (or their scales) of the dense slice;
- `load_dtype` is what the checkpoint tensor is cast to first (the dense dtype for a weight
  quantized on load, whose parameter holds int8 or fp8);
- `derived` names sibling parameters filled from the same checkpoint tensor (a weight quantized
  on load and its scales: the checkpoint names only the weight).

Shard starts must fall on block boundaries; a shard that does not gets an error naming the
layer's size and the block, not a silently wrong slice.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


def copy_slice(target: torch.Tensor, local: torch.Tensor) -> None:
    if target.shape != local.shape:
        raise ValueError(
            f"checkpoint slice has shape {tuple(local.shape)}, expected {tuple(target.shape)}"
        )
    target.copy_(local)


@dataclass(frozen=True)
class ParamLoading:
    out_block: int = 1
    in_block: int = 1
    store: Callable[[torch.Tensor, torch.Tensor], None] = copy_slice
    expand: Callable[[torch.Tensor, int], torch.Tensor] | None = None
    load_dtype: torch.dtype | None = None
    derived: tuple[str, ...] = ()


PLAIN = ParamLoading()


def loading_of(param: torch.Tensor) -> ParamLoading:
    return getattr(param, "loading", PLAIN)


def blocks(start: int, size: int, total: int, block: int, what: str) -> tuple[int, int]:
    """(first block, number of blocks) of the rows [start, start + size) of `total`, in units of
    `block` rows; the last block of `total` may be partial."""
    if block == 1:
        return start, size
    end = start + size
    if start % block or (end % block and end != total):
        raise ValueError(
            f"a tensor-parallel shard of {what} [{start}, {end}) of {total} does not fall on "
            f"the format's blocks of {block}; use a tensor-parallel size whose shards are "
            f"multiples of {block}"
        )
    return start // block, -(-end // block) - start // block
