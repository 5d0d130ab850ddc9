"""Tensor-parallel context: which shard this rank holds, and the collectives that join shards."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class TensorParallel:
    rank: int = 0
    size: int = 1

    @property
    def is_driver(self) -> bool:
        return self.rank == 0

    def shard(self, total: int, what: str) -> int:
        """The size of this rank's slice of a dimension of `total`, which must divide evenly."""
        if total % self.size:
            raise ValueError(
                f"{what} ({total}) is not divisible by the tensor-parallel size {self.size}"
            )
        return total // self.size

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
