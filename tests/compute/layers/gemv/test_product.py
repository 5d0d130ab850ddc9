"""The small-rows product kernels against torch's product: every row count from 1 to 8, shapes
that are no multiple of any tile, split K, gating and per-channel scales (Triton's interpreter on
a CPU machine, in float32; bf16 and e4m3 on the GPU with -m gpu too)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from aioworker.compute.layers.gemv.product import AddNorm, small_rows_product  # noqa: E402
from aioworker.compute.layers.gemv.tiles import Tiles  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
E4M3 = torch.float8_e4m3fn


def reference(x, weight, scale=None, gated=False, bias=None):
    y = x.float() @ weight.float().T
    if scale is not None:
        y = y * scale
    if bias is not None:
        y = y + bias
    if gated:
        gate, up = y.chunk(2, dim=-1)
        y = F.silu(gate) * up
    return y


DOT_TILES = [
    Tiles(block_n=16, block_k=32),
    Tiles(block_n=32, block_k=16, splits=3),
    Tiles(block_n=16, block_k=16, splits=4, fold=True),  # the last program adds the partials
]
FMA_TILES = [
    Tiles(dot=False, block_n=16, block_k=32),
    Tiles(dot=False, block_n=8, block_k=64, splits=2),
    Tiles(dot=False, block_n=16, block_k=32, splits=3, fold=True),
    Tiles(dot=False, block_n=8, block_k=32, splits=3, wide_x=True),  # x in W's tile shape
    # loads issued two steps ahead, and folded: K's loop of 2 or 4 steps a slice
    Tiles(dot=False, block_n=16, block_k=16, splits=2, num_stages=3, pipelined=True, fold=True),
]


@pytest.mark.parametrize("rows", range(1, 9))
@pytest.mark.parametrize("tiles", DOT_TILES)
@pytest.mark.parametrize(("channels", "depth"), [(48, 64), (37, 100)])
def test_dot_tiles_equal_torch(rows: int, tiles: Tiles, channels: int, depth: int) -> None:
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, depth, generator=g).to(DEVICE)
    weight = torch.randn(channels, depth, generator=g).to(DEVICE)
    got = small_rows_product(x, weight, tiles)
    torch.testing.assert_close(got, reference(x, weight), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("tiles", FMA_TILES)
@pytest.mark.parametrize(("channels", "depth"), [(48, 64), (37, 100)])
def test_one_row_fma_tiles_equal_torch(tiles: Tiles, channels: int, depth: int) -> None:
    x = torch.randn(1, depth).to(DEVICE)
    weight = torch.randn(channels, depth).to(DEVICE)
    torch.testing.assert_close(
        small_rows_product(x, weight, tiles), reference(x, weight), rtol=1e-4, atol=1e-4
    )


@pytest.mark.parametrize("tiles", [DOT_TILES[1], FMA_TILES[1]])
@pytest.mark.parametrize("scaled", [False, True])
def test_gated_and_scaled_products_equal_torch(tiles: Tiles, scaled: bool) -> None:
    rows = 1 if not tiles.dot else 5
    x = torch.randn(rows, 72).to(DEVICE)
    weight = torch.randn(2 * 21, 72).to(DEVICE)
    scale = (torch.rand(2 * 21) + 0.5).to(DEVICE) if scaled else None
    got = small_rows_product(x, weight, tiles, scale=scale, gated=True)
    assert got.shape == (rows, 21)
    torch.testing.assert_close(got, reference(x, weight, scale, gated=True), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("tiles", [DOT_TILES[0], DOT_TILES[1], FMA_TILES[1]])
def test_bias_is_added_after_the_scale(tiles: Tiles) -> None:
    x, weight = torch.randn(1, 64).to(DEVICE), torch.randn(40, 64).to(DEVICE)
    scale, bias = (torch.rand(40) + 0.5).to(DEVICE), torch.randn(40).to(DEVICE)
    got = small_rows_product(x, weight, tiles, scale=scale, bias=bias)
    torch.testing.assert_close(got, reference(x, weight, scale, bias=bias), rtol=1e-4, atol=1e-4)


def test_e4m3_weights_widen_exactly() -> None:
    x = torch.randn(3, 64).to(DEVICE)
    values = torch.tensor([0.0, 0.5, -1.5, 3.0, 448.0, -0.0625, 7.0, 12.0])
    weight = values[torch.randint(0, 8, (40, 64))].to(E4M3).to(DEVICE)
    scale = (torch.rand(40) + 0.5).to(DEVICE)
    got = small_rows_product(x, weight, Tiles(block_n=16, block_k=32, splits=2), scale=scale)
    torch.testing.assert_close(got, reference(x, weight, scale), rtol=1e-4, atol=1e-3)


def test_refuses_what_it_cannot_multiply() -> None:
    with pytest.raises(ValueError, match="1 to 8 contiguous rows"):
        small_rows_product(torch.randn(9, 16), torch.randn(4, 16), Tiles())
    with pytest.raises(ValueError, match="one row only"):
        small_rows_product(torch.randn(2, 16), torch.randn(4, 16), Tiles(dot=False))
    with pytest.raises(ValueError, match="no bias"):
        small_rows_product(
            torch.randn(1, 16), torch.randn(4, 16), Tiles(), None, True, torch.randn(2)
        )


@pytest.mark.parametrize("tiles", [Tiles(block_n=16, block_k=32, splits=2),
                                   Tiles(dot=False, block_n=16, block_k=32, splits=2, words=True),
                                   Tiles(dot=False, block_n=16, block_k=16, words=True,
                                         wide_x=True, pipelined=True)])  # fmt: skip
def test_int8_weights_with_channel_scales_equal_their_dequantized_product(tiles: Tiles) -> None:
    """On the FMA tiles also widened four a word (`words`: by PTX on a GPU; the interpreter
    runs its Triton twin, the same values)."""
    from aioworker.compute.layers.weight_only import quantize_int8

    rows = 1 if not tiles.dot else 6
    x, dense = torch.randn(rows, 96).to(DEVICE), torch.randn(50, 96)
    q, scale = quantize_int8(dense)
    q, scale = q.to(DEVICE), scale.to(DEVICE)
    got = small_rows_product(x, q, tiles, scale=scale)
    torch.testing.assert_close(got, reference(x, q, scale), rtol=1e-4, atol=1e-3)


INT4_TILES = [
    Tiles(block_n=16, block_k=16, splits=3),  # tiles inside one group of 32
    Tiles(block_n=32, block_k=64),  # two groups a tile
    Tiles(dot=False, block_n=16, block_k=128, splits=2),  # one row: int4_row.py, K past its end
    Tiles(dot=False, block_n=8, block_k=32, splits=3),  # one group a step
    Tiles(dot=False, block_n=16, block_k=64, splits=3, fold=True),
]


@pytest.mark.parametrize("tiles", INT4_TILES)
@pytest.mark.parametrize("gated", [False, True])
def test_int4_groups_dequantize_in_the_kernel(tiles: Tiles, gated: bool) -> None:
    from aioworker.compute.layers.quantized.weight_only import (
        dequantize_int4_rows,
        quantize_int4_rows,
    )

    rows = 1 if not tiles.dot else 7
    x, dense = torch.randn(rows, 224).to(DEVICE), torch.randn(2 * 27, 224)
    packed, scales, offsets = (t.to(DEVICE) for t in quantize_int4_rows(dense))
    got = small_rows_product(x, packed, tiles, gated=gated, int4_groups=(scales, offsets))
    want = reference(x, dequantize_int4_rows(packed, scales, offsets), gated=gated)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("tiles", INT4_TILES)
def test_int4_words_with_strided_groups_as_a_checkpoint_stores_them(tiles: Tiles) -> None:
    """compressed-tensors' int32 words (eight values, the first in the low bits) and group scales
    and offsets read in place from the [G, N, 2] tensor torch's int4 kernel keeps."""
    from aioworker.compute.layers.quantized.checkpoint_int4 import unpack_int32
    from aioworker.compute.layers.quantized.weight_only import dequantize_int4_values

    g = torch.Generator().manual_seed(2)
    values = torch.randint(0, 16, (45, 256), generator=g, dtype=torch.int32)
    shifts = torch.arange(0, 32, 4, dtype=torch.int32)
    words = (values.reshape(45, 32, 8) << shifts).sum(-1, dtype=torch.int32)
    assert torch.equal(unpack_int32(words, 1), values)
    scales_and_offsets = torch.rand(256 // 32, 45, 2, generator=g) - 0.5  # [G, N, 2]
    scales, offsets = scales_and_offsets[..., 0].t(), scales_and_offsets[..., 1].t()
    x = torch.randn(5 if tiles.dot else 1, 256, generator=g)
    got = small_rows_product(
        x.to(DEVICE), words.to(DEVICE), tiles,
        int4_groups=(scales.to(DEVICE), offsets.to(DEVICE)),
    )  # fmt: skip
    want = reference(x, dequantize_int4_values(values, scales, offsets))
    torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-3)


