"""int4's blocks layout and its one-row kernel (int4_blocks.py) against the dequantized product:
the layout's places, the widening's eight values a word, uneven K, split K, gating, groups of 32
and of 128 read in place, and the method choosing it from the table (Triton's interpreter on the
CPU; the PTX widening on the GPU with -m gpu, test_gpu_gemv.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from aioworker.compute.layers.gemv.int4_blocks import _words_as_float32  # noqa: E402
from aioworker.compute.layers.gemv.int4_blocks_dot import (  # noqa: E402
    _pairs_by_triton,
    in_pair_order,
)
from aioworker.compute.layers.gemv.product import AddNorm, small_rows_product  # noqa: E402
from aioworker.compute.layers.gemv.tiles import Tiles  # noqa: E402
from aioworker.compute.layers.quantized.weight_only import (  # noqa: E402
    dequantize_int4_rows,
    dequantize_int4_values,
    pack_int4_blocks,
    quantize_int4_rows,
    unpack_int4_blocks,
    unpack_nibbles,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BLOCKS_TILES = [
    Tiles(dot=False, blocks=True, block_n=16, block_k=64),
    Tiles(dot=False, blocks=True, block_n=8, block_k=128, splits=3),  # a slice past K's end
    Tiles(dot=False, blocks=True, block_n=16, block_k=32, splits=2, fold=True),
    Tiles(dot=False, blocks=True, block_n=8, block_k=32, num_stages=3, pipelined=True),
    # each step's words read during the step before; the last split passes K's end
    Tiles(dot=False, blocks=True, block_n=8, block_k=32, splits=3, ahead=True),
]


def reference(x, weight, gated=False):
    y = x.float() @ weight.float().T
    if gated:
        gate, up = y.chunk(2, dim=-1)
        y = F.silu(gate) * up
    return y


def test_the_layout_puts_each_value_where_the_kernel_reads_it() -> None:
    g = torch.Generator().manual_seed(0)
    values = torch.randint(0, 16, (3, 96), generator=g, dtype=torch.uint8)
    words = pack_int4_blocks(values)
    assert words.dtype == torch.int32 and words.shape == (3, 12)
    assert torch.equal(unpack_int4_blocks(words), values)
    for n, b, i, u in [(0, 0, 0, 0), (1, 2, 7, 3), (2, 1, 3, 2)]:
        bits = words[n, 4 * b + u].item() & 0xFFFFFFFF  # k = 32b+4i+u: bits 4i+3.. (mod 32)
        unrotated = (bits >> 3 | bits << 29) & 0xFFFFFFFF
        assert (unrotated >> 4 * i) & 0xF == values[n, 32 * b + 4 * i + u]
    with pytest.raises(ValueError, match="blocks of 32"):
        pack_int4_blocks(values[:, :40])


@triton.jit
def _widen(words_ptr, out_ptr, ASM: tl.constexpr):
    values = _words_as_float32(tl.load(words_ptr + tl.arange(0, 4)), ASM)
    for j in tl.static_range(8):
        tl.store(out_ptr + j * 4 + tl.arange(0, 4), values[j])


def test_a_word_widens_to_its_eight_values_plus_their_offsets() -> None:
    """Rotation t's slot A is value 3 + 2t read as 256 + q, slot B value 4 + 2t as 16 + q
    (mod 8): the order the kernel pairs them with x in. On the GPU, the PTX (ASM = 1) too."""
    values = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7], [9, 10, 11, 12, 13, 14, 15, 0],
                           [0] * 8, [15] * 8], dtype=torch.uint8)  # fmt: skip
    # One block: value i of word u is k = 4 i + u.
    words = pack_int4_blocks(values.t().reshape(1, 32))[0]
    want = torch.stack([
        values[:, (3 + 2 * t + slot) % 8].float() + (16.0 if slot else 256.0)
        for t in range(4) for slot in (0, 1)
    ])  # fmt: skip
    for asm in (1, 2) if DEVICE == "cuda" else (2,):
        got = torch.zeros(32, device=DEVICE)
        _widen[(1,)](words.to(DEVICE), got, asm)
        assert torch.equal(got.cpu().reshape(8, 4), want)


@pytest.mark.parametrize("tiles", BLOCKS_TILES)
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_row_equals_the_dequantized_product(tiles, gated, dtype) -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 224, generator=g).to(dtype)  # K: seven blocks, no multiple of a step
    packed, scales, offsets = quantize_int4_rows(torch.randn(2 * 27, 224, generator=g))
    blocks = pack_int4_blocks(unpack_nibbles(packed))
    got = small_rows_product(x.to(DEVICE), blocks.to(DEVICE), tiles, gated=gated,
                             int4_groups=(scales.to(DEVICE), offsets.to(DEVICE)))  # fmt: skip
    want = reference(x, dequantize_int4_rows(packed, scales, offsets), gated)
    if dtype == torch.float32:
        torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-3)
    else:  # the output rounded to bf16
        torch.testing.assert_close(got.cpu().float(), want, rtol=1e-2, atol=5e-2)


@triton.jit
def _ordered(words_ptr, out_ptr, BLOCK_N: tl.constexpr, BLOCKS: tl.constexpr):
    """The PTX path's ordering of its four pair tensors, fed pairs made by Triton's operations,
    against the tile Triton's operations make whole."""
    at = (tl.arange(0, BLOCK_N)[:, None, None] * BLOCKS * 4
          + tl.arange(0, BLOCKS)[None, :, None] * 4 + tl.arange(0, 4)[None, None, :])  # fmt: skip
    words = tl.load(words_ptr + at)  # [N, blocks, 4]
    whole = _pairs_by_triton(words, tl.full((BLOCK_N, BLOCKS), 1.0, tl.float32),
                             tl.zeros((BLOCK_N, BLOCKS), tl.float32), BLOCK_N, BLOCKS)  # fmt: skip
    bits = words.to(tl.uint32, bitcast=True)
    unrotated = (bits >> 3) | (bits << 29)
    ordered = in_pair_order(_pair(unrotated, 0), _pair(unrotated, 1), _pair(unrotated, 2),
                            _pair(unrotated, 3), BLOCK_N, BLOCKS)  # fmt: skip
    size: tl.constexpr = BLOCK_N * BLOCKS * 32
    flat = tl.reshape(ordered, (size,)) - tl.reshape(whole, (size,))
    tl.store(out_ptr + tl.arange(0, size), flat)


