"""A split-K product's partial sums left for the add and norm after it (split_sums.py,
device.fused_reduce_norm): the product hands them on only where a reduce kernel would add them;
reduced, they are the product the reduce kernel makes, bit for bit; the add-and-norm kernel adds
them to the same values as the reduce kernel then the norm; and a linear layer leaves them only
where nothing else must happen to the product first (one rank, no bias). Triton's interpreter on
a CPU machine; on the GPU in bf16 too."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from aioworker.compute.layers import fused  # noqa: E402
from aioworker.compute.layers.gemv.product import AddNorm, small_rows_product  # noqa: E402
from aioworker.compute.layers.gemv.tiles import Tiles  # noqa: E402
from aioworker.compute.layers.linear import RowParallelLinear  # noqa: E402
from aioworker.compute.layers.split_sums import SplitSums, as_tensor  # noqa: E402
from aioworker.compute.parallel import TensorParallel  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32] + ([torch.bfloat16] if DEVICE == "cuda" else [])
SPLIT = Tiles(block_n=16, block_k=16, splits=3)


def operands(dtype, rows=2, channels=40, depth=48, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, depth, generator=g).to(dtype).to(DEVICE)
    weight = torch.randn(channels, depth, generator=g).to(dtype).to(DEVICE)
    scale = (torch.rand(channels, generator=g) + 0.5).to(DEVICE)
    bias = torch.randn(channels, generator=g).to(dtype).to(DEVICE)
    return x, weight, scale, bias


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scaled", [False, True])
def test_deferred_sums_reduce_to_the_product_bit_for_bit(dtype, scaled) -> None:
    x, weight, scale, bias = operands(dtype)
    scale = scale if scaled else None
    whole = small_rows_product(x, weight, SPLIT, scale, bias=bias)
    sums = small_rows_product(x, weight, SPLIT, scale, bias=bias, defer_reduce=True)
    assert isinstance(sums, SplitSums) and sums.partial.shape == (3, 2, 40)
    assert torch.equal(sums.reduce(), whole) and sums.reduce().dtype == dtype


def test_only_a_reduce_kernels_sums_are_deferred() -> None:
    """One split, a folding split (its last program adds them), a gated product (its reduce
    applies the gate) and a normed one (its reduce applies 1 / rms) give the product itself."""
    x, weight, _, _ = operands(torch.float32)
    for tiles, gated in [(Tiles(block_n=16, block_k=16), False),
                         (Tiles(block_n=16, block_k=16, splits=3, fold=True), False),
                         (SPLIT, True)]:  # fmt: skip
        got = small_rows_product(x, weight, tiles, gated=gated, defer_reduce=True)
        assert isinstance(got, torch.Tensor)
    norm = AddNorm(None, torch.ones(48, device=DEVICE), 1e-6, None)
    got = small_rows_product(x, weight, SPLIT, add_norm=norm, defer_reduce=True)
    assert isinstance(got, torch.Tensor)


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_add_and_norm_adds_the_sums_as_the_reduce_kernel_does(dtype) -> None:
    x, weight, scale, bias = operands(dtype, seed=1)
    residual = torch.randn(2, 40, generator=torch.Generator().manual_seed(2)).to(dtype).to(DEVICE)
    norm_weight = torch.rand(40, generator=torch.Generator().manual_seed(3)).to(dtype).to(DEVICE)
    sums = small_rows_product(x, weight, SPLIT, scale, bias=bias, defer_reduce=True)
    want = fused.add_rms_norm(sums.reduce(), residual, norm_weight, 1e-6)
    got = fused.add_rms_norm(sums, residual, norm_weight, 1e-6)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    with pytest.raises(ValueError, match="reduce"):
        fused.add_rms_norm(sums, None, norm_weight, 1e-6)  # the sum itself would be returned
    assert as_tensor(want[0]) is want[0]


class Deferring:
    """A method that says which products it was asked to leave as sums."""

    def __init__(self) -> None:
        self.deferred = 0

    def create_weights(self, layer, out_features, in_features) -> None:
        layer.weight = torch.nn.Parameter(torch.randn(out_features, in_features))

    def apply(self, layer, x, bias=None):
        return x @ layer.weight.T + (0 if bias is None else bias)

    def apply_deferred(self, layer, x, bias=None):
        self.deferred += 1
        return self.apply(layer, x, bias)


def test_a_linear_layer_defers_only_alone_and_without_a_bias() -> None:
    x = torch.randn(1, 8)
    cases = [(TensorParallel(), False, True, 1), (TensorParallel(), True, True, 0),
             (TensorParallel(0, 2), False, True, 0), (TensorParallel(), False, False, 0)]  # fmt: skip
    for tp, bias, asked, deferred in cases:
        method = Deferring()
        layer = RowParallelLinear(8 * tp.size, 4, bias, tp, linear_method=method)
        if tp.size > 1:  # what is tested is the layer's choice, not the collective
            layer.tp = SimpleNamespace(rank=0, size=tp.size, all_reduce=lambda y: y)
        layer(x, defer_reduce=asked)
        assert method.deferred == deferred, (tp, bias, asked)
