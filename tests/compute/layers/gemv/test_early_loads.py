"""device.early_epilogue_loads (gemv/finish.py): the products' finishing steps with every load
issued before its first use give what the default finish gives, in every finish (the reduce
kernel, a fold, a product of one slice) and every epilogue (scaled, biased, gated, the norm
finished after the product and before the next one). Triton's interpreter on a CPU machine, in
float32: only the reduce kernel adds its splits in another order."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from aioworker.compute.layers.gemv.product import NormOut, small_rows_product  # noqa: E402
from aioworker.compute.layers.gemv.tiles import Tiles  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
EPS = 1e-5
TILES = [
    Tiles(block_n=16, block_k=16, splits=3),  # reduced by a kernel of its own
    Tiles(block_n=16, block_k=16, splits=5),  # five splits loaded as eight
    Tiles(block_n=16, block_k=16, splits=3, fold=True),
    Tiles(block_n=32, block_k=32),  # one slice: the product finishes itself
    Tiles(dot=False, block_n=8, block_k=16, splits=2),
    Tiles(dot=False, block_n=8, block_k=32),
]


def _rand(g: torch.Generator, *shape: int, scale: float = 1.0) -> torch.Tensor:
    return (scale * torch.randn(*shape, generator=g)).to(DEVICE)


def _both(**kwargs) -> tuple:
    """The product by the default finish, then with early loads."""
    return tuple(small_rows_product(**kwargs, early_loads=early) for early in (False, True))


def _assert_same(late: torch.Tensor, early: torch.Tensor, tiles: Tiles) -> None:
    if tiles.splits > 1 and not tiles.fold:  # the reduce kernel sums its splits as a tree
        torch.testing.assert_close(early, late, rtol=1e-6, atol=1e-6)
    else:
        assert torch.equal(early, late)


@pytest.mark.parametrize("tiles", TILES)
@pytest.mark.parametrize("epilogue", ["scaled, biased", "gated, scaled"])
def test_early_loads_give_the_default_finishs_product(tiles: Tiles, epilogue: str) -> None:
    g = torch.Generator().manual_seed(len(epilogue) + tiles.splits)
    rows = 5 if tiles.dot else 1
    gated = epilogue.startswith("gated")
    channels = 2 * 21 if gated else 37
    x, weight = _rand(g, rows, 80), _rand(g, channels, 80, scale=80**-0.5)
    scale = _rand(g, channels).abs() + 0.5
    bias = None if gated else _rand(g, channels)
    late, early = _both(x=x, weight=weight, tiles=tiles, scale=scale, gated=gated, bias=bias)
    _assert_same(late, early, tiles)


@pytest.mark.parametrize("tiles", TILES)
@pytest.mark.parametrize("gated_next", [False, True])
def test_early_loads_finish_the_norm_as_the_default_does(tiles: Tiles, gated_next: bool) -> None:
    """NormOut: the residual added and multiplied by the norm's weight; then the next product,
    which finishes the norm (PreNormed), on the same tiles: a plain one (qkv) or gated
    (gate/up)."""
    g = torch.Generator().manual_seed(7 + tiles.splits)
    rows = 5 if tiles.dot else 1
    x, residual = _rand(g, rows, 48), _rand(g, rows, 40)
    w_o, w_next = _rand(g, 40, 48, scale=48**-0.5), _rand(g, 2 * 12, 40, scale=40**-0.5)
    norm_weight = 1 + 0.1 * _rand(g, 40)
    late, early = (
        small_rows_product(
            x, w_o, tiles, norm_out=NormOut(residual, norm_weight, EPS, torch.empty_like(residual)),
            early_loads=on,
        )
        for on in (False, True)
    )  # fmt: skip
    for part in ("x", "h"):
        _assert_same(getattr(late, part), getattr(early, part), tiles)
    torch.testing.assert_close(early.squares.sum(0), late.squares.sum(0), rtol=1e-6, atol=1e-6)
    after_late, after_early = (
        small_rows_product(
            normed.x, w_next, tiles, gated=gated_next, prenormed=normed, early_loads=on
        )  # fmt: skip
        for normed, on in ((late, False), (early, True))
    )
    torch.testing.assert_close(after_early, after_late, rtol=1e-5, atol=1e-5)
