"""weight_tiles.py's int8 pairs for the tensor cores: the order the PTX's
registers take in the tile, checked under Triton's interpreter by feeding that reordering values
made by Triton's operations (the PTX itself: test_ptx_widening.py; on the GPU:
test_gpu_gemv.py)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from aioworker.compute.layers.gemv.weight_tiles import (  # noqa: E402
    int8_pairs_in_k_order,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@triton.jit
def _ordered(w_ptr, out_ptr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    WORDS: tl.constexpr = BLOCK_K // 4
    at = tl.arange(0, BLOCK_N)[:, None, None] * BLOCK_K + tl.arange(0, WORDS)[None, :, None] * 4
    halves = tl.arange(0, 2)[None, None, :]  # pair 0 is (k, k + 1), pair 1 (k + 2, k + 3)
    pair0 = tl.load(w_ptr + at + halves)
    pair1 = tl.load(w_ptr + at + 2 + halves)
    tile = int8_pairs_in_k_order(pair0, pair1, BLOCK_N, BLOCK_K)
    rows = tl.arange(0, BLOCK_N)[:, None] * BLOCK_K + tl.arange(0, BLOCK_K)[None, :]
    tl.store(out_ptr + rows, tile)


def test_a_words_two_pairs_land_in_k_order() -> None:
    w = torch.randint(-128, 128, (4, 32), generator=torch.Generator().manual_seed(0))
    w = w.to(torch.float32).to(DEVICE)
    out = torch.zeros_like(w)
    _ordered[(1,)](w, out, 4, 32)
    assert torch.equal(out, w)
