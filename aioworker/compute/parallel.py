"""Tensor-parallel context: which shard this rank holds, and the collectives that join shards."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Shard:
    """The contiguous slice [start, start + size) of a dimension that one rank holds."""

    start: int
    size: int


@dataclass(frozen=True)
class TensorParallel:
    rank: int = 0
    size: int = 1

    @property
    def is_driver(self) -> bool:
        return self.rank == 0

    def partition(self, total: int, what: str, unit: int = 1) -> Shard:
        """This rank's slice of a dimension, in whole `unit`s (e.g. heads), as even as possible:
        9 heads over 2 ranks give 5 and 4. Uneven splits keep models whose head counts do not
        divide by the rank count servable."""
        num_units = total // unit
        base, extra = divmod(num_units, self.size)
        if base == 0:
            raise ValueError(
                f"{what} ({num_units}) is fewer than the tensor-parallel size {self.size}"
            )
        start = self.rank * base + min(self.rank, extra)
        count = base + (1 if self.rank < extra else 0)
        return Shard(start * unit, count * unit)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.size > 1:
            dist.all_reduce(x)
        return x

    def gather_last_dim(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate each rank's slice of the last dimension, on every rank."""
        if self.size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=-1)


SINGLE = TensorParallel()


def init_tensor_parallel(rank: int, size: int, init_method: str, backend: str) -> TensorParallel:
    """Join the group's torch.distributed process group (gloo on CPU, NCCL on GPU)."""
    if size > 1 and not dist.is_initialized():
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=size)
    return TensorParallel(rank=rank, size=size)
