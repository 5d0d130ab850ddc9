"""Fused GPU kernels against the torch code they replace (Triton's interpreter on a CPU)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from aioworker.compute.layers import fused  # noqa: E402
from aioworker.compute.layers.norm import RMSNorm  # noqa: E402
from aioworker.compute.layers.rotary import _rotate_half  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(DEVICE)


def test_add_rms_norm_matches_torch() -> None:
    norm = RMSNorm(96, 1e-5).to(DEVICE)
    norm.weight.data = rand(96, seed=3)
    x, residual = rand(5, 96, seed=1), rand(5, 96, seed=2)
    out, summed = fused.add_rms_norm(x, residual, norm.weight, 1e-5)
    torch.testing.assert_close(summed, x + residual)
    torch.testing.assert_close(out, norm(x + residual), rtol=1e-5, atol=1e-5)
    out, same = fused.add_rms_norm(x, None, norm.weight, 1e-5)
    assert same is x
    torch.testing.assert_close(out, norm(x), rtol=1e-5, atol=1e-5)


def test_silu_and_mul_matches_torch() -> None:
    gate_up = rand(3, 2 * 1500)
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(fused.silu_and_mul(gate_up), torch.nn.functional.silu(gate) * up)


@pytest.mark.parametrize("with_norm", [False, True])
def test_norm_rope_matches_torch_on_a_strided_view(with_norm: bool) -> None:
    tokens, heads, head_dim = 4, 3, 64
    qkv = rand(tokens, heads * head_dim + 32, seed=4)  # q is a strided view, as in the model
    q = qkv[:, : heads * head_dim].view(tokens, heads, head_dim)
    cos, sin = rand(tokens, head_dim, seed=5), rand(tokens, head_dim, seed=6)
    weight = rand(head_dim, seed=7) if with_norm else None
    expected = q.clone()
    if with_norm:
        norm = RMSNorm(head_dim, 1e-6).to(DEVICE)
        norm.weight.data = weight
        expected = norm(expected)
    expected = expected * cos[:, None] + _rotate_half(expected) * sin[:, None]
    untouched = qkv[:, heads * head_dim :].clone()
    fused.norm_rope_(q, cos, sin, weight, 1e-6)
    torch.testing.assert_close(q, expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(qkv[:, heads * head_dim :], untouched)


@pytest.mark.parametrize(
    ("with_norm", "tokens"),
    [
        (False, 3),
        (True, 3),
        (False, fused.ROWS_FROM_TOKENS + 5),
        (True, fused.ROWS_FROM_TOKENS + 5),
    ],  # the last two: rows a program, the last block part-filled
)
def test_qkv_rope_cache_equals_rope_then_cache_write(with_norm: bool, tokens: int) -> None:
    q_heads, kv_heads, head_dim = 4, 2, 64
    width = (q_heads + 2 * kv_heads) * head_dim
    qkv = rand(tokens, width, seed=10)
    q, k, v = (
        t.view(tokens, -1, head_dim)
        for t in qkv.split([q_heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    )
    cos, sin = rand(tokens, head_dim, seed=11), rand(tokens, head_dim, seed=12)
    q_weight = rand(head_dim, seed=13) if with_norm else None
    k_weight = rand(head_dim, seed=14) if with_norm else None
    expected_q, expected_k, expected_v = q.clone(), k.clone(), v.clone()
    fused.norm_rope_(expected_q, cos, sin, q_weight, 1e-6)
    fused.norm_rope_(expected_k, cos, sin, k_weight, 1e-6)
    num_slots = 2 * tokens + 2
    k_cache = torch.zeros(num_slots // 2, 2, kv_heads, head_dim, device=DEVICE)
    v_cache = torch.zeros_like(k_cache)
    slots = torch.randperm(num_slots, generator=torch.Generator().manual_seed(15))[:tokens]
    slots = slots.to(DEVICE)
    fused.qkv_rope_cache_(q, k, v, cos, sin, q_weight, k_weight, 1e-6, k_cache, v_cache, slots)
    # Rows of several tokens sum a head's squares for its norm in another order than one token's
    # program: on a GPU the bits may differ in float32's last place (an H100, 2026-12-07).
    # Rotary alone is elementwise, so without the norm the bits are the same.
    rows_change_the_sum = with_norm and fused.rows_per_program(tokens) > 1 and DEVICE == "cuda"
    tol = 2e-6 if rows_change_the_sum else 0.0
    for got, expected in [
        (q, expected_q),
        (k, expected_k),
        (k_cache.view(num_slots, kv_heads, head_dim)[slots], expected_k),
    ]:
        torch.testing.assert_close(got, expected, rtol=tol, atol=tol)
    assert torch.equal(v_cache.view(num_slots, kv_heads, head_dim)[slots], expected_v)
    written = torch.zeros(num_slots, dtype=torch.bool, device=DEVICE)
    written[slots] = True  # and no other slot: a part-filled block's masked rows write nothing
    assert not k_cache.view(num_slots, -1)[~written].any()
    assert not v_cache.view(num_slots, -1)[~written].any()
