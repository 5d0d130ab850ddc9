"""Routing as each family's reference does it: top-k of the softmax, renormalised or not; ERNIE
chooses by probability plus its correction bias and weighs by the probability alone."""

from __future__ import annotations

import math

import torch

from aioworker.checkpoint.moe_config import MoeConfig
from aioworker.compute.layers.moe.routing import route

LOGITS = torch.log(torch.tensor([[0.1, 0.2, 0.3, 0.4]]))


def moe(**fields) -> MoeConfig:
    return MoeConfig(num_experts=4, top_k=2, intermediate_size=8, sparse_layers=(0,), **fields)


def test_top_k_of_the_softmax_without_renormalising() -> None:
    weights, ids = route(LOGITS, moe(renormalize=False))
    assert ids.tolist() == [[3, 2]] and ids.dtype == torch.int32
    assert torch.allclose(weights, torch.tensor([[0.4, 0.3]]))


def test_renormalised_weights_sum_to_one() -> None:
    weights, _ = route(LOGITS, moe())
    assert torch.allclose(weights, torch.tensor([[0.4 / 0.7, 0.3 / 0.7]]))


def test_the_correction_bias_chooses_but_does_not_weigh() -> None:
    bias = torch.tensor([[0.5, 0.0, 0.0, 0.0]])
    weights, ids = route(LOGITS, moe(correction_bias=True), bias)
    assert ids.tolist() == [[0, 3]]
    assert torch.allclose(weights, torch.tensor([[0.1 / 0.5, 0.4 / 0.5]]))


def test_norm_min_bounds_the_renormalising_sum() -> None:
    tiny = torch.tensor([[0.0, -100.0, -100.0, -100.0]])
    weights, _ = route(tiny, moe(norm_min=2.0))
    # The chosen probabilities sum to about 1, below the bound 2: divided by 2, not by their sum.
    assert math.isclose(weights.sum().item(), 0.5, rel_tol=1e-5)
