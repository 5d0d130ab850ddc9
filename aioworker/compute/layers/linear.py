"""Linear layers split across tensor-parallel ranks, each parameter carrying its own `weight_loader`.

Column-parallel layers split output features (no communication); row-parallel layers split input
features and all-reduce the partial sums. A column-parallel layer may hold several checkpoint
tensors side by side (q/k/v, gate/up), so one matmul replaces several; the loader names the part
by `shard_id`. Splits may be uneven (whole heads per rank), see TensorParallel.partition.
"""

from __future__ import annotations

import functools
import itertools

import torch
from torch import nn

from aioworker.compute.layers.gemv.add_norm_input import PreNormed
from aioworker.compute.layers.linear_method import UNQUANTIZED, LinearMethod
from aioworker.compute.layers.param_loading import ParamLoading, blocks, copy_slice, loading_of
from aioworker.compute.parallel import Shard, TensorParallel


def _parameter(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape), requires_grad=False)


class MethodLinear(nn.Module):
    """A linear layer whose weight is held and multiplied by its LinearMethod."""

    linear_method: LinearMethod
    weight: nn.Parameter

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return self.linear_method.apply(self, x, bias)

    def _give_loaders(self, loader) -> None:
        """Each parameter the method created loads through `loader`, told how (its
        ParamLoading: the live parameter's, since staging hands the loader a bare buffer)."""
        for param in self.parameters(recurse=False):
            param.weight_loader = functools.partial(loader, loading_of(param))


def _check_shape(expected: tuple[int, ...], loaded: torch.Tensor, name: str) -> None:
    if tuple(loaded.shape) != expected:
        raise ValueError(
            f"{name}: checkpoint tensor has shape {tuple(loaded.shape)}, expected {expected}"
        )


