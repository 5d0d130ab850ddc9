"""A rank's weights summary: the projections' method, every weight tensor held counted once (a
tied LM head, a view, a packed or quantized copy), and the bytes a decode step reads."""

from __future__ import annotations

import logging

import pytest
import torch

from aioworker.checkpoint.model_config import ModelConfig
from aioworker.compute.layers import cpu_packing
from aioworker.compute.layers.linear_method import (
    UNQUANTIZED,
    LinearMethods,
    methods_in,
    process_after_loading,
)
from aioworker.compute.layers.weight_only import WINT4, WINT8
from aioworker.compute.loader import init_dummy_weights
from aioworker.compute.model_loading import build_model
from aioworker.compute.parallel import SINGLE
from aioworker.compute.weights.summary import WeightsSummary, summarize
from tests.conftest import make_engine
from tests.tiny_models import build_tiny_model

HIDDEN, VOCAB = 64, 384


def tiny_model(projections=UNQUANTIZED, tied: bool = False) -> torch.nn.Module:
    cfg = ModelConfig(
        architecture="LlamaForCausalLM", vocab_size=VOCAB, hidden_size=HIDDEN,
        intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, tie_word_embeddings=tied,
    )  # fmt: skip
    methods = LinearMethods(projections, UNQUANTIZED)
    model = build_model(cfg, 64, SINGLE, torch.device("cpu"), torch.float32, methods)
    init_dummy_weights(model, seed=0)
    process_after_loading(model)
    return model


def parameter_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def test_dense_weights_are_the_parameters_and_a_step_reads_the_linear_layers() -> None:
    model = tiny_model()
    summary = summarize({"": model})
    read = sum(layer.weight.numel() * 4 for layer, _ in methods_in(model))
    assert summary == WeightsSummary("none", parameter_bytes(model), read)
    assert summary.bytes_held > summary.bytes_read  # the embedding and norms are held, not read


def test_a_tied_lm_head_is_counted_once() -> None:
    untied, tied = summarize({"": tiny_model()}), summarize({"": tiny_model(tied=True)})
    assert untied.bytes_held - tied.bytes_held == VOCAB * HIDDEN * 4
    assert tied.bytes_read == untied.bytes_read  # the head still reads its (shared) weight


def test_a_view_of_a_held_tensor_adds_nothing() -> None:
    model = tiny_model()
    before = summarize({"": model}).bytes_held
    layer = model.model.layers[0].mlp.down_proj
    layer.first_rows = layer.weight.data[:2]  # derived state that shares the weight's storage
    assert summarize({"": model}).bytes_held == before


@pytest.mark.parametrize("method", [WINT8, WINT4], ids=["wint8", "wint4"])
def test_weight_only_reads_fewer_bytes_and_holds_its_copies_too(method) -> None:
    model = tiny_model(method)
    dense, quantized = summarize({"": tiny_model()}), summarize({"": model})
    assert quantized.quantization == method.name
    assert quantized.bytes_read < dense.bytes_read
    # The dense weight stays beside the quantized copies a step reads.
    copies = sum(method.weight_bytes(layer) for layer, m in methods_in(model) if m is method)
    assert quantized.bytes_held >= dense.bytes_held + copies
    assert quantized.bytes_held >= quantized.bytes_read


def test_an_lm_heads_quantized_copy_is_held_and_read_in_its_place() -> None:
    from aioworker.compute.layers.quantized.head_copy import QuantizedCopy
    from aioworker.compute.layers.quantized.weight_only import WINT8_ON_LOAD

    dense = summarize({"": tiny_model()})
    model = tiny_model()
    model.lm_head.linear_method = QuantizedCopy(WINT8_ON_LOAD)
    process_after_loading(model)
    copied = summarize({"": model})
    copy_bytes = VOCAB * HIDDEN + VOCAB * 2  # int8 values and a bf16 scale a row
    assert copied.bytes_held == dense.bytes_held + copy_bytes
    assert copied.bytes_read == dense.bytes_read - VOCAB * HIDDEN * 4 + copy_bytes


def test_int4_reads_fewer_bytes_than_int8() -> None:
    int8, int4 = summarize({"": tiny_model(WINT8)}), summarize({"": tiny_model(WINT4)})
    assert int4.bytes_read < int8.bytes_read


@pytest.mark.skipif(not cpu_packing.is_available(torch.device("cpu")), reason="no oneDNN")
def test_packed_copies_are_held() -> None:
    dense = summarize({"": tiny_model()})
    packed = summarize({"": tiny_model(cpu_packing.CPU_PACKED)})
    assert packed.quantization == "cpu-packed"
    projections = dense.bytes_read - VOCAB * HIDDEN * 4
    assert packed.bytes_held >= dense.bytes_held + projections
    assert packed.bytes_read == dense.bytes_read


def test_a_separate_draft_adds_its_weights() -> None:
    target, draft = tiny_model(WINT4), tiny_model()
    alone, both = summarize({"": target}), summarize({"": target, "draft.": draft})
    draft_alone = summarize({"": draft})
    assert both.quantization == "wint4"  # the target's projections
    assert both.bytes_held == alone.bytes_held + draft_alone.bytes_held
    assert both.bytes_read == alone.bytes_read + draft_alone.bytes_read


def test_a_built_rank_reports_and_logs_its_summary(tmp_path, caplog) -> None:
    build_tiny_model("qwen2", tmp_path)  # a tied LM head
    settings = {"cache.num_blocks": 16, "model.max_model_len": 64, "model.quantization": "wint4"}
    with caplog.at_level(logging.INFO, logger="aioworker.compute.build_rank"):
        engine = make_engine(tmp_path, **settings)
    try:
        loaded = engine.loaded
        summary = summarize(engine.executor.runner.weight_models())
    finally:
        engine.close()
    assert summary.quantization == "wint4" and summary.bytes_held >= summary.bytes_read > 0
    assert (loaded.quantization, loaded.weight_bytes_held, loaded.weight_bytes_read) == summary
    held, read = summary.bytes_held / 2**20, summary.bytes_read / 2**20
    assert f"{held:.1f} MiB of weights held, {read:.1f} MiB read per decode step" in caplog.text