@triton.jit
def _pair(unrotated, t: tl.constexpr):
    """Pair t of each word, (value t, value t + 4) on a last axis, as q - 8."""
    halves = 16 * tl.arange(0, 2)[None, None, None, :]
    return ((unrotated[:, :, :, None] >> (4 * t + halves)) & 0xF).to(tl.float32) - 8.0


@pytest.mark.parametrize("blocks", [1, 8])
def test_the_ptx_pairs_are_put_in_the_order_of_the_columns(blocks: int) -> None:
    values = torch.randint(0, 16, (4, 32 * blocks), generator=torch.Generator().manual_seed(6))
    differences = torch.ones(4 * 32 * blocks, device=DEVICE)
    _ordered[(1,)](pack_int4_blocks(values).to(DEVICE), differences, 4, blocks)
    assert not differences.any()


DOT_BLOCKS_TILES = [
    Tiles(blocks=True, block_n=16, block_k=32),
    Tiles(blocks=True, block_n=16, block_k=256),  # groups of four blocks (k_order), and two
    Tiles(blocks=True, block_n=32, block_k=64, splits=3),  # a slice past K's end
    Tiles(blocks=True, block_n=16, block_k=32, splits=2, fold=True),
    Tiles(blocks=True, block_n=16, block_k=32, splits=3, ahead=True, num_stages=1),
    Tiles(blocks=True, block_n=16, block_k=64, splits=4, ahead=True),  # one step a slice
]


@pytest.mark.parametrize("rows", [1, 3, 8])
@pytest.mark.parametrize("tiles", DOT_BLOCKS_TILES)
@pytest.mark.parametrize("gated", [False, True])
def test_tensor_core_tiles_equal_the_dequantized_product(rows, tiles, gated) -> None:
    """int4_blocks_dot.py: the tile's columns and x's slice both in the pairs' order (float32
    rows here: Triton's operations make the tile; on the GPU bf16 rows take the PTX)."""
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 224, generator=g)
    packed, scales, offsets = quantize_int4_rows(torch.randn(2 * 27, 224, generator=g))
    blocks = pack_int4_blocks(unpack_nibbles(packed))
    got = small_rows_product(x.to(DEVICE), blocks.to(DEVICE), tiles, gated=gated,
                             int4_groups=(scales.to(DEVICE), offsets.to(DEVICE)))  # fmt: skip
    want = reference(x, dequantize_int4_rows(packed, scales, offsets), gated)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-3)


