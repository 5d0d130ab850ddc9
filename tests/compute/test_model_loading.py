"""Which linear methods a model gets: the formats by device, refusals that name the key, and a
warning where a format is slower than what it replaces."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from aioworker.compute.layers import weight_only
from aioworker.compute.layers.quantized.weight_only import WINT4_ON_LOAD
from aioworker.compute.model_loading import linear_methods
from aioworker.config import ConfigError, load_config

UNQUANTIZED_CHECKPOINT = SimpleNamespace(quant_method="", quantization_config="")
CPU, CUDA = torch.device("cpu"), torch.device("cuda")  # CUDA is not touched for these formats


def config(**model):
    return load_config(overrides={f"model.{key}": value for key, value in model.items()})


def test_the_cpu_keeps_its_dense_weight_formats_and_the_gpu_holds_quantized_values() -> None:
    assert (
        linear_methods(UNQUANTIZED_CHECKPOINT, config(quantization="wint4"), CPU).projections
        is weight_only.WINT4
    )
    assert linear_methods(UNQUANTIZED_CHECKPOINT, config(quantization="wint4"), CUDA).projections is WINT4_ON_LOAD  # fmt: skip


def test_a_slow_gpu_format_is_said_to_be_slow(caplog) -> None:
    with caplog.at_level(logging.WARNING):
        linear_methods(UNQUANTIZED_CHECKPOINT, config(quantization="wint8"), CUDA)
    assert "'wint8' on a GPU saves weight memory but decodes about 5x slower" in caplog.text


@pytest.mark.parametrize(
    ("settings", "device", "message"),
    [
        ({"quantization": "fp8"}, CPU, "'fp8' needs a GPU with fp8 tensor cores"),
        ({"quantization": "wint4", "quantize_lm_head": True}, CUDA, "quantize_lm_head runs on the CPU only"),
    ],
)  # fmt: skip
def test_refusals_name_the_key(settings, device, message) -> None:
    with pytest.raises(ConfigError, match=message):
        linear_methods(UNQUANTIZED_CHECKPOINT, config(**settings), device)
