"""Experts load one by one or stacked, into every layout a group may have (each expert split
across ranks, or whole experts per rank), quantized or dense; a missing expert is named."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from aioworker.compute.layers.moe.experts import FusedExperts
from aioworker.compute.layers.moe.reference import reference_experts
from aioworker.compute.layers.moe.storage import FORMATS, ExpertStorage
from aioworker.compute.loader import WeightsError, load_weights
from aioworker.compute.parallel import TensorParallel

NUM_EXPERTS, HIDDEN, INTERMEDIATE = 5, 16, 12


class Holder(nn.Module):
    """`layers.0.mlp.experts`, as a checkpoint names them."""

    def __init__(self, tp: TensorParallel, fmt: str = "none") -> None:
        super().__init__()
        experts = FusedExperts(
            NUM_EXPERTS, 2, HIDDEN, INTERMEDIATE, tp, ExpertStorage(FORMATS[fmt])
        )
        self.layers = nn.ModuleList([nn.Module()])
        self.layers[0].mlp = nn.Module()
        self.layers[0].mlp.experts = experts

    @property
    def experts(self) -> FusedExperts:
        return self.layers[0].mlp.experts


def checkpoint(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for e in range(NUM_EXPERTS):
        prefix = f"layers.0.mlp.experts.{e}"
        tensors[f"{prefix}.gate_proj.weight"] = torch.randn(INTERMEDIATE, HIDDEN, generator=g)
        tensors[f"{prefix}.up_proj.weight"] = torch.randn(INTERMEDIATE, HIDDEN, generator=g)
        tensors[f"{prefix}.down_proj.weight"] = torch.randn(HIDDEN, INTERMEDIATE, generator=g)
    return tensors


def stacked(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers' own layout: experts.gate_up_proj [E, 2I, D], experts.down_proj [E, D, I]."""

    def each(part: str) -> list[torch.Tensor]:
        return [tensors[f"layers.0.mlp.experts.{e}.{part}.weight"] for e in range(NUM_EXPERTS)]

    gate_up = torch.stack(
        [torch.cat(pair) for pair in zip(each("gate_proj"), each("up_proj"), strict=True)]
    )
    return {
        "layers.0.mlp.experts.gate_up_proj": gate_up,
        "layers.0.mlp.experts.down_proj": torch.stack(each("down_proj")),
    }


def loaded(tp: TensorParallel, tensors: dict[str, torch.Tensor], fmt: str = "none") -> FusedExperts:
    holder = Holder(tp, fmt)
    load_weights(holder, iter(tensors.items()), progress=False)
    return holder.experts


RANKS = [
    TensorParallel(0, 2), TensorParallel(1, 2),
    TensorParallel(0, 2, expert_parallel_size=2), TensorParallel(1, 2, expert_parallel_size=2),
]  # fmt: skip


@pytest.mark.parametrize("tp", RANKS, ids=["tp0", "tp1", "ep0", "ep1"])
def test_one_by_one_and_stacked_load_the_same_slices(tp: TensorParallel) -> None:
    tensors = checkpoint()
    one_by_one, whole = loaded(tp, tensors), loaded(tp, stacked(tensors))
    assert torch.equal(one_by_one.w13_weight, whole.w13_weight)
    assert torch.equal(one_by_one.w2_weight, whole.w2_weight)
    layout = one_by_one.layout
    first, inter = layout.experts.start, layout.intermediate
    gate = tensors[f"layers.0.mlp.experts.{first}.gate_proj.weight"]
    down = tensors[f"layers.0.mlp.experts.{first}.down_proj.weight"]
    assert torch.equal(
        one_by_one.w13_weight[0, : inter.size], gate[inter.start : inter.start + inter.size]
    )
    assert torch.equal(one_by_one.w2_weight[0], down[:, inter.start : inter.start + inter.size])