class ColumnParallelLinear(MethodLinear):
    """y = x W^T where this rank holds a slice of the rows of each part.

    `parts` lists, per checkpoint tensor merged here, its full output size and this rank's slice.
    """

    def __init__(
        self,
        in_features: int,
        parts: list[tuple[int, Shard]],
        bias: bool,
        tp: TensorParallel,
        linear_method: LinearMethod = UNQUANTIZED,
    ) -> None:
        super().__init__()
        self.tp = tp
        self.parts = parts
        sizes = [shard.size for _, shard in parts]
        self.local_offsets = [0, *itertools.accumulate(sizes)][:-1]
        self.linear_method = linear_method
        linear_method.create_weights(self, sum(sizes), in_features)
        self.bias = _parameter(sum(sizes)) if bias else None
        self._give_loaders(self.load_part)

    def load_part(
        self,
        how: ParamLoading,
        param: torch.Tensor,
        loaded: torch.Tensor,
        name: str,
        shard_id: int = 0,
    ) -> None:
        """This rank's rows of part `shard_id`, in the checkpoint tensor's blocks of rows."""
        full_size, shard = self.parts[shard_id]
        if how.expand is not None:
            loaded = how.expand(loaded, full_size)
        full_rows = -(-full_size // how.out_block)
        if how.store is copy_slice:
            _check_shape((full_rows, *param.shape[1:]), loaded, name)
        elif loaded.shape[0] != full_rows:
            raise ValueError(
                f"{name}: checkpoint tensor has {loaded.shape[0]} rows, expected {full_rows}"
            )
        start, size = blocks(shard.start, shard.size, full_size, how.out_block, "output features")
        local_total = sum(s.size for _, s in self.parts)
        offset, _ = blocks(
            self.local_offsets[shard_id], shard.size, local_total, how.out_block, "output features"
        )
        how.store(param.data.narrow(0, offset, size), loaded.narrow(0, start, size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.matmul(x, self.bias)


def column_parallel(
    in_features: int,
    out_sizes: list[int],
    bias: bool,
    tp: TensorParallel,
    linear_method: LinearMethod = UNQUANTIZED,
) -> ColumnParallelLinear:
    """One or several (merged, e.g. gate and up) outputs, each split evenly across ranks."""
    parts = [(size, tp.partition(size, "output features")) for size in out_sizes]
    return ColumnParallelLinear(in_features, parts, bias, tp, linear_method)


class QKVParallelLinear(ColumnParallelLinear):
    """q, k and v in one matrix. Ranks take whole KV heads with their query heads (uneven if
    need be); with fewer KV heads than ranks, a KV head is replicated and its queries split."""

    def __init__(
        self,
        hidden_size: int,
        head_dim: int,
        num_heads: int,
        num_kv_heads: int,
        bias: bool,
        tp: TensorParallel,
        linear_method: LinearMethod = UNQUANTIZED,
    ) -> None:
        if num_heads % num_kv_heads:
            raise ValueError(
                f"num_attention_heads {num_heads} is not a multiple of num_key_value_heads {num_kv_heads}"
            )
        group = num_heads // num_kv_heads
        if num_kv_heads >= tp.size:
            kv = tp.partition(num_kv_heads, "num_key_value_heads")
            q = Shard(kv.start * group, kv.size * group)
        else:
            replicas = tp.size // num_kv_heads
            if tp.size % num_kv_heads or group % replicas:
                raise ValueError(
                    f"tensor-parallel size {tp.size} cannot share {num_kv_heads} KV heads of "
                    f"{group} query heads each; use a size that divides or is a multiple of {num_kv_heads}"
                )
            kv = Shard(tp.rank // replicas, 1)
            per_replica = group // replicas
            q = Shard(kv.start * group + (tp.rank % replicas) * per_replica, per_replica)
        self.head_dim = head_dim
        self.num_heads, self.num_kv_heads = q.size, kv.size
        self.q_shard = Shard(q.start * head_dim, q.size * head_dim)
        kv_shard = Shard(kv.start * head_dim, kv.size * head_dim)
        kv_total = num_kv_heads * head_dim
        parts = [(num_heads * head_dim, self.q_shard), (kv_total, kv_shard), (kv_total, kv_shard)]
        super().__init__(hidden_size, parts, bias, tp, linear_method)


class RowParallelLinear(MethodLinear):
    """y = x W^T with W's columns (input features) split; partial sums are all-reduced (or, with
    `reduce=False`, left to the caller, which takes the bias on too)."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool,
        tp: TensorParallel,
        in_shard: Shard | None = None,
        linear_method: LinearMethod = UNQUANTIZED,
        reduce: bool = True,
    ) -> None:
        super().__init__()
        self.tp = tp
        self.reduce = reduce
        self.in_features = in_features
        self.in_shard = in_shard or tp.partition(in_features, "input features")
        self.linear_method = linear_method
        linear_method.create_weights(self, out_features, self.in_shard.size)
        self._give_loaders(self.load_weight)
        self.bias = _parameter(out_features) if bias else None
        if self.bias is not None:
            self.bias.weight_loader = self.load_bias

    def load_weight(
        self, how: ParamLoading, param: torch.Tensor, loaded: torch.Tensor, name: str
    ) -> None:
        """This rank's columns, in the checkpoint tensor's blocks of columns (in_block 0: a
        tensor not split along the input, such as a per-channel scale)."""
        if how.expand is not None:
            loaded = how.expand(loaded, param.shape[0])
        if how.in_block == 0:
            how.store(param.data, loaded)
            return
        full_columns = -(-self.in_features // how.in_block)
        if how.store is copy_slice:
            _check_shape((param.shape[0], full_columns), loaded, name)
        elif loaded.shape[1] != full_columns:
            raise ValueError(
                f"{name}: checkpoint tensor has {loaded.shape[1]} columns, expected {full_columns}"
            )
        start, size = blocks(
            self.in_shard.start,
            self.in_shard.size,
            self.in_features,
            how.in_block,
            "input features",
        )
        how.store(param.data, loaded.narrow(1, start, size))

    def load_bias(self, param: nn.Parameter, loaded: torch.Tensor, name: str) -> None:
        _check_shape(tuple(param.shape), loaded, name)
        param.data.copy_(loaded)

    def forward_then_norm(
        self, x: torch.Tensor, residual: torch.Tensor | None, norm: nn.Module
    ) -> torch.Tensor | PreNormed:
        """forward(x), or where the method can, the product gone on into half of the residual
        add and `norm` after it (PreNormed, device.norms_in_product_finish): on one rank, with
        no bias to add after the product, and a residual to add."""
        then_norm = getattr(self.linear_method, "apply_then_norm", None)
        alone = self.reduce and self.tp.size == 1 and self.bias is None
        if then_norm is not None and alone and residual is not None:
            done = then_norm(self, x, residual, norm)
            if done is not None:
                return done
        return self(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The bias joins once, after the reduction, not once per rank.
        if not self.reduce:
            return self.matmul(x, self.bias if self.tp.rank == 0 else None)
        y = self.tp.all_reduce(self.matmul(x))
        return y if self.bias is None else y + self.bias
