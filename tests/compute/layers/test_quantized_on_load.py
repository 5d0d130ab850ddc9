"""Formats quantized while loading (fp8, and wint8 / wint4 as on a GPU; all run on the CPU
here): each round trip stays within its format's bound; a layer loaded from a dense checkpoint
tensor holds no dense weight, and multiplies as its dequantized weight would, on the kernel
path and the dequantizing one; tensor-parallel shards quantize their own rows and columns;
dummy weights and staged updates go through the same quantization; a derived copy is refreshed
in place."""

from __future__ import annotations

import pytest
import torch

from aioworker.compute.layers import weight_only as cpu_weight_only
from aioworker.compute.layers.linear import RowParallelLinear, column_parallel
from aioworker.compute.layers.linear_method import process_after_loading
from aioworker.compute.layers.quantized import fp8, weight_only
from aioworker.compute.layers.quantized.weight_only import (
    WINT4_ON_LOAD,
    WINT8_ON_LOAD,
    wint4_on_load,
)
from aioworker.compute.loader import init_dummy_weights, load_weights
from aioworker.compute.parallel import SINGLE, TensorParallel
from aioworker.compute.weights.staging import commit, stage

# wint4 in groups of 128 too (model.int4_group): two groups of the 256 inputs, one a half
METHODS = [fp8.FP8, WINT8_ON_LOAD, WINT4_ON_LOAD, wint4_on_load(128)]


def method_id(method) -> str:
    group = getattr(method, "group", 32)
    return method.name if group == 32 else f"{method.name}-group-{group}"


def dequantized(layer) -> torch.Tensor:
    if layer.linear_method is fp8.FP8:
        return fp8.dequantize_rows(layer.weight, layer.weight_scale)
    if layer.linear_method is WINT8_ON_LOAD:
        return layer.weight.float() * layer.weight_scale.float()[:, None]
    return weight_only.dequantize_int4_rows(layer.weight, layer.weight_scale, layer.weight_offset)


def test_fp8_round_trip_is_within_e4m3_precision() -> None:
    w = torch.randn(64, 256)
    q, scales = fp8.quantize_rows(w)
    error = (fp8.dequantize_rows(q, scales) - w).abs()
    # three mantissa bits: half a step is 1/16 of the value; subnormals step by 2^-9 * scale
    assert (error <= w.abs() / 16 + scales[:, None] * 2**-9 + 1e-7).all()
    assert torch.equal(q.float().abs().amax(dim=1), torch.full((64,), 448.0))