NORMED_TILES = [*DOT_TILES, *FMA_TILES]


def _reference_add_norm(x, residual, norm_weight, eps=1e-5):
    h = x if residual is None else x + residual
    normed = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * norm_weight
    return normed, h


@pytest.mark.parametrize("tiles", NORMED_TILES)
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("with_residual", [False, True])
def test_add_norm_in_the_product_equals_add_norm_then_product(
    tiles: Tiles, gated: bool, with_residual: bool
) -> None:
    """The residual add and RMSNorm inside the product (split K too: DOT_TILES[1] splits 3 and
    FMA_TILES[1] 2): its product and its x + residual equal the unfused path's."""
    g = torch.Generator().manual_seed(7)
    rows = 6 if tiles.dot else 1
    x = 3 * torch.randn(rows, 100, generator=g)
    residual = torch.randn(rows, 100, generator=g) if with_residual else None
    norm_weight = torch.rand(100, generator=g) + 0.5
    weight = torch.randn(2 * 19 if gated else 37, 100, generator=g)
    scale = torch.rand(weight.shape[0], generator=g) + 0.5
    residual_out = torch.empty_like(x) if with_residual else None
    add_norm = AddNorm(
        residual if residual is None else residual.to(DEVICE), norm_weight.to(DEVICE), 1e-5,
        residual_out if residual_out is None else residual_out.to(DEVICE),
    )  # fmt: skip
    got = small_rows_product(
        x.to(DEVICE), weight.to(DEVICE), tiles, scale.to(DEVICE), gated, add_norm=add_norm
    )
    normed, h = _reference_add_norm(x, residual, norm_weight)
    want = reference(normed, weight, scale, gated=gated)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-4)
    if with_residual:
        torch.testing.assert_close(add_norm.residual_out.cpu(), h, rtol=0, atol=0)


