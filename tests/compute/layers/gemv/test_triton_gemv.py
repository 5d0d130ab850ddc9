"""The small-M product kernel (compute/layers/gemv/triton_gemv.py) against torch's, for 1 to 8
rows, sizes that are not multiples of its tiles, K split or not, and a per-channel scale. On a
CPU machine it runs in Triton's interpreter (so sizes are small); on the GPU for real."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
triton = pytest.importorskip("triton")

from aioworker.compute.layers.gemv.triton_gemv import MAX_ROWS, gemv, num_splits  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def reference(x, weight, scale=None):
    out = x.double() @ weight.double().T
    return out * scale.double() if scale is not None else out


@pytest.mark.parametrize("num_rows", [1, 3, 8])
@pytest.mark.parametrize(("num_cols", "depth", "splits"), [(70, 200, 1), (33, 300, 3)])
def test_equals_the_reference(num_rows: int, num_cols: int, depth: int, splits: int) -> None:
    generator = torch.Generator().manual_seed(num_rows * depth)
    x = torch.randn(num_rows, depth, generator=generator).to(DEVICE)
    weight = torch.randn(num_cols, depth, generator=generator).to(DEVICE)
    got = gemv(x, weight, splits=splits)
    assert got.shape == (num_rows, num_cols) and got.dtype == x.dtype
    torch.testing.assert_close(got.double().cpu(), reference(x, weight).cpu(), rtol=1e-5, atol=1e-4)


def test_a_per_channel_scale_multiplies_each_output_channel() -> None:
    """int8 weights with a float scale per output channel: the variant weight formats take."""
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(2, 160, generator=generator).to(DEVICE)
    weight = torch.randint(-127, 128, (40, 160), generator=generator, dtype=torch.int8)
    scale = torch.rand(40, generator=generator) / 100
    got = gemv(x, weight.to(DEVICE), scale.to(DEVICE))
    torch.testing.assert_close(
        got.double().cpu(), reference(x, weight, scale).cpu(), rtol=1e-5, atol=1e-4
    )


def test_k_is_split_where_output_tiles_are_few() -> None:
    assert num_splits(num_cols=4096, depth=4096) == 5  # 64 tiles: 320 programs, >= 264
    assert num_splits(num_cols=14336, depth=4096) == 2
    assert num_splits(num_cols=128256, depth=4096) == 1
    assert num_splits(num_cols=64, depth=100) == 1  # never thinner than one BLOCK_K


def test_more_than_eight_rows_is_refused() -> None:
    with pytest.raises(ValueError, match="1 to 8 rows"):
        gemv(torch.zeros(MAX_ROWS + 1, 16), torch.zeros(4, 16))
