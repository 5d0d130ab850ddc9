"""Fused GPU kernels against the torch code they replace (Triton's interpreter on a CPU)."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from aioworker.layers import fused  # noqa: E402
from aioworker.layers.norm import RMSNorm  # noqa: E402
from aioworker.layers.rotary import _rotate_half  # noqa: E402

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


def test_write_kv_cache_puts_rows_in_their_slots() -> None:
    k, v = rand(3, 2, 8, seed=8), rand(3, 2, 8, seed=9)
    k_cache, v_cache = (
        torch.zeros(4, 4, 2, 8, device=DEVICE),
        torch.zeros(4, 4, 2, 8, device=DEVICE),
    )
    slots = torch.tensor([13, 0, 6], device=DEVICE)
    fused.write_kv_cache(k, v, k_cache, v_cache, slots)
    flat_k, flat_v = k_cache.view(16, 2, 8), v_cache.view(16, 2, 8)
    assert torch.equal(flat_k[slots], k) and torch.equal(flat_v[slots], v)
    assert flat_k.abs().sum() == k.abs().sum()
