"""A product that finishes half of the residual add and RMSNorm after it (NormOut) and the
product after that, which finishes the norm (PreNormed): together they equal the product, the
add and norm, and the next product (Triton's interpreter on a CPU machine; the GPU with -m gpu
runs them through whole models)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from aioworker.compute.layers.gemv.product import (  # noqa: E402
    NormOut,
    PreNormed,
    small_rows_product,
)
from aioworker.compute.layers.gemv.tiles import Tiles  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
EPS = 1e-5
# A split reduced by its own kernel, a folded split, one slice; FMA tiles take one row.
TILES = [
    Tiles(block_n=16, block_k=16, splits=3),
    Tiles(block_n=16, block_k=16, splits=3, fold=True),
    Tiles(block_n=32, block_k=32),
    Tiles(dot=False, block_n=8, block_k=32, splits=2),
    Tiles(dot=False, block_n=8, block_k=32),
]


def operands(rows: int, dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=g)).to(DEVICE, dtype)

    x, residual = rand(rows, 48), rand(rows, 40)
    w_o, w_next = rand(40, 48, scale=48**-0.5), rand(24, 40, scale=40**-0.5)
    norm_weight = (1 + 0.1 * torch.randn(40, generator=g)).to(DEVICE, dtype)
    return x, residual, w_o, w_next, norm_weight


def rows_for(tiles: Tiles) -> int:
    return 5 if tiles.dot else 1


# bf16 on FMA tiles only where the interpreter runs them: its bf16 dot is not the GPU's.
ROUNDINGS = [(t, torch.float32) for t in TILES] + [
    (t, torch.bfloat16) for t in TILES if not t.dot or DEVICE == "cuda"
]


@pytest.mark.parametrize(("tiles", "dtype"), ROUNDINGS)
def test_the_finish_adds_the_residual_and_multiplies_by_the_norms_weight(tiles, dtype) -> None:
    x, residual, w_o, _, norm_weight = operands(rows_for(tiles), dtype)
    h_out = torch.empty_like(residual)
    got = small_rows_product(x, w_o, tiles, norm_out=NormOut(residual, norm_weight, EPS, h_out))
    assert isinstance(got, PreNormed) and got.h is h_out and got.weight is norm_weight
    y = small_rows_product(x, w_o, tiles)
    h = (y.float() + residual.float()).to(dtype)  # rounded as torch's add
    hn = (got.h.float() * norm_weight.float()).to(dtype)
    if dtype == torch.float32 or DEVICE == "cuda":
        assert torch.equal(got.h, h) and torch.equal(got.x, hn)
    else:  # the interpreter rounds float32 to bf16 its own way: within a rounding
        torch.testing.assert_close(got.h, h)
        torch.testing.assert_close(got.x, hn)
    torch.testing.assert_close(got.squares.sum(0), got.h.float().pow(2).sum(-1), rtol=1e-5,
                               atol=1e-5)  # fmt: skip


# the reduce kernel's 1 slot a row, 2 output tiles' slots, 5 FMA tiles' (loaded as 8, masked)
@pytest.mark.parametrize("producer", [TILES[0], TILES[2], TILES[4]])
@pytest.mark.parametrize("consumer", TILES)
def test_the_next_product_finishes_the_norm(producer, consumer) -> None:
    """In float32: norm(x W_o^T + residual) W_next^T, whichever tiles the two products take."""
    rows = 1 if not (producer.dot and consumer.dot) else 5
    x, residual, w_o, w_next, norm_weight = operands(rows, torch.float32, seed=1)
    normed = small_rows_product(
        x, w_o, producer, norm_out=NormOut(residual, norm_weight, EPS, torch.empty_like(residual))
    )
    got = small_rows_product(normed.x, w_next, consumer, prenormed=normed)
    h = x @ w_o.T + residual
    want = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS) * norm_weight) @ w_next.T
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_norms_the_product_cannot_take_are_named() -> None:
    x, residual, w_o, _, norm_weight = operands(1, torch.float32)
    tiles = TILES[4]
    with pytest.raises(ValueError, match="contiguous"):
        small_rows_product(
            x, w_o, tiles, norm_out=NormOut(residual[:, :39], norm_weight, EPS, residual)
        )
    with pytest.raises(ValueError, match="plain"):
        gate_up = torch.cat([w_o, w_o])
        small_rows_product(
            x, gate_up, tiles, gated=True,
            norm_out=NormOut(residual, norm_weight, EPS, torch.empty_like(residual)),
        )  # fmt: skip
