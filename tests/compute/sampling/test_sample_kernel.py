"""The one-pass sampling kernel on its own: draws across tiles follow the distribution, a row's
draw is a function of its key alone, and cut tokens never come out. On a CPU machine it runs in
Triton's interpreter (small sizes); on the GPU machine, for real (-m gpu too)."""

from __future__ import annotations

import math

import pytest
import torch

triton = pytest.importorskip("triton")

from aioworker.compute.sampling.sample_kernel import BLOCK, draw_rows  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def keys(count: int, start: int = 0) -> torch.Tensor:
    # Spread over the whole 63-bit range, as derived seeds are.
    return torch.tensor([(k * 0x9E3779B97F4A7C15) >> 1 & (2**63 - 1) for k in
                         range(start, start + count)], dtype=torch.int64, device=DEVICE)  # fmt: skip


def test_draws_across_tiles_follow_the_distribution() -> None:
    """Three tokens in two tiles, the last in the vocabulary's ragged tail. (Two would not
    tell the noise's sign: the difference of two Gumbels is symmetric.)"""
    block = 64  # small tiles keep the interpreter quick
    vocab, chosen, probs = block + 7, [3, 20, block + 6], [0.6, 0.3, 0.1]
    logits = torch.full((1, vocab), float("-inf"))
    logits[0, chosen] = torch.tensor(probs).log()
    num_rows = 600  # 4 sigma still tells 0.6, 0.3 and 0.1 apart (at most +-0.08)
    out = draw_rows(logits.repeat(num_rows, 1).to(DEVICE), keys(num_rows), block).cpu()
    assert set(out.tolist()) <= set(chosen)
    for token, p in zip(chosen, probs, strict=True):
        frequency = (out == token).float().mean().item()
        assert abs(frequency - p) < 4 * math.sqrt(p * (1 - p) / num_rows), (token, frequency)


def test_a_rows_draw_depends_on_its_key_alone() -> None:
    logits = (torch.randn(6, 300, generator=torch.Generator().manual_seed(0)) * 2).to(DEVICE)
    row_keys = keys(6, start=40)
    together = draw_rows(logits, row_keys)
    alone = [draw_rows(logits[i : i + 1], row_keys[i : i + 1]).item() for i in range(6)]
    reversed_batch = draw_rows(logits.flip(0).contiguous(), row_keys.flip(0)).flip(0)
    assert together.tolist() == alone == reversed_batch.tolist()
    # and other keys draw otherwise (flat logits: 300 equally likely tokens)
    flat = torch.zeros(40, 300, device=DEVICE)
    assert len(set(draw_rows(flat, keys(40)).tolist())) > 25


def test_a_dominant_token_always_wins_and_an_empty_batch_is_empty() -> None:
    logits = torch.randn(8, BLOCK + 3, generator=torch.Generator().manual_seed(1))
    logits[:, BLOCK + 2] = 80.0
    assert draw_rows(logits.to(DEVICE), keys(8)).tolist() == [BLOCK + 2] * 8
    assert draw_rows(logits[:0].to(DEVICE), keys(0)).numel() == 0