@pytest.mark.parametrize("tiles", [INT4_TILES[2], INT4_TILES[1]])
def test_add_norm_with_int4_weights(tiles: Tiles) -> None:
    """int4's one-row tiles read x per 4-bit place (int4_row.py): each place's squares add up."""
    from aioworker.compute.layers.quantized.weight_only import (
        dequantize_int4_rows,
        quantize_int4_rows,
    )

    g = torch.Generator().manual_seed(3)
    rows = 1 if not tiles.dot else 4
    x, residual = torch.randn(rows, 224, generator=g), torch.randn(rows, 224, generator=g)
    norm_weight = torch.rand(224, generator=g) + 0.5
    packed, scales, offsets = quantize_int4_rows(torch.randn(2 * 27, 224, generator=g))
    add_norm = AddNorm(residual.to(DEVICE), norm_weight.to(DEVICE), 1e-6,
                       torch.empty_like(x).to(DEVICE))  # fmt: skip
    got = small_rows_product(
        x.to(DEVICE), packed.to(DEVICE), tiles, gated=True,
        int4_groups=(scales.to(DEVICE), offsets.to(DEVICE)), add_norm=add_norm,
    )  # fmt: skip
    normed, h = _reference_add_norm(x, residual, norm_weight, 1e-6)
    want = reference(normed, dequantize_int4_rows(packed, scales, offsets), gated=True)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(add_norm.residual_out.cpu(), h, rtol=0, atol=0)


