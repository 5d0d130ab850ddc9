"""The routed experts of one MoE layer, held as two stacked weights per rank:
w13 [E_local, 2 I_local, D] (each expert's gate rows, then its up rows) and w2 [E_local, D,
I_local], so one fused kernel (triton_experts.py) or one loop (reference.py) multiplies them all.

Split across a tensor-parallel group in one of two ways (`parallel.expert_parallel_size`):
- 1: every rank holds every expert, each expert's hidden size split as a dense MLP's is; each
  rank's output is a partial sum the caller all-reduces;
- the group's size: each rank holds whole experts, a contiguous share of them, and tokens travel
  to their experts' ranks and back (expert_parallel.py).

A checkpoint stores experts one by one (`experts.{e}.gate_proj.weight`, Mixtral's w1/w3/w2) or
stacked (`experts.gate_up_proj` [E, 2I, D], `experts.down_proj` [E, D, I]); both load here,
each rank copying only its experts' slices (models/checkpoint_names.py maps the names).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import nn

from aioworker.compute.layers.moe.reference import reference_experts
from aioworker.compute.layers.moe.storage import ExpertStorage
from aioworker.compute.layers.param_loading import ParamLoading
from aioworker.compute.parallel import Shard, TensorParallel

# Shard ids of one expert's checkpoint tensors: (expert index, part).
GATE, UP, DOWN = "gate", "up", "down"


@dataclass(frozen=True)
class ExpertLayout:
    num_experts: int
    # This rank's experts and its slice of each expert's hidden size.
    experts: Shard
    intermediate: Shard
    expert_parallel: bool

    def describe(self) -> str:
        first, last = self.experts.start, self.experts.start + self.experts.size - 1
        if self.expert_parallel:
            return f"experts {first}-{last} of {self.num_experts} (expert parallel)"
        return f"all {self.num_experts} experts, hidden slice {self.intermediate.start}+{self.intermediate.size}"


def expert_layout(num_experts: int, intermediate_size: int, tp: TensorParallel) -> ExpertLayout:
    if tp.expert_parallel_size > 1:
        experts = tp.partition(num_experts, "num_experts")
        return ExpertLayout(num_experts, experts, Shard(0, intermediate_size), True)
    intermediate = tp.partition(intermediate_size, "moe_intermediate_size")
    return ExpertLayout(num_experts, Shard(0, num_experts), intermediate, False)


class FusedExperts(nn.Module):
    def __init__(
        self,
        num_experts: int,
        top_k: int,
        hidden_size: int,
        intermediate_size: int,
        tp: TensorParallel,
        storage: ExpertStorage,
    ) -> None:
        super().__init__()
        self.tp, self.top_k, self.storage = tp, top_k, storage
        self.hidden_size, self.intermediate_size = hidden_size, intermediate_size
        self.dense_dtype = torch.get_default_dtype()  # the model's (build_model sets it)
        self.layout = layout = expert_layout(num_experts, intermediate_size, tp)
        num_local, local_size = layout.experts.size, layout.intermediate.size
        self.linear_method = ExpertsMethod()
        # Tokens routed to each of this rank's experts, counted on the device (load_meter.py).
        self.register_buffer(
            "routed_tokens", torch.zeros(num_local, dtype=torch.int64), persistent=False
        )
        shapes = {
            "w13": (num_local, 2 * local_size, hidden_size),
            "w2": (num_local, hidden_size, local_size),
        }
        for which, shape in shapes.items():
            self._register(which, "weight", storage.weight(*shape))
            if storage.is_quantized:
                self._register(which, "scale", storage.scale(*shape[:2]))
            else:
                setattr(self, f"{which}_scale", None)

    def _register(self, which: str, kind: str, tensor: torch.Tensor) -> None:
        param = nn.Parameter(tensor, requires_grad=False)
        param.weight_loader = functools.partial(self._load, which, kind)
        parts = (GATE, UP) if which == "w13" else (DOWN,)
        first = self.layout.experts.start
        param.expected_shards = [
            (e, part) for e in range(first, first + self.layout.experts.size) for part in parts
        ]
        if self.storage.is_quantized:
            dense = self.dense_dtype
            derived = (f"{which}_scale",) if kind == "weight" else ()
            param.loading = ParamLoading(load_dtype=dense, derived=derived)
        setattr(self, f"{which}_{kind}", param)

    def _load(
        self,
        which: str,
        kind: str,
        target: torch.Tensor,
        loaded: torch.Tensor,
        name: str,
        shard_id: tuple[int, str] | None = None,
    ) -> None:
        """One expert's gate, up or down tensor (shard_id), or every expert's stacked (None)."""
        if shard_id is None:
            self._load_stacked(which, kind, target, loaded, name)
            return
        expert, part = shard_id
        local = expert - self.layout.experts.start
        if 0 <= local < self.layout.experts.size:  # another rank's expert: not ours to hold
            self._load_expert(which, kind, target[local], loaded, part, name)

    def _load_expert(
        self,
        which: str,
        kind: str,
        target: torch.Tensor,
        loaded: torch.Tensor,
        part: str,
        name: str,
    ) -> None:
        full, shard = self.intermediate_size, self.layout.intermediate
        if part == DOWN:
            _check_shape(loaded, (self.hidden_size, full), name)
            self.storage.store(kind, target, loaded.narrow(1, shard.start, shard.size))
            return
        _check_shape(loaded, (full, self.hidden_size), name)
        rows = target.narrow(0, 0 if part == GATE else shard.size, shard.size)
        self.storage.store(kind, rows, loaded.narrow(0, shard.start, shard.size))

    def _load_stacked(
        self, which: str, kind: str, target: torch.Tensor, loaded: torch.Tensor, name: str
    ) -> None:
        num, full, hidden = self.layout.num_experts, self.intermediate_size, self.hidden_size
        expected = (num, 2 * full, hidden) if which == "w13" else (num, hidden, full)
        _check_shape(loaded, expected, name)
        first = self.layout.experts.start
        for local in range(self.layout.experts.size):
            one = loaded[first + local]
            if which == "w2":
                self._load_expert(which, kind, target[local], one, DOWN, name)
            else:
                self._load_expert(which, kind, target[local], one[:full], GATE, name)
                self._load_expert(which, kind, target[local], one[full:], UP, name)

    def forward(
        self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor
    ) -> torch.Tensor:
        """x: [T, D], topk_ids/weights: [T, K] -> this rank's partial sum [T, D]."""
        if self.layout.expert_parallel:
            from aioworker.compute.layers.moe.expert_parallel import through_owners

            return through_owners(self, x, topk_ids, topk_weights)
        return self.multiply(x, topk_ids, topk_weights)

    def multiply(
        self, x: torch.Tensor, local_ids: torch.Tensor, topk_weights: torch.Tensor
    ) -> torch.Tensor:
        """The products by this rank's experts; ids index them locally, -1 skips a choice."""
        args = (x, self.w13_weight, self.w2_weight, local_ids, topk_weights)
        if x.is_cuda:  # the fused kernels count the choices as they group them
            from aioworker.compute.layers.moe.triton_experts import fused_experts

            return fused_experts(*args, self.w13_scale, self.w2_scale, self.routed_tokens)
        ids = local_ids.reshape(-1).long()
        self.routed_tokens.index_add_(0, ids.clamp_min(0), (ids >= 0).long())
        return reference_experts(*args, self.w13_scale, self.w2_scale)


