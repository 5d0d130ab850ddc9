"""Weights fetched into L2 ahead of the products (compute/layers/weights_ahead.py): what each
layer's table holds, in which order, within the budget. The kernel's fetch is compiled for sm_90
by test_pdl.py and run on a GPU by test_gpu.py."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn

from aioworker.checkpoint.model_config import ModelConfig
from aioworker.compute.layers import weights_ahead
from aioworker.compute.layers.gemv.method import KernelOperands
from aioworker.compute.layers.linear_method import UNQUANTIZED, LinearMethods
from aioworker.compute.layers.weights_ahead import SLOT_BYTES, byte_span, decode_reads, slots
from aioworker.compute.loader import init_dummy_weights
from aioworker.compute.model_loading import build_model
from aioworker.compute.parallel import SINGLE


def tiny_model(layers: int = 3) -> nn.Module:
    cfg = ModelConfig(
        architecture="LlamaForCausalLM", vocab_size=384, hidden_size=64, intermediate_size=96,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    )  # fmt: skip
    methods = LinearMethods(UNQUANTIZED, UNQUANTIZED)
    model = build_model(cfg, 64, SINGLE, torch.device("cpu"), torch.float32, methods)
    init_dummy_weights(model, seed=0)
    return model


def covers(table: torch.Tensor) -> set[int]:
    """Every 16-byte unit the table's slots fetch."""
    return {a for address, size in table.tolist() for a in range(address, address + size, 16)}


def span_units(tensor: torch.Tensor) -> set[int]:
    first, size = byte_span(tensor)
    return set(range(first, first + size, 16))


def test_a_span_covers_every_element_of_a_strided_view_in_whole_16_byte_units() -> None:
    base = torch.zeros(6, 10, 2, dtype=torch.bfloat16)
    view = base[1:, :, 1].t()  # as int4's scales are read: every other element, transposed
    first, size = byte_span(view)
    assert first % 16 == 0 and size % 16 == 0
    for i in range(view.shape[0]):
        for j in range(view.shape[1]):
            at = view[i, j].data_ptr()
            assert first <= at and at + 2 <= first + size
    assert size < base.numel() * 2  # the view's span, not its whole storage
    assert byte_span(torch.zeros(0)) == (0, 0)


def test_slots_keep_the_order_and_stop_at_the_budget() -> None:
    a, b, c = (torch.zeros(n, dtype=torch.uint8) for n in (3 * SLOT_BYTES + 48, 4096, 4096))
    taken = slots([a, b, c], budget=3 * SLOT_BYTES + 48 + 1024)
    assert [size for _, size in taken] == [SLOT_BYTES] * 3 + [48, 1024]
    assert taken[0][0] == byte_span(a)[0] and taken[3][0] == byte_span(a)[0] + 3 * SLOT_BYTES
    assert taken[4][0] == byte_span(b)[0]  # b cut short; c not reached
    assert all(size % 16 == 0 and address % 16 == 0 for address, size in taken)


def test_each_layer_fetches_o_gate_up_down_then_the_next_qkv() -> None:
    model = tiny_model()
    layers = model.model.layers
    assert weights_ahead.bind(model, 64 << 20, device_type="cpu") == 3
    for index, layer in enumerate(layers):
        table = layer.self_attn.l2_ahead
        expected = [layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj]
        if index + 1 < len(layers):
            expected.append(layers[index + 1].self_attn.qkv_proj)
        weights = [linear.weight for linear in expected]
        assert table.dtype == torch.int64 and table.shape[1] == 2
        assert table[0, 0].item() == byte_span(weights[0])[0]  # the o projection first
        assert covers(table) == set().union(*(span_units(w) for w in weights))
    weights_ahead.unbind(model)
    assert all(attention.l2_ahead is None for attention in model.attention_layers())


def test_the_budget_cuts_the_table_and_nothing_on_another_device_is_taken() -> None:
    model = tiny_model()
    o_bytes = 64 * 64 * 4
    weights_ahead.bind(model, o_bytes + 32, device_type="cpu")
    table = model.model.layers[0].self_attn.l2_ahead
    assert table[:, 1].sum().item() == o_bytes + 32  # o whole, then 32 bytes of gate/up
    assert weights_ahead.bind(model, 64 << 20, device_type="cuda") == 0  # the weights are on CPU
    assert model.model.layers[0].self_attn.l2_ahead is None
    assert weights_ahead.bind(model, 0, device_type="cpu") == 0


def test_a_small_rows_layer_is_read_as_its_kernels_read_it() -> None:
    weight, blocks = torch.zeros(8, 4, dtype=torch.int32), torch.zeros(8, 4, dtype=torch.int32)
    scales, offsets = torch.zeros(8, 1), torch.zeros(8, 1)

    def layer_with(operands: KernelOperands) -> nn.Module:
        layer = nn.Module()
        layer.linear_method = SimpleNamespace(operands=lambda _: operands)
        return layer

    int4 = layer_with(KernelOperands(weight, None, (scales, offsets), blocks))
    assert all(t is u for t, u in zip(decode_reads(int4), (blocks, scales, offsets), strict=True))
    fp8 = layer_with(KernelOperands(weight, scales))
    assert all(t is u for t, u in zip(decode_reads(fp8), (weight, scales), strict=True))
    assert decode_reads(nn.Module()) == []  # nothing multiplied: nothing read
