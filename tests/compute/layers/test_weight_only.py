"""Weight-only int8 and int4: each round trip stays within its format's error bound, each
method multiplies a few rows as its dequantized weight would and more rows by the dense weight,
layers whose inputs no group divides are refused naming the setting, and a derived copy follows
the dense weight after an update."""

from __future__ import annotations

import pytest
import torch

from aioworker.compute.layers import weight_only
from aioworker.compute.layers.linear import column_parallel
from aioworker.compute.layers.linear_method import process_after_loading
from aioworker.compute.parallel import SINGLE


def test_int8_round_trip_is_within_half_a_step() -> None:
    w = torch.randn(96, 576)
    q, scales = weight_only.quantize_int8(w)
    error = (weight_only.dequantize_int8(q, scales) - w).abs()
    assert (error <= scales[:, None] / 2 + 1e-6).all()


@pytest.mark.parametrize("in_features", [1536, 576, 96])
def test_int4_round_trip_is_within_half_a_step(in_features: int) -> None:
    group = weight_only.INT4_GROUP
    w = torch.randn(64, in_features)
    q, scales_and_zeros, chosen = weight_only.quantize_int4(w)
    assert chosen == group and q.min() >= 0 and q.max() <= 15
    step = scales_and_zeros[..., 0].transpose(0, 1).repeat_interleave(group, dim=1)
    error = (weight_only.dequantize_int4(q, scales_and_zeros, group) - w).abs()
    assert (error <= step / 2 + 1e-5).all()


def test_int4_refuses_inputs_no_group_divides() -> None:
    with pytest.raises(ValueError, match="100 input features .* model.quantization = 'wint8'"):
        weight_only.quantize_int4(torch.randn(8, 100))
    # the embedded model's 576 inputs take groups of 64, not 128
    assert weight_only.quantize_int4(torch.randn(8, 576), 64)[2] == 64
    with pytest.raises(ValueError, match="groups of 128; .* or a smaller model.int4_group"):
        weight_only.quantize_int4(torch.randn(8, 576), 128)


def test_each_int4_group_has_one_method_and_32_is_the_default() -> None:
    assert weight_only.wint4(32) is weight_only.WINT4
    assert weight_only.wint4(64) is weight_only.wint4(64) and weight_only.wint4(64).group == 64


def quantized_layer(method, in_features: int = 576, out_features: int = 96):
    layer = column_parallel(in_features, [out_features], True, SINGLE, method)
    torch.nn.init.normal_(layer.weight)
    torch.nn.init.normal_(layer.bias)
    process_after_loading(layer)
    return layer


def dequantized(layer) -> torch.Tensor:
    if layer.linear_method is weight_only.WINT8:
        return weight_only.dequantize_int8(layer.int8_weight, layer.int8_scales)
    q, _, group = weight_only.quantize_int4(layer.weight.data, layer.linear_method.group)
    return weight_only.dequantize_int4(q, layer.int4_scales_and_zeros, group)  # as held: bf16


METHODS = [weight_only.WINT8, weight_only.WINT4, weight_only.wint4(64)]
IDS = ["wint8", "wint4", "wint4-group-64"]


@pytest.mark.parametrize("method", METHODS, ids=IDS)
@pytest.mark.parametrize("rows", [1, weight_only.MAX_QUANTIZED_ROWS])
def test_the_method_multiplies_by_its_dequantized_weight(method, rows: int) -> None:
    layer = quantized_layer(method)
    x = torch.randn(rows, 576)
    expected = torch.nn.functional.linear(x, dequantized(layer), layer.bias)
    # The product runs in bfloat16 (its activations rounded to 8 bits of mantissa).
    torch.testing.assert_close(layer(x), expected, rtol=2e-2, atol=0.3)


@pytest.mark.parametrize("method", METHODS, ids=IDS)
def test_more_rows_multiply_by_the_dequantized_weight(method) -> None:
    """The same values as the kernels multiply by: a request's tokens must not depend on how
    many rows its step had."""
    layer = quantized_layer(method)
    x = torch.randn(weight_only.MAX_QUANTIZED_ROWS + 1, 576)
    expected = torch.nn.functional.linear(x, dequantized(layer), layer.bias)
    torch.testing.assert_close(layer(x), expected, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias))


@pytest.mark.parametrize("method", METHODS, ids=IDS)
def test_processing_again_follows_an_updated_dense_weight(method) -> None:
    layer = quantized_layer(method)
    x = torch.randn(3, 576)
    before = layer(x)
    layer.weight.data.mul_(-1)  # what a committed update does: the dense weight changes
    process_after_loading(layer)
    torch.testing.assert_close(layer(x), -before + 2 * layer.bias, rtol=2e-2, atol=0.3)