def _check_shape(loaded: torch.Tensor, expected: tuple[int, ...], name: str) -> None:
    if tuple(loaded.shape) != expected:
        raise ValueError(
            f"{name}: checkpoint tensor has shape {tuple(loaded.shape)}, expected {expected}"
        )


class ExpertsMethod:
    """The experts' part in the linear-method moments (linear_method.py): nothing derived after
    loading, random weights for dummy loads, and the bytes a batch-1 decode step reads (its
    token's top-k experts, not all of them)."""

    name = "experts"

    def process_after_loading(self, layer: FusedExperts) -> None:
        pass

    def drop_derived(self, layer: FusedExperts) -> None:
        pass

    def weight_bytes(self, layer: FusedExperts) -> int:
        held = sum(t.numel() * t.element_size() for t in layer.parameters(recurse=False))
        return held * min(layer.top_k, layer.layout.num_experts) // layer.layout.num_experts

    def fill_dummy(self, layer: FusedExperts, fill) -> None:
        if not layer.storage.is_quantized:
            return  # dense: filled with every other parameter
        for which in ("w13", "w2"):
            weight = getattr(layer, f"{which}_weight")
            for local in range(weight.shape[0]):
                dense = torch.empty(weight.shape[1:], dtype=layer.dense_dtype, device=weight.device)
                fill(dense)
                layer.storage.store("weight", weight.data[local], dense)
                layer.storage.store("scale", getattr(layer, f"{which}_scale").data[local], dense)