def test_expert_parallel_ranks_hold_a_share_each_and_split_ones_sum_to_the_whole() -> None:
    tensors = checkpoint()
    assert [loaded(tp, tensors).layout.experts.size for tp in RANKS[2:]] == [3, 2]
    x = torch.randn(7, HIDDEN)
    ids = torch.randint(0, NUM_EXPERTS, (7, 2), dtype=torch.int32)
    weights = torch.rand(7, 2)
    whole = loaded(TensorParallel(), tensors).multiply(x, ids, weights)
    halves = sum(loaded(tp, tensors).multiply(x, ids, weights) for tp in RANKS[:2])
    assert torch.allclose(halves, whole, atol=1e-4)


def test_a_missing_expert_is_named() -> None:
    tensors = checkpoint()
    del tensors["layers.0.mlp.experts.3.up_proj.weight"]
    with pytest.raises(
        WeightsError, match=r"missing 1 tensor\(s\): layers.0.mlp.experts.3.up_proj.weight"
    ):
        loaded(TensorParallel(), tensors)


def test_another_ranks_missing_expert_is_not_this_ranks_concern() -> None:
    tensors = checkpoint()
    del tensors["layers.0.mlp.experts.4.down_proj.weight"]  # rank 1's
    assert loaded(RANKS[2], tensors).layout.experts.size == 3


def test_a_mis_shaped_expert_is_named() -> None:
    tensors = checkpoint()
    tensors["layers.0.mlp.experts.1.gate_proj.weight"] = torch.zeros(3, HIDDEN)
    with pytest.raises(
        WeightsError, match=r"experts.1.gate_proj.weight: checkpoint tensor has shape \(3, 16\)"
    ):
        loaded(TensorParallel(), tensors)


# Relative error over the whole output: over 200 seeded draws the worst was 1.4% (wint8) and
# 7.8% (fp8). The draws are seeded, since a worst single element of an unseeded draw crossed a
# bound once in CI.
@pytest.mark.parametrize(("fmt", "tolerance"), [("wint8", 0.02), ("fp8", 0.1)])
def test_quantized_experts_stay_close_to_dense(fmt: str, tolerance: float) -> None:
    tensors = checkpoint()
    dense, quantized = loaded(TensorParallel(), tensors), loaded(TensorParallel(), tensors, fmt)
    assert quantized.w13_weight.dtype == FORMATS[fmt] and quantized.w13_scale.dtype == torch.float32
    g = torch.Generator().manual_seed(1)
    x = torch.randn(9, HIDDEN, generator=g)
    ids = torch.randint(0, NUM_EXPERTS, (9, 2), dtype=torch.int32, generator=g)
    weights = torch.rand(9, 2, generator=g)
    want = dense.multiply(x, ids, weights)
    got = quantized.multiply(x, ids, weights)
    assert ((got - want).norm() / want.norm()).item() < tolerance
    # Expert bytes read per token: top 2 of 5 experts' int8/fp8 values and their scales.
    assert (
        quantized.linear_method.weight_bytes(quantized)
        < dense.linear_method.weight_bytes(dense) / 3
    )


def test_ids_of_minus_one_are_skipped_and_counted_nowhere() -> None:
    experts = loaded(TensorParallel(), checkpoint())
    x = torch.randn(2, HIDDEN)
    ids = torch.tensor([[1, -1], [-1, -1]], dtype=torch.int32)
    out = experts.multiply(x, ids, torch.ones(2, 2))
    assert torch.equal(out[1], torch.zeros(HIDDEN))
    assert torch.allclose(
        out[:1],
        reference_experts(
            x[:1], experts.w13_weight, experts.w2_weight, ids[:1, :1], torch.ones(1, 1)
        ),
    )
    assert experts.routed_tokens.tolist() == [0, 1, 0, 0, 0]


def test_formats_without_experts_are_refused_naming_what_to_do() -> None:
    from aioworker.compute.layers.linear_method import LinearMethods
    from aioworker.compute.layers.weight_only import WINT4
    from aioworker.compute.models.moe_block import experts_storage

    with pytest.raises(ValueError, match="model.quantization 'wint4' has no MoE expert format"):
        experts_storage(LinearMethods(WINT4))

    class Checkpoint:
        name = "fp8 (channel, checkpoint)"

    with pytest.raises(
        ValueError, match=r"quantized \(fp8 \(channel, checkpoint\)\).*bf16 release"
    ):
        experts_storage(LinearMethods(Checkpoint()))
