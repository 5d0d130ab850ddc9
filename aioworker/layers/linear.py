"""Linear layers split across tensor-parallel ranks, each parameter carrying its own `weight_loader`.

Column-parallel layers split output features (no communication); row-parallel layers split input
features and all-reduce the partial sums. Merged layers (q/k/v, gate/up) hold several checkpoint
tensors in one matrix, so one matmul replaces several; the loader names the part by `shard_id`.
"""

from __future__ import annotations

import torch
from torch import nn

from aioworker.layers import cpu_packing
from aioworker.parallel import TensorParallel


def _parameter(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape), requires_grad=False)


def _check_shape(
    param: nn.Parameter, expected: tuple[int, ...], loaded: torch.Tensor, name: str
) -> None:
    if tuple(loaded.shape) != expected:
        raise ValueError(
            f"{name}: checkpoint tensor has shape {tuple(loaded.shape)}, expected {expected}"
        )


class ColumnParallelLinear(cpu_packing.PackableLinear, nn.Module):
    """y = x W^T with W's rows (output features) split across ranks."""

    def __init__(self, in_features: int, out_features: int, bias: bool, tp: TensorParallel) -> None:
        super().__init__()
        self.tp = tp
        self.out_per_rank = tp.shard(out_features, "output features")
        self.weight = _parameter(self.out_per_rank, in_features)
        self.weight.weight_loader = self.load_full
        self.bias = _parameter(self.out_per_rank) if bias else None
        if self.bias is not None:
            self.bias.weight_loader = self.load_full

    def load_full(self, param: nn.Parameter, loaded: torch.Tensor, name: str) -> None:
        per_rank = param.shape[0]
        _check_shape(param, (per_rank * self.tp.size, *param.shape[1:]), loaded, name)
        param.data.copy_(loaded.narrow(0, self.tp.rank * per_rank, per_rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.matmul(x, self.bias)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel outputs side by side, e.g. gate_proj and up_proj."""

    def __init__(
        self, in_features: int, part_sizes: list[int], bias: bool, tp: TensorParallel
    ) -> None:
        super().__init__(in_features, sum(part_sizes), bias, tp)
        self.part_sizes = part_sizes
        self.weight.weight_loader = self.load_part
        if self.bias is not None:
            self.bias.weight_loader = self.load_part

    def _part_range(self, shard_id: int) -> tuple[int, int]:
        offset = sum(self.part_sizes[:shard_id]) // self.tp.size
        return offset, self.part_sizes[shard_id] // self.tp.size

    def load_part(
        self, param: nn.Parameter, loaded: torch.Tensor, name: str, shard_id: int
    ) -> None:
        offset, size = self._part_range(shard_id)
        _check_shape(param, (size * self.tp.size, *param.shape[1:]), loaded, name)
        param.data.narrow(0, offset, size).copy_(loaded.narrow(0, self.tp.rank * size, size))


class QKVParallelLinear(MergedColumnParallelLinear):
    """q, k and v projections in one matrix; KV heads are replicated when there are fewer than ranks."""

    def __init__(
        self,
        hidden_size: int,
        head_dim: int,
        num_heads: int,
        num_kv_heads: int,
        bias: bool,
        tp: TensorParallel,
    ) -> None:
        self.num_heads = tp.shard(num_heads, "num_attention_heads")
        self.num_kv_heads = max(1, num_kv_heads // tp.size)
        if num_kv_heads >= tp.size:
            tp.shard(num_kv_heads, "num_key_value_heads")
        elif tp.size % num_kv_heads:
            raise ValueError(
                f"tensor-parallel size {tp.size} is not a multiple of num_key_value_heads {num_kv_heads}"
            )
        self.num_kv_heads_total = num_kv_heads
        self.head_dim = head_dim
        q_size, kv_size = self.num_heads * head_dim, self.num_kv_heads * head_dim
        parts = [q_size * tp.size, kv_size * tp.size, kv_size * tp.size]
        super().__init__(hidden_size, parts, bias, tp)

    def _part_range(self, shard_id: int) -> tuple[int, int]:
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        return [(0, q_size), (q_size, kv_size), (q_size + kv_size, kv_size)][shard_id]

    def load_part(
        self, param: nn.Parameter, loaded: torch.Tensor, name: str, shard_id: int
    ) -> None:
        offset, size = self._part_range(shard_id)
        if shard_id == 0:
            total, source_rank = size * self.tp.size, self.tp.rank
        else:
            total = self.num_kv_heads_total * self.head_dim
            replicas = max(1, self.tp.size // self.num_kv_heads_total)
            source_rank = self.tp.rank // replicas
        _check_shape(param, (total, *param.shape[1:]), loaded, name)
        param.data.narrow(0, offset, size).copy_(loaded.narrow(0, source_rank * size, size))


class RowParallelLinear(cpu_packing.PackableLinear, nn.Module):
    """y = x W^T with W's columns (input features) split; partial sums are all-reduced."""

    def __init__(self, in_features: int, out_features: int, bias: bool, tp: TensorParallel) -> None:
        super().__init__()
        self.tp = tp
        self.in_per_rank = tp.shard(in_features, "input features")
        self.weight = _parameter(out_features, self.in_per_rank)
        self.weight.weight_loader = self.load_weight
        self.bias = _parameter(out_features) if bias else None
        if self.bias is not None:
            self.bias.weight_loader = self.load_bias

    def load_weight(self, param: nn.Parameter, loaded: torch.Tensor, name: str) -> None:
        _check_shape(param, (param.shape[0], self.in_per_rank * self.tp.size), loaded, name)
        param.data.copy_(loaded.narrow(1, self.tp.rank * self.in_per_rank, self.in_per_rank))

    def load_bias(self, param: nn.Parameter, loaded: torch.Tensor, name: str) -> None:
        _check_shape(param, tuple(param.shape), loaded, name)
        param.data.copy_(loaded)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The bias joins once, after the reduction, not once per rank.
        y = self.tp.all_reduce(self.matmul(x))
        return y if self.bias is None else y + self.bias
