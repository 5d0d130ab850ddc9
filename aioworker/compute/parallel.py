"""Tensor-parallel context: which shard this rank holds, and the collectives that join shards."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from urllib.parse import urlsplit

import torch
import torch.distributed as dist
from torch.distributed.constants import default_pg_nccl_timeout, default_pg_timeout


@dataclass(frozen=True)
class Shard:
    """The contiguous slice [start, start + size) of a dimension that one rank holds."""

    start: int
    size: int


@dataclass(frozen=True)
class TensorParallel:
    rank: int = 0
    size: int = 1
    # MoE layers: 1 splits each expert across the group (as a dense MLP); the group's size gives
    # each rank whole experts (layers/moe/experts.py).
    expert_parallel_size: int = 1

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

    def all_to_all(self, x: torch.Tensor) -> torch.Tensor:
        """x: [size, ...]: slice r goes to rank r; returns what each rank sent here, by rank."""
        if self.size == 1:
            return x
        received = torch.empty_like(x)
        dist.all_to_all_single(received, x.contiguous())
        return received

    def gather_last_dim(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate each rank's slice of the last dimension, on every rank."""
        if self.size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=-1)


SINGLE = TensorParallel()


def init_tensor_parallel(
    rank: int, size: int, init_method: str, backend: str, listen_fd: int | None = None
) -> TensorParallel:
    """Join the group's torch.distributed process group (gloo on CPU, NCCL on GPU), meeting at
    `init_method` (tcp://host:port). Rank 0 serves the rendezvous on `listen_fd` when given: a
    socket bound to that host and listening, which the store then owns. Without one, torch's own
    server listens on every interface (`*:port`), opening the rendezvous to any machine that can
    reach the port, even with a loopback host; this folder touches no socket, so the caller (the
    one that binds the group's other endpoints) makes it."""
    if size > 1 and not dist.is_initialized():
        # The timeout torch gives a tcp:// rendezvous of this backend.
        nccl = backend == "nccl" and default_pg_nccl_timeout is not None
        timeout = default_pg_nccl_timeout if nccl else default_pg_timeout
        store = rendezvous_store(init_method, rank, size, timeout, listen_fd)
        dist.init_process_group(backend, store=store, rank=rank, world_size=size)
    return TensorParallel(rank=rank, size=size)


def rendezvous_store(
    init_method: str, rank: int, size: int, timeout: timedelta, listen_fd: int | None = None
) -> dist.TCPStore:
    """The group's key-value store at `init_method`; rank 0 serves it (on `listen_fd` if given)."""
    address = urlsplit(init_method)
    if address.scheme != "tcp" or address.hostname is None or address.port is None:
        raise ValueError(f"rendezvous address {init_method!r} is not tcp://host:port")
    return dist.TCPStore(
        address.hostname,
        address.port,
        size,
        is_master=rank == 0,
        timeout=timeout,
        master_listen_fd=listen_fd if rank == 0 else None,
    )