def test_tensor_core_tiles_take_the_residual_add_and_norm() -> None:
    """x's slice is loaded in the pairs' order: each column is added, normed and written back
    once all the same."""
    g = torch.Generator().manual_seed(4)
    x, residual = torch.randn(3, 224, generator=g), torch.randn(3, 224, generator=g)
    norm_weight = torch.rand(224, generator=g) + 0.5
    packed, scales, offsets = quantize_int4_rows(torch.randn(40, 224, generator=g))
    blocks = pack_int4_blocks(unpack_nibbles(packed))
    on_device = [t.to(DEVICE) for t in (x, residual, norm_weight, blocks, scales, offsets)]
    add_norm = AddNorm(*on_device[1:3], 1e-5, torch.empty_like(on_device[0]))
    h = x + residual
    normed = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5) * norm_weight
    want = reference(normed, dequantize_int4_rows(packed, scales, offsets))
    for ahead in (False, True):  # ahead: the words read a step early, x in its own step
        tiles = Tiles(blocks=True, block_n=16, block_k=64, splits=2, ahead=ahead)
        add_norm.residual_out.zero_()
        got = small_rows_product(on_device[0], on_device[3], tiles,
                                 int4_groups=tuple(on_device[4:]), add_norm=add_norm)  # fmt: skip
        torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-3)
        torch.testing.assert_close(add_norm.residual_out.cpu(), h)


# Raw tiles (Tiles.bits on tensor cores): a step within one group, the tile left at 128 + 8 q
# and each step's sums scaled (int4_blocks_dot.group_scaled).
RAW_TILES = [
    Tiles(blocks=True, bits=True, block_n=16, block_k=128),  # a step of one group
    Tiles(blocks=True, bits=True, block_n=32, block_k=64, splits=3),  # half a group, past K
    Tiles(blocks=True, bits=True, block_n=16, block_k=64, splits=2, fold=True),
    Tiles(blocks=True, bits=True, block_n=16, block_k=32, splits=2, ahead=True),
]


