"""The linear-method seam: the dense method multiplies as torch does; the CPU's packed method
derives its copy after loading, multiplies by it, and falls back to the dense weight once the
copy is dropped; a model's layers all go through their method."""

from __future__ import annotations

import pytest
import torch

from aioworker.compute.layers import cpu_packing
from aioworker.compute.layers.linear import column_parallel
from aioworker.compute.layers.linear_method import (
    UNQUANTIZED,
    drop_derived,
    methods_in,
    process_after_loading,
)
from aioworker.compute.parallel import SINGLE


def layer_with(method):
    layer = column_parallel(64, [48], bias=True, tp=SINGLE, linear_method=method)
    torch.nn.init.normal_(layer.weight)
    torch.nn.init.normal_(layer.bias)
    return layer


def test_the_dense_method_multiplies_as_torch_does() -> None:
    layer = layer_with(UNQUANTIZED)
    x = torch.randn(5, 64)
    assert torch.equal(layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias))


@pytest.mark.skipif(not cpu_packing.is_available(torch.device("cpu")), reason="no oneDNN")
def test_the_packed_method_uses_its_copy_until_it_is_dropped() -> None:
    layer = layer_with(cpu_packing.CPU_PACKED)
    x = torch.randn(5, 64)
    expected = torch.nn.functional.linear(x, layer.weight, layer.bias)
    process_after_loading(layer)
    assert layer.packed_weight is not None
    torch.testing.assert_close(layer(x), expected, rtol=1e-4, atol=1e-4)
    layer.weight.data.zero_()  # the copy, not the dense weight, is what it multiplies by
    torch.testing.assert_close(layer(x), expected, rtol=1e-4, atol=1e-4)
    drop_derived(layer)
    assert layer.packed_weight is None
    assert torch.equal(layer(x), layer.bias.expand(5, -1))


def test_every_projection_and_the_lm_head_of_a_model_have_a_method(embedded_engine) -> None:
    model = embedded_engine.executor.runner.model
    layers = [layer for layer, _ in methods_in(model)]
    num_layers = len(model.model.layers)
    assert len(layers) == 4 * num_layers + 1  # qkv, o, gate_up, down; the LM head
    assert model.lm_head in layers