def test_add_norm_refuses_what_it_cannot_fuse() -> None:
    x = torch.randn(2, 16)
    with pytest.raises(ValueError, match="not torch.float16"):
        small_rows_product(x.half(), torch.randn(4, 16).half(), Tiles(),
                           add_norm=AddNorm(None, torch.ones(16).half(), 1e-6))  # fmt: skip
    with pytest.raises(ValueError, match="residual must be laid out as x"):
        small_rows_product(x, torch.randn(4, 16), Tiles(),
                           add_norm=AddNorm(torch.randn(1, 16), torch.ones(16), 1e-6,
                                            torch.empty(2, 16)))  # fmt: skip


def _rows_exact_in_e4m3(rows: int, depth: int, block_k: int, g) -> torch.Tensor:
    """Rows whose every slice of block_k columns holds e4m3 values times a power of two, with
    448 (e4m3's largest) times it among them: the a8 tiles' per-slice quantization is then
    exact, so the product must equal x's. (Triton's interpreter rounds some float32 to e4m3
    conversions to half their value; the GPU test holds a8 to a rounding reference.)"""
    x = torch.randn(rows, depth, generator=g).mul(60).to(E4M3).float().clamp(-448, 448)
    for start in range(0, depth, block_k):
        x[:, start] = 448.0
        powers = torch.randint(-6, 3, (rows, 1), generator=g).float()
        x[:, start : start + block_k] *= torch.exp2(powers)
    return x


@pytest.mark.parametrize("tiles", [Tiles(block_n=16, block_k=32, a8=True),
                                   Tiles(block_n=32, block_k=64, splits=3, a8=True)])  # fmt: skip
@pytest.mark.parametrize("gated", [False, True])
def test_a8_tiles_quantize_each_slice_of_the_rows_with_its_own_scale(
    tiles: Tiles, gated: bool
) -> None:
    from aioworker.compute.layers.quantized.fp8 import quantize_rows

    g = torch.Generator().manual_seed(11)
    x = _rows_exact_in_e4m3(5, 200, tiles.block_k, g)
    weight, scale = quantize_rows(torch.randn(2 * 24, 200, generator=g) / 3000)  # silu in range
    got = small_rows_product(x.to(DEVICE), weight.to(DEVICE), tiles, scale.to(DEVICE), gated)
    want = reference(x, weight, scale, gated=gated)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-3)


def test_a8_tiles_take_e4m3_weights_on_tensor_cores_only() -> None:
    with pytest.raises(ValueError, match="a8 tiles multiply e4m3"):
        small_rows_product(torch.randn(2, 32), torch.randn(4, 32), Tiles(a8=True))


BITS_TILES = [Tiles(dot=False, block_n=16, block_k=64, bits=True),
              Tiles(dot=False, block_n=8, block_k=32, splits=3, bits=True)]  # fmt: skip


