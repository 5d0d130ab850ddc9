"""The LM head's quantized copy (model.quantize_lm_head on a GPU; the formats run on the CPU here):
logits as the format's dequantized copy gives them, the dense weight kept (a tied embedding still
looks up dense rows) and nothing registered for the loader, the copy refreshed in place after an
update, dropped on release and made again on resume, and only the copy's bytes counted."""

from __future__ import annotations

import pytest
import torch

from aioworker.compute.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from aioworker.compute.layers.linear_method import drop_derived, process_after_loading
from aioworker.compute.layers.quantized import fp8
from aioworker.compute.layers.quantized.head_copy import QuantizedCopy
from aioworker.compute.layers.quantized.weight_only import (
    WINT4_ON_LOAD,
    WINT8_ON_LOAD,
    dequantize_int4_rows,
    wint4_on_load,
)
from aioworker.compute.parallel import SINGLE

FORMATS = [fp8.FP8, WINT8_ON_LOAD, WINT4_ON_LOAD, wint4_on_load(128)]
VOCAB, HIDDEN = 96, 256


def dequantized(copy) -> torch.Tensor:
    if copy.weight.dtype == torch.uint8:
        return dequantize_int4_rows(copy.weight, copy.weight_scale, copy.weight_offset)
    return copy.weight.float() * copy.weight_scale.float()[:, None]


def head(fmt, seed: int = 0) -> ParallelLMHead:
    layer = ParallelLMHead(VOCAB, HIDDEN, SINGLE, QuantizedCopy(fmt))
    g = torch.Generator().manual_seed(seed)
    layer.weight.data = torch.randn(VOCAB, HIDDEN, generator=g).bfloat16()
    return layer


def fmt_id(fmt) -> str:
    return f"{fmt.name}-group-{fmt.group}" if hasattr(fmt, "group") else fmt.name


@pytest.mark.parametrize("fmt", FORMATS, ids=fmt_id)
def test_logits_come_from_the_quantized_copy_and_the_dense_weight_stays(fmt) -> None:
    layer = head(fmt)
    dense = layer.weight.data.clone()
    process_after_loading(layer)
    copy = layer.linear_method.copy_of(layer)
    assert [name for name, _ in layer.named_parameters()] == ["weight"]  # the loader's view
    assert torch.equal(layer.weight.data, dense) and layer.weight.dtype == torch.bfloat16
    x = torch.randn(3, HIDDEN, dtype=torch.bfloat16)
    want = x.float() @ dequantized(copy).t()
    got = layer.compute_logits(x).float()
    error = (got - want).abs().max() / want.abs().max()
    assert error < (0.08 if fmt is fp8.FP8 else 0.02)
    # and not the dense weight's logits: the copy is what was multiplied
    assert not torch.allclose(got, x.float() @ dense.float().t(), atol=1e-3, rtol=1e-3)
    dense_bytes = VOCAB * HIDDEN * 2
    assert layer.linear_method.weight_bytes(layer) == fmt.weight_bytes(copy) < dense_bytes * 0.6


@pytest.mark.parametrize("fmt", [WINT8_ON_LOAD, WINT4_ON_LOAD], ids=["wint8", "wint4"])
def test_an_update_refreshes_the_copy_in_place_and_resume_makes_it_again(fmt) -> None:
    layer = head(fmt)
    process_after_loading(layer)
    copy = layer.linear_method.copy_of(layer)
    pointers = {name: getattr(copy, name).data_ptr() for name in copy.quantized_names}
    x = torch.randn(2, HIDDEN, dtype=torch.bfloat16)
    before = layer.compute_logits(x)
    layer.weight.data.copy_(head(fmt, seed=1).weight.data)  # a committed weights update
    process_after_loading(layer)
    assert layer.linear_method.copy_of(layer) is copy
    assert {name: getattr(copy, name).data_ptr() for name in copy.quantized_names} == pointers
    after = layer.compute_logits(x)
    fresh = head(fmt, seed=1)
    process_after_loading(fresh)
    assert torch.equal(after, fresh.compute_logits(x)) and not torch.equal(after, before)
    drop_derived(layer)  # release
    with pytest.raises(RuntimeError, match="quantized copy is made after loading"):
        layer.compute_logits(x)
    process_after_loading(layer)  # resume
    assert torch.equal(layer.compute_logits(x), after)


def test_a_tied_embedding_keeps_looking_up_dense_rows() -> None:
    embedding = VocabParallelEmbedding(VOCAB, HIDDEN, SINGLE)
    embedding.weight.data = torch.randn(VOCAB, HIDDEN).bfloat16()
    layer = ParallelLMHead(VOCAB, HIDDEN, SINGLE, QuantizedCopy(WINT8_ON_LOAD))
    layer.weight = embedding.weight
    process_after_loading(layer)
    tokens = torch.tensor([0, 5, 95])
    assert torch.equal(embedding(tokens), embedding.weight.data[tokens])
    assert layer.linear_method.copy_of(layer).weight.dtype == torch.int8


@pytest.mark.parametrize("fmt", FORMATS, ids=fmt_id)
def test_a_tensor_parallel_shards_copy_is_the_whole_copys_rows(fmt) -> None:
    """Vocabulary-parallel heads: each rank quantizes its own rows (per-row scales, groups
    along the hidden size), so the shards' copies together are the whole head's copy."""
    from aioworker.compute.parallel import TensorParallel

    whole = head(fmt)
    process_after_loading(whole)
    shards = []
    for rank in range(2):
        shard = ParallelLMHead(VOCAB, HIDDEN, TensorParallel(rank, 2), QuantizedCopy(fmt))
        shard.weight.data = whole.weight.data[rank * VOCAB // 2 : (rank + 1) * VOCAB // 2].clone()
        process_after_loading(shard)
        shards.append(dequantized(shard.linear_method.copy_of(shard)))
    assert torch.equal(torch.cat(shards), dequantized(whole.linear_method.copy_of(whole)))
