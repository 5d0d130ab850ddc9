"""Which linear methods a model gets: the formats by device, refusals that name the key, and a
warning where a format is slower than what it replaces."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from aioworker.compute.layers import weight_only
from aioworker.compute.layers.gemv.method import SmallRows
from aioworker.compute.layers.quantized.head_copy import QuantizedCopy
from aioworker.compute.layers.quantized.weight_only import WINT4_ON_LOAD, wint4_on_load
from aioworker.compute.model_loading import linear_methods
from aioworker.config import ConfigError, load_config

UNQUANTIZED_CHECKPOINT = SimpleNamespace(quant_method="", quantization_config="")
CPU, CUDA = torch.device("cpu"), torch.device("cuda")  # CUDA is not touched for these formats


def config(kernels: bool = True, **model):
    overrides = {f"model.{key}": value for key, value in model.items()}
    return load_config(overrides={**overrides, "device.small_batch_kernels": kernels})


def test_the_cpu_keeps_its_dense_weight_formats_and_the_gpu_holds_quantized_values() -> None:
    assert (
        linear_methods(UNQUANTIZED_CHECKPOINT, config(quantization="wint4"), CPU).projections
        is weight_only.WINT4
    )
    plain = linear_methods(UNQUANTIZED_CHECKPOINT, config(False, quantization="wint4"), CUDA)
    assert plain.projections is WINT4_ON_LOAD


def test_model_int4_group_gives_wint4_its_groups_on_either_device() -> None:
    grouped = config(quantization="wint4", int4_group=128)
    on_cpu = linear_methods(UNQUANTIZED_CHECKPOINT, grouped, CPU).projections
    assert on_cpu is weight_only.wint4(128) and on_cpu.group == 128
    on_cuda = linear_methods(UNQUANTIZED_CHECKPOINT, grouped, CUDA).projections
    assert on_cuda.inner.group == 128 and on_cuda.inner.shapes(8, 256)["weight_scale"].shape == (
        8,
        2,
    )
    with pytest.raises(ConfigError, match="int4_group"):
        config(quantization="wint4", int4_group=100)


def test_on_cuda_the_small_rows_kernels_wrap_the_formats_and_never_on_the_cpu() -> None:
    """device.small_batch_kernels (on by default): decode's few rows go to compute/layers/gemv/
    on CUDA; the CPU keeps its methods as they are."""
    on_cuda = linear_methods(UNQUANTIZED_CHECKPOINT, config(quantization="wint4"), CUDA)
    assert isinstance(on_cuda.projections, SmallRows) and on_cuda.projections.inner is WINT4_ON_LOAD
    assert isinstance(on_cuda.lm_head, SmallRows)
    on_cpu = linear_methods(UNQUANTIZED_CHECKPOINT, config(quantization="wint4"), CPU)
    assert on_cpu.projections is weight_only.WINT4


@pytest.mark.parametrize(
    ("kernels", "said"),
    [(False, "decodes about 5x slower"), (True, "decodes faster than bf16 up to 8 rows")],
)
def test_a_slow_gpu_format_is_said_to_be_slow(caplog, kernels: bool, said: str) -> None:
    with caplog.at_level(logging.WARNING):
        linear_methods(UNQUANTIZED_CHECKPOINT, config(kernels, quantization="wint8"), CUDA)
    assert f"'wint8' on a GPU saves weight memory but {said}" in caplog.text


def test_refusals_name_the_key() -> None:
    with pytest.raises(ConfigError, match="'fp8' needs a GPU with fp8 tensor cores"):
        linear_methods(UNQUANTIZED_CHECKPOINT, config(quantization="fp8"), CPU)
    quantized = SimpleNamespace(quant_method="compressed-tensors", quantization_config={})
    with pytest.raises(ConfigError, match="quantize_lm_head .* quantized already"):
        linear_methods(quantized, config(quantize_lm_head=True), CUDA)


@pytest.mark.parametrize("kernels", [False, True])
def test_on_a_gpu_a_quantized_lm_head_is_a_copy_in_the_format(kernels: bool) -> None:
    settings = config(kernels, quantization="wint4", quantize_lm_head=True, int4_group=128)
    methods = linear_methods(UNQUANTIZED_CHECKPOINT, settings, CUDA)
    head = methods.lm_head.inner if kernels else methods.lm_head
    assert isinstance(methods.lm_head, SmallRows) == kernels
    projections = methods.projections.inner if kernels else methods.projections
    assert isinstance(head, QuantizedCopy) and head.format is projections is wint4_on_load(128)
    plain = linear_methods(UNQUANTIZED_CHECKPOINT, config(kernels, quantization="wint8"), CUDA)
    assert not isinstance(getattr(plain.lm_head, "inner", plain.lm_head), QuantizedCopy)
