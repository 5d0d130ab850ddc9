"""The grouping kernel (align_kernel.py) against align.py's torch grouping, and the routing
kernel (routing_kernel.py) against routing.py: Triton's interpreter on a CPU machine, the GPU
for real on the GPU machine."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")  # the interpreter is chosen in conftest.py

from aioworker.checkpoint.moe_config import MoeConfig  # noqa: E402
from aioworker.compute.layers.moe.align import align_by_expert  # noqa: E402
from aioworker.compute.layers.moe.align_kernel import align_by_expert_fused  # noqa: E402
from aioworker.compute.layers.moe.routing import route  # noqa: E402
from aioworker.compute.layers.moe.routing_kernel import route_fused  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize(
    ("num_tokens", "num_experts", "top_k", "block_m"),
    [(1, 8, 2, 16), (17, 8, 2, 16), (300, 16, 4, 32), (5, 128, 8, 16), (700, 6, 2, 64)],
)
def test_the_kernel_groups_as_torch_does_and_counts(
    num_tokens, num_experts, top_k, block_m
) -> None:
    g = torch.Generator().manual_seed(num_tokens)
    ids = torch.randint(0, num_experts, (num_tokens, top_k), generator=g, dtype=torch.int32)
    ids[0, 0] = -1  # computed on another rank
    ids = ids.to(DEVICE)
    counts = torch.full((num_experts,), 5, dtype=torch.int64, device=DEVICE)
    want, got = (
        align_by_expert(ids, num_experts, block_m),
        align_by_expert_fused(ids, num_experts, block_m, counts),
    )
    num_blocks = want[2].item()
    assert got[2].item() == num_blocks
    assert torch.equal(got[0][: num_blocks * block_m], want[0][: num_blocks * block_m])
    assert torch.equal(got[1][:num_blocks], want[1][:num_blocks])
    flat = ids.flatten()
    assert counts.tolist() == [5 + (flat == e).sum().item() for e in range(num_experts)]


@pytest.mark.parametrize(
    ("num_experts", "top_k", "fields", "with_bias"),
    [
        (8, 2, {}, False),
        (128, 8, {"renormalize": False}, False),
        (64, 6, {"norm_min": 1e-12}, True),
        (5, 2, {}, False),
    ],
)
def test_the_routing_kernel_routes_as_torch_does(num_experts, top_k, fields, with_bias) -> None:
    moe = MoeConfig(
        num_experts=num_experts, top_k=top_k, intermediate_size=8, sparse_layers=(0,), **fields
    )
    g = torch.Generator().manual_seed(num_experts)
    logits = torch.randn(9, num_experts, generator=g).to(DEVICE)
    bias = (0.1 * torch.randn(1, num_experts, generator=g)).to(DEVICE) if with_bias else None
    want_weights, want_ids = route(logits, moe, bias)
    got_weights, got_ids = route_fused(logits, moe, bias)
    assert torch.equal(got_ids, want_ids)
    assert torch.allclose(got_weights, want_weights, atol=1e-6)
