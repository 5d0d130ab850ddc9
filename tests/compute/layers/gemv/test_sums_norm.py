"""A split product's partial sums added by the residual add and RMSNorm after it
(device.norm_adds_split_sums): the same values, bit for bit, as the product's own reduce kernel
followed by the add and norm's kernel (Triton's interpreter on a CPU machine)."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from aioworker.compute.layers import fused  # noqa: E402
from aioworker.compute.layers.gemv.product import small_rows_product  # noqa: E402
from aioworker.compute.layers.gemv.split_sums import SplitSums  # noqa: E402
from aioworker.compute.layers.gemv.sums_norm import add_rms_norm_of_sums  # noqa: E402
from aioworker.compute.layers.gemv.tiles import Tiles  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SPLIT_TILES = [
    Tiles(block_n=16, block_k=16, splits=3),  # tensor cores, 2-8 rows
    Tiles(dot=False, block_n=8, block_k=32, splits=4),  # FMA, one row
]


def operands(rows: int, channels: int, depth: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, depth, generator=g).to(DEVICE, dtype)
    weight = (torch.randn(channels, depth, generator=g) / depth**0.5).to(DEVICE, dtype)
    residual = torch.randn(rows, channels, generator=g).to(DEVICE, dtype)
    norm_weight = (1 + 0.1 * torch.randn(channels, generator=g)).to(DEVICE, dtype)
    scale = (torch.rand(channels, generator=g) + 0.5).to(DEVICE)
    return x, weight, residual, norm_weight, scale


@pytest.mark.parametrize("tiles", SPLIT_TILES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_residual", [True, False])
@pytest.mark.parametrize("scaled", [False, True])
def test_the_norm_adds_the_sums_as_the_reduce_then_the_norm_would(
    tiles: Tiles, dtype, with_residual: bool, scaled: bool
) -> None:
    rows = 1 if not tiles.dot else 5
    x, weight, residual, norm_weight, scale = operands(rows, 37, 100, dtype)
    scale = scale if scaled else None
    residual = residual if with_residual else None
    sums = small_rows_product(x, weight, tiles, scale=scale, keep_split=True)
    assert isinstance(sums, SplitSums) and sums.partial.shape[0] == tiles.splits
    y = small_rows_product(x, weight, tiles, scale=scale)
    want_normed, want_residual = fused.add_rms_norm(y, residual, norm_weight, 1e-5)
    normed, residual_out = add_rms_norm_of_sums(sums, residual, norm_weight, 1e-5)
    assert torch.equal(normed, want_normed)
    assert torch.equal(residual_out, want_residual)
    assert torch.equal(sums.summed(), y)


@pytest.mark.parametrize("rows", [1, 2, 8])
def test_every_row_is_normed_on_its_own(rows: int) -> None:
    x, weight, residual, norm_weight, _ = operands(rows, 70, 64, torch.float32, seed=rows)
    tiles = SPLIT_TILES[0] if rows > 1 else SPLIT_TILES[1]
    sums = small_rows_product(x, weight, tiles, keep_split=True)
    normed, residual_out = add_rms_norm_of_sums(sums, residual, norm_weight, 1e-6)
    h = x @ weight.T + residual
    want = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * norm_weight
    torch.testing.assert_close(residual_out, h, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(normed, want, rtol=1e-4, atol=1e-4)


def test_unsplit_or_folded_products_come_back_added() -> None:
    x, weight, *_ = operands(1, 37, 100, torch.float32)
    for tiles in (Tiles(dot=False, block_n=8, block_k=32), Tiles(block_n=16, block_k=16,
                                                                 splits=3, fold=True)):  # fmt: skip
        got = small_rows_product(x, weight, tiles, keep_split=True)
        assert isinstance(got, torch.Tensor)
        torch.testing.assert_close(got, x @ weight.T, rtol=1e-4, atol=1e-4)


def test_only_plain_products_keep_their_sums() -> None:
    x, weight, *_ = operands(1, 40, 64, torch.float32)
    with pytest.raises(ValueError, match="not gated"):
        small_rows_product(x, weight, SPLIT_TILES[1], gated=True, keep_split=True)


def test_a_residual_of_another_shape_is_named() -> None:
    x, weight, residual, norm_weight, _ = operands(2, 37, 100, torch.float32)
    sums = small_rows_product(x, weight, SPLIT_TILES[0], keep_split=True)
    with pytest.raises(ValueError, match=r"residual \(2, 36\)"):
        add_rms_norm_of_sums(sums, residual[:, :36], norm_weight, 1e-5)