@pytest.mark.parametrize("tiles", [*BITS_TILES, Tiles(block_n=16, block_k=32, bits=True)])
def test_bits_widen_every_e4m3_and_int8_value_exactly(tiles: Tiles) -> None:
    """Every e4m3 byte but NaN (subnormals, both zeros) and every int8 value, widened by bit
    operations (widening.py), to float32 for the FMA tiles and then to the rows' dtype for the
    tensor cores: the product equals the one of the values widened by torch."""
    e4m3_bytes = torch.tensor([b for b in range(256) if b & 0x7F != 0x7F], dtype=torch.uint8)
    e4m3 = e4m3_bytes.view(E4M3)[torch.randperm(254)].reshape(2, 127)
    int8 = torch.arange(-128, 128, dtype=torch.int8)[torch.randperm(256)].reshape(2, 128)
    for weight in (e4m3, int8):
        x, scale = torch.randn(4 if tiles.dot else 1, weight.shape[1]), torch.rand(2) + 0.5
        got = small_rows_product(x.to(DEVICE), weight.to(DEVICE), tiles, scale.to(DEVICE))
        torch.testing.assert_close(got.cpu(), reference(x, weight, scale), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("tiles", [*BITS_TILES, Tiles(dot=False, block_n=16, block_k=128,
                                                      bits=True)])  # fmt: skip
def test_bits_widen_int4_values_exactly(tiles: Tiles) -> None:
    from aioworker.compute.layers.quantized.weight_only import (
        dequantize_int4_rows,
        quantize_int4_rows,
    )

    x, dense = torch.randn(1, 224).to(DEVICE), torch.randn(2 * 27, 224)
    packed, scales, offsets = (t.to(DEVICE) for t in quantize_int4_rows(dense))
    got = small_rows_product(x, packed, tiles, gated=True, int4_groups=(scales, offsets))
    want = reference(x, dequantize_int4_rows(packed, scales, offsets), gated=True)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-3)


def test_folding_splits_leave_every_arrival_count_at_zero() -> None:
    """The last program of each tile sets its count back: the next product (here the same one
    twice, and a gated one with more tiles) counts from zero, and nothing is left counted."""
    from aioworker.compute.layers.arrivals import arrival_counts

    x, weight = torch.randn(3, 96).to(DEVICE), torch.randn(2 * 40, 96).to(DEVICE)
    tiles = Tiles(block_n=16, block_k=16, splits=3, fold=True)
    for gated in (False, False, True):
        got = small_rows_product(x, weight, tiles, gated=gated)
        torch.testing.assert_close(got, reference(x, weight, gated=gated), rtol=1e-4, atol=1e-4)
    assert not arrival_counts(x.device).any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("tiles", [Tiles(block_n=16, block_k=32, bits=True),
                                   Tiles(block_n=32, block_k=16, splits=3, bits=True)])  # fmt: skip
def test_bits_dot_tiles_scale_int4_sums_per_group(dtype: torch.dtype, tiles: Tiles) -> None:
    """int4 on tensor cores with bits: q - 8 made by bit operations in the rows' dtype (fp16:
    0x6400 | q), multiplied as is, each group's scale and offset applied to the sums."""
    from aioworker.compute.layers.quantized.weight_only import (
        dequantize_int4_rows,
        quantize_int4_rows,
    )

    g = torch.Generator().manual_seed(5)
    x, dense = torch.randn(6, 224, generator=g), torch.randn(2 * 27, 224, generator=g)
    packed, scales, offsets = quantize_int4_rows(dense)
    groups = (scales.to(DEVICE, dtype), offsets.to(DEVICE, dtype))
    got = small_rows_product(x.to(DEVICE, dtype), packed.to(DEVICE), tiles, gated=True,
                             int4_groups=groups)  # fmt: skip
    want = reference(x.to(dtype), dequantize_int4_rows(packed, *(t.cpu() for t in groups)),
                     gated=True)  # fmt: skip
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.cpu().float(), want, rtol=tolerance, atol=tolerance)


def test_bits_dot_tiles_on_int4_take_one_group_a_step() -> None:
    from aioworker.compute.layers.quantized.weight_only import quantize_int4_rows

    packed, scales, offsets = quantize_int4_rows(torch.randn(8, 128))
    with pytest.raises(ValueError, match="one group a step"):
        small_rows_product(torch.randn(2, 128), packed, Tiles(block_k=64, bits=True),
                           int4_groups=(scales, offsets))  # fmt: skip