@pytest.mark.parametrize("group", [cpu_weight_only.INT4_GROUP, 128])
def test_int4_rows_round_trip_is_within_half_a_step(group: int) -> None:
    w = torch.randn(32, 256)
    packed, scales, offsets = weight_only.quantize_int4_rows(w, group)
    assert packed.dtype == torch.uint8 and packed.shape == (32, 128)
    assert scales.shape == offsets.shape == (32, 256 // group)
    step = scales.float().repeat_interleave(group, dim=1)
    error = (weight_only.dequantize_int4_rows(packed, scales, offsets) - w).abs()
    assert (error <= step / 2 + 1e-5).all()


def test_the_gpu_formats_quantize_exactly_as_the_cpu_methods_do() -> None:
    """So the CPU's accuracy figures (tests/test_quantization.py) hold for them."""
    from aioworker.compute.layers import weight_only as cpu

    w = torch.randn(128, 256)
    int8 = merged_layer(WINT8_ON_LOAD, dtype=torch.float32)
    load_parts(int8, {"a": w, "b": torch.zeros(64, 256)})
    q8, s8 = cpu.quantize_int8(w.bfloat16().float())
    assert torch.equal(int8.proj.weight[:128], q8)
    assert torch.equal(int8.proj.weight_scale[:128], s8.to(torch.bfloat16))
    packed, scales, offsets = weight_only.quantize_int4_rows(w)
    q4, sz, group = cpu.quantize_int4(w)
    assert torch.equal(
        weight_only.dequantize_int4_rows(packed, scales, offsets),
        cpu.dequantize_int4(q4, sz, group),
    )


class Module(torch.nn.Module):
    """A named home for a layer, as load_weights expects."""

    def __init__(self, layer) -> None:
        super().__init__()
        self.x = torch.nn.Module()
        self.x.proj = layer

    @property
    def proj(self):
        return self.x.proj


def merged_layer(method, tp=SINGLE, dtype=torch.bfloat16):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # as build_model does: the model's dtype
    try:
        return Module(column_parallel(256, [128, 64], False, tp, method))
    finally:
        torch.set_default_dtype(previous)


def dense_parts(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {name: torch.randn(rows, 256, generator=g) for name, rows in (("a", 128), ("b", 64))}


def load_parts(module, parts, targets=None) -> None:
    module.packed_modules = {"a": ("proj", 0), "b": ("proj", 1)}
    tensors = ((f"x.{name}.weight", t.to(torch.bfloat16)) for name, t in parts.items())
    load_weights(module, iter(tensors), progress=False, targets=targets)


@pytest.mark.parametrize("method", METHODS, ids=method_id)
def test_a_layer_loaded_from_dense_parts_holds_only_quantized_values(method) -> None:
    module = merged_layer(method)
    load_parts(module, dense_parts())
    layer = module.proj
    process_after_loading(module)
    assert layer.weight.dtype in (torch.float8_e4m3fn, torch.int8, torch.uint8)
    assert not any(
        p.dtype == torch.bfloat16 and p.dim() == 2 and p.shape[1] == 256 for p in layer.parameters()
    )
    dense = torch.cat(list(dense_parts().values()))
    weights = dequantized(layer)
    torch.testing.assert_close(weights, dense.bfloat16().float(), atol=0.6, rtol=0.15)
    for rows in (1, 3, 40):  # the kernel below MAX_KERNEL_ROWS, the dequantizing path above
        x = torch.randn(rows, 256, dtype=torch.bfloat16)
        expected = x.float() @ weights.t()
        error = (layer(x).float() - expected).abs().max() / expected.abs().max()
        assert error < (0.08 if method is fp8.FP8 else 0.02), (rows, error)


@pytest.mark.parametrize("method", METHODS, ids=method_id)
def test_tensor_parallel_shards_quantize_their_own_rows(method) -> None:
    whole = merged_layer(method)
    load_parts(whole, dense_parts())
    halves = [merged_layer(method, TensorParallel(rank, 2)) for rank in range(2)]
    for half in halves:
        load_parts(half, dense_parts())
    # per-row formats: a shard's rows are exactly the whole layer's rows
    a0, b0 = dequantized(halves[0].proj).split([64, 32])
    a1, b1 = dequantized(halves[1].proj).split([64, 32])
    assert torch.equal(torch.cat([a0, a1, b0, b1]), dequantized(whole.proj))


@pytest.mark.parametrize("method", METHODS, ids=method_id)
def test_a_row_parallel_shard_quantizes_its_own_columns(method) -> None:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        layers = [
            Module(RowParallelLinear(256, 64, False, TensorParallel(r, 2), linear_method=method))
            for r in range(2)
        ]
    finally:
        torch.set_default_dtype(previous)
    dense = torch.randn(64, 256)
    for rank, module in enumerate(layers):
        load_weights(module, iter([("x.proj.weight", dense.bfloat16())]), progress=False)
        columns = dense.bfloat16().float()[:, rank * 128 : (rank + 1) * 128]
        torch.testing.assert_close(dequantized(module.proj), columns, atol=0.6, rtol=0.15)


@pytest.mark.parametrize("method", METHODS, ids=method_id)
def test_dummy_weights_are_quantized_dense_draws(method) -> None:
    module = merged_layer(method)
    init_dummy_weights(module, seed=3)
    weights = dequantized(module.proj)
    assert weights.abs().max() <= 0.05 * 1.07 and weights.abs().max() > 0.04
    assert weights.std() > 0.02


@pytest.mark.parametrize("method", METHODS, ids=method_id)
def test_dummy_weights_reach_a_format_wrapped_for_the_small_rows_kernels(method) -> None:
    """On a GPU the formats are wrapped for decode's kernels (gemv SmallRows). The wrapper once
    hid `fill_dummy`, so a dummy load left the quantized weights as torch.empty had them: W4's
    wint8 and wint4 engines were NaN from their first layer."""
    from aioworker.compute.layers.gemv.method import SmallRows

    plain, wrapped = merged_layer(method), merged_layer(SmallRows(method))
    init_dummy_weights(plain, seed=3)
    init_dummy_weights(wrapped, seed=3)
    drawn = dict(plain.named_parameters())
    for name, param in wrapped.named_parameters():
        assert torch.equal(param, drawn[name]), name


@pytest.mark.parametrize("method", METHODS, ids=method_id)
def test_a_staged_update_is_quantized_and_committed_in_place(method) -> None:
    module = merged_layer(method)
    load_parts(module, dense_parts(0))
    process_after_loading(module)
    pointers = {name: p.data_ptr() for name, p in module.named_parameters()}
    derived = getattr(module.proj, "int4_tiled", None)
    x = torch.randn(2, 256, dtype=torch.bfloat16)
    before = module.proj(x)

    fresh = merged_layer(method)
    load_parts(fresh, dense_parts(1))
    process_after_loading(fresh)
    staged = stage(
        module, iter([(f"x.{n}.weight", t.bfloat16()) for n, t in dense_parts(1).items()])
    )
    commit(module, staged)
    assert {name: p.data_ptr() for name, p in module.named_parameters()} == pointers
    if derived is not None:
        assert module.proj.int4_tiled is derived  # refreshed in place: graphs stay valid
    assert torch.equal(module.proj(x), fresh.proj(x))
    assert not torch.equal(module.proj(x), before)


@pytest.mark.parametrize("method", METHODS, ids=method_id)
def test_each_dense_slice_is_quantized_once_for_all_its_parameters(method, monkeypatch) -> None:
    calls = []
    original = type(method).quantize
    monkeypatch.setattr(
        type(method), "quantize", lambda self, dense: calls.append(1) or original(self, dense)
    )
    module = merged_layer(method)
    load_parts(module, dense_parts())
    assert len(calls) == 2  # one per part, whatever the number of parameters
    assert module.proj._quantized_slice is None  # nothing held after the last sibling