@pytest.mark.parametrize("rows", [1, 3, 8])
@pytest.mark.parametrize("tiles", RAW_TILES)
@pytest.mark.parametrize("gated", [False, True])
def test_raw_tensor_core_tiles_equal_the_dequantized_product(rows, tiles, gated) -> None:
    """Groups of 128 and 64 (a checkpoint's, read in place): the raw values' sums less the
    offsets' share (192 X) come to the product of the dequantized weights."""
    g = torch.Generator().manual_seed(rows + 10 * gated)
    for group in (g for g in (128, 64) if g >= tiles.block_k):
        values = torch.randint(0, 16, (2 * 24, 640), generator=g, dtype=torch.uint8)
        scales = torch.rand(48, 640 // group, generator=g) * 0.1
        offsets = torch.randn(48, 640 // group, generator=g) * 0.05
        x = torch.randn(rows, 640, generator=g) + 0.5  # x's sums far from zero
        want = reference(x, dequantize_int4_values(values, scales, offsets), gated)
        got = small_rows_product(x.to(DEVICE), pack_int4_blocks(values).to(DEVICE), tiles,
                                 gated=gated, int4_groups=(scales.to(DEVICE), offsets.to(DEVICE)))  # fmt: skip
        torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("rows", [1, 3])
def test_raw_tiles_take_the_residual_add_and_norm_and_refuse_a_step_across_groups(rows) -> None:
    """The step's sums of x are the normed x's, as the tensor cores multiply them (one row too,
    where unnormed x is summed from its row alone); a step must lie within one group
    (Tiles.int4_misfit)."""
    g = torch.Generator().manual_seed(5)
    x, residual = torch.randn(rows, 256, generator=g), torch.randn(rows, 256, generator=g)
    norm_weight = torch.rand(256, generator=g) + 0.5
    values = torch.randint(0, 16, (40, 256), generator=g, dtype=torch.uint8)
    scales, offsets = torch.rand(40, 2, generator=g) * 0.1, torch.randn(40, 2, generator=g) * 0.05
    h = x + residual
    normed = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5) * norm_weight
    want = reference(normed, dequantize_int4_values(values, scales, offsets))
    on_device = [t.to(DEVICE) for t in (x, residual, norm_weight, scales, offsets)]
    add_norm = AddNorm(*on_device[1:3], 1e-5, torch.empty_like(on_device[0]))
    blocks = pack_int4_blocks(values).to(DEVICE)
    tiles = Tiles(blocks=True, bits=True, block_n=16, block_k=64, splits=2)
    got = small_rows_product(on_device[0], blocks, tiles, int4_groups=tuple(on_device[3:]),
                             add_norm=add_norm)  # fmt: skip
    torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(add_norm.residual_out.cpu(), h)
    across = Tiles(blocks=True, bits=True, block_n=16, block_k=256)
    with pytest.raises(ValueError, match="one group a step"):
        small_rows_product(on_device[0], blocks, across, int4_groups=tuple(on_device[3:]))


def test_groups_of_128_read_in_place_as_a_checkpoint_stores_them() -> None:
    """A group spans four blocks; scales and offsets strided as the [G, N, 2] tensor torch's
    int4 kernel keeps."""
    g = torch.Generator().manual_seed(2)
    values = torch.randint(0, 16, (45, 512), generator=g, dtype=torch.uint8)
    scales_and_offsets = torch.rand(512 // 128, 45, 2, generator=g) - 0.5
    scales, offsets = scales_and_offsets[..., 0].t(), scales_and_offsets[..., 1].t()
    want = reference(x := torch.randn(1, 512, generator=g),
                     dequantize_int4_values(values, scales, offsets))  # fmt: skip
    # a step of half a group, of one group, and of two (each group's scales loaded once and
    # spread over its four blocks), also read a step ahead
    for tiles in (Tiles(dot=False, blocks=True, block_n=16, block_k=64, splits=2),
                  Tiles(blocks=True, block_n=16, block_k=64, splits=2),
                  Tiles(dot=False, blocks=True, block_n=16, block_k=128),
                  Tiles(dot=False, blocks=True, block_n=16, block_k=256, splits=2),
                  Tiles(dot=False, blocks=True, block_n=16, block_k=128, ahead=True),
                  Tiles(blocks=True, block_n=16, block_k=256, num_stages=1),
                  Tiles(blocks=True, block_n=16, block_k=128, ahead=True)):  # fmt: skip
        got = small_rows_product(x.to(DEVICE), pack_int4_blocks(values).to(DEVICE), tiles,
                                 int4_groups=(scales.to(DEVICE), offsets.to(DEVICE)))  # fmt: skip
        torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-3)


def test_refuses_what_the_blocks_tiles_cannot_take() -> None:
    packed, scales, offsets = quantize_int4_rows(torch.randn(8, 128))
    blocks, groups = pack_int4_blocks(unpack_nibbles(packed)), (scales, offsets)
    x, tiles = torch.randn(1, 128), Tiles(dot=False, blocks=True, block_n=8, block_k=64)
    with pytest.raises(ValueError, match="int32 words"):
        small_rows_product(x, packed, tiles, int4_groups=groups)
    with pytest.raises(ValueError, match="int32 words"):
        small_rows_product(x, packed, Tiles(blocks=True, block_k=32), int4_groups=groups)
    with pytest.raises(ValueError, match="blocks of 32"):
        small_rows_product(x, blocks, Tiles(dot=False, blocks=True, block_k=16), int4_groups=groups)
    with pytest.raises(ValueError, match="norm it first"):
        add_norm = AddNorm(None, torch.ones(128), 1e-5, None)
        small_rows_product(x, blocks, tiles, int4_groups=groups, add_norm=add_norm)
    with pytest.raises(ValueError, match="ahead tiles read int4's blocks layout"):
        small_rows_product(x, packed, Tiles(dot=False, block_k=64, ahead=True), int4_groups=groups)


@pytest.fixture
def blocks_in_the_table(monkeypatch, tmp_path):
    """A table naming blocks tiles for one row of gated 64x224 and 64x512 int4 products (groups
    of 32: those of 128 take them too, having no entry of their own)."""
    import json

    from aioworker.compute.layers.gemv import choice

    tiles = {"dot": False, "blocks": True, "block_n": 16, "block_k": 64, "splits": 2}
    entries = {"64x224 int4 gated one": tiles, "64x512 int4 gated one": tiles}
    path = tmp_path / "tuned.json"
    path.write_text(json.dumps({"device": "test", "tiles": entries}))
    monkeypatch.setattr(choice, "TABLE_PATH", path)
    choice.tuned_table.cache_clear()
    choice._choose.cache_clear()
    yield
    choice.tuned_table.cache_clear()
    choice._choose.cache_clear()


def test_the_method_multiplies_one_row_from_the_blocks_derived_at_load(
    blocks_in_the_table, monkeypatch
) -> None:
    """wint4's layer derives its blocks while loading; the method hands them to the kernel where
    the table names blocks tiles, and leaves the fused norm to the caller there."""
    from aioworker.compute.layers.gemv import product
    from aioworker.compute.layers.gemv.method import small_rows
    from aioworker.compute.layers.norm import RMSNorm
    from aioworker.compute.layers.quantized.weight_only import WINT4_ON_LOAD

    layer = torch.nn.Module()
    method = small_rows(WINT4_ON_LOAD, fuse_norm=True)
    with torch.device(DEVICE):  # the layout is derived where the kernels run
        method.create_weights(layer, 2 * 32, 224)
    WINT4_ON_LOAD.fill_dummy(layer, lambda dense: dense.normal_(generator=None))
    method.process_after_loading(layer)
    assert torch.equal(unpack_int4_blocks(layer.int4_blocks), unpack_nibbles(layer.weight))
    weights_multiplied = []
    real = product.small_rows_product

    def recorded(x, weight, tiles, *rest, **options):
        weights_multiplied.append((weight.dtype, tiles.blocks))
        return real(x, weight, tiles, *rest, **options)

    monkeypatch.setattr(product, "small_rows_product", recorded)
    x = torch.randn(1, 224, device=DEVICE)
    dense = dequantize_int4_rows(layer.weight, layer.weight_scale, layer.weight_offset)
    torch.testing.assert_close(method.apply_gated(layer, x), reference(x, dense, gated=True),
                               rtol=1e-3, atol=1e-2)  # fmt: skip
    assert weights_multiplied == [(torch.int32, True)]
    norm = RMSNorm(224, 1e-6).to(DEVICE)
    assert method.apply_normed(layer, x, None, norm, gated=True) is None
    assert weights_multiplied == [(torch.int32, True)]  # nothing launched for the normed call
    # A weights update re-derives the blocks in place: a captured graph reads the new values.
    blocks_memory = layer.int4_blocks.data_ptr()
    WINT4_ON_LOAD.fill_dummy(layer, lambda dense: dense.uniform_(-1.0, 1.0))
    method.process_after_loading(layer)
    assert layer.int4_blocks.data_ptr() == blocks_memory
    dense = dequantize_int4_rows(layer.weight, layer.weight_scale, layer.weight_offset)
    torch.testing.assert_close(method.apply_gated(layer, x), reference(x, dense, gated=True),
                               rtol=1e-3, atol=1e-2)  # fmt: skip


def test_groups_of_128_quantized_on_load_multiply_on_32s_blocks_tiles(
    blocks_in_the_table, monkeypatch
) -> None:
    """model.int4_group = 128: the layer holds a scale and offset a 128 inputs, the method finds
    the 32-group tiles (they take any group), and the kernel reads the groups as they are."""
    from aioworker.compute.layers.gemv import product
    from aioworker.compute.layers.gemv.method import small_rows
    from aioworker.compute.layers.quantized.weight_only import wint4_on_load

    layer = torch.nn.Module()
    inner = wint4_on_load(128)
    method = small_rows(inner)
    with torch.device(DEVICE):
        method.create_weights(layer, 2 * 32, 512)
    inner.fill_dummy(layer, lambda dense: dense.normal_(generator=None))
    method.process_after_loading(layer)
    assert layer.weight_scale.shape == (64, 4)
    tiles_used = []
    real = product.small_rows_product
    monkeypatch.setattr(product, "small_rows_product",
                        lambda x, w, tiles, *rest, **kw: tiles_used.append(tiles) or real(x, w, tiles, *rest, **kw))  # fmt: skip
    x = torch.randn(1, 512, device=DEVICE)
    dense = dequantize_int4_rows(layer.weight, layer.weight_scale, layer.weight_offset)
    torch.testing.assert_close(method.apply_gated(layer, x), reference(x, dense, gated=True),
                               rtol=1e-3, atol=1e-2)  # fmt: skip
    assert [t.blocks for t in tiles_used] == [True]
