"""Build a model's modules on a device and fill its weights: the target's and a separate draft's
alike (build_rank.py, draft_builder.py)."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from aioworker.checkpoint.model_config import ModelConfig
from aioworker.compute.layers import cpu_packing
from aioworker.compute.layers.gemv.method import kernel_devices, small_rows
from aioworker.compute.layers.linear_method import (
    UNQUANTIZED,
    LinearMethods,
    process_after_loading,
)
from aioworker.compute.layers.quantized.checkpoint_config import checkpoint_method
from aioworker.compute.layers.quantized.fp8 import FP8
from aioworker.compute.layers.quantized.head_copy import QuantizedCopy
from aioworker.compute.layers.quantized.weight_only import (
    WINT4_ON_LOAD,
    WINT8_ON_LOAD,
    wint4_on_load,
)
from aioworker.compute.layers.weight_only import WINT4, WINT8, wint4
from aioworker.compute.loader import (
    checkpoint_files,
    count_tensors,
    init_dummy_weights,
    iterate_checkpoint,
    load_weights,
)
from aioworker.compute.models.registry import model_class
from aioworker.compute.parallel import TensorParallel
from aioworker.config import ConfigError, WorkerConfig

log = logging.getLogger(__name__)

CPU_WEIGHT_ONLY = {"wint8": WINT8, "wint4": WINT4}
# Measured on the H200, Llama-3.1-8B shape, against bf16 (docs/benchmarks.md, W4 and W8).
SLOW_ON_GPU = {
    "wint8": "decodes about 5x slower than bf16 at batch 1 and 2x at 256",
    "wint4": "decodes faster than bf16 only at batch 1, and 3x slower at 256",
}
# Where the small-batch kernels (device.small_batch_kernels) change that.
SLOW_ON_GPU_WITH_KERNELS = {
    "wint8": "decodes faster than bf16 up to 8 rows (the small-batch kernels) and about 2x "
    "slower at 256",
}
ON_LOAD = {"fp8": FP8, "wint8": WINT8_ON_LOAD, "wint4": WINT4_ON_LOAD}


def linear_methods(cfg: ModelConfig, config: WorkerConfig, device: torch.device) -> LinearMethods:
    """The formats' methods (`_format_methods`); on CUDA with device.small_batch_kernels, decode's
    products of 1 to 8 rows go to the small-rows kernels (layers/gemv/) where a format has
    them."""
    methods = _format_methods(cfg, config, device)
    if device.type not in kernel_devices() or not config.device.small_batch_kernels:
        return methods
    switches = config.device
    early = switches.early_epilogue_loads
    projections = small_rows(
        methods.projections, switches.fused_norm_products, switches.norms_in_product_finish, early
    )
    return LinearMethods(projections, small_rows(methods.lm_head, early_loads=early))


def _format_methods(cfg: ModelConfig, config: WorkerConfig, device: torch.device) -> LinearMethods:
    """How the model's linear layers hold and multiply their weights: the projections as
    model.quantization (or a quantized checkpoint) says, the LM head dense; on the CPU the dense
    ones packed for oneDNN where it serves (device.cpu_packed_weights), elsewhere torch's dense
    matmul. On the CPU, weight-only formats keep the dense weight for prefill
    (layers/weight_only.py); elsewhere the quantized values are all that is held."""
    dense = UNQUANTIZED
    if config.device.cpu_packed_weights and cpu_packing.is_available(device):
        dense = cpu_packing.CPU_PACKED
    quantization = config.model.quantization
    if cfg.quant_method:
        if quantization != "none":
            raise ConfigError(
                f"the checkpoint is already quantized (quantization_config.quant_method "
                f"{cfg.quant_method!r}); set model.quantization to 'none' to load it as it is"
            )
        if config.model.quantize_lm_head:
            raise ConfigError(
                "model.quantize_lm_head quantizes the LM head with model.quantization's format; "
                f"this checkpoint is quantized already ({cfg.quant_method!r}) and its LM head "
                "loads as stored: set it to false"
            )
        return LinearMethods(checkpoint_method(cfg.quant_method, cfg.quantization_config), dense)
    if quantization == "none":
        return LinearMethods(dense, dense)
    if device.type == "cpu":
        if quantization == "fp8":
            raise ConfigError(
                "model.quantization 'fp8' needs a GPU with fp8 tensor cores (Hopper or Ada): "
                "torch's fp8 product on the CPU is a reference, 50x slower than float32; use "
                "'wint8' or 'wint4' on the CPU"
            )
        method = CPU_WEIGHT_ONLY[quantization]
        if quantization == "wint4":
            method = wint4(config.model.int4_group)
        return LinearMethods(method, method if config.model.quantize_lm_head else dense)
    if quantization == "fp8" and torch.cuda.get_device_capability(device) < (8, 9):
        raise ConfigError(
            "model.quantization 'fp8' needs fp8 tensor cores (compute capability 8.9 or more: "
            f"Ada, Hopper); this GPU has {torch.cuda.get_device_capability(device)}; use "
            "'wint8' or 'wint4'"
        )
    kernels = config.device.small_batch_kernels
    slow = kernels and SLOW_ON_GPU_WITH_KERNELS.get(quantization) or SLOW_ON_GPU.get(quantization)
    if slow:
        log.warning(
            "model.quantization %r on a GPU saves weight memory but %s (docs/benchmarks.md, "
            "W4 and W8); fp8 is the fast format on Hopper",
            quantization, slow,
        )  # fmt: skip
    method = ON_LOAD[quantization]
    if quantization == "wint4":
        method = wint4_on_load(config.model.int4_group)
    return LinearMethods(method, QuantizedCopy(method) if config.model.quantize_lm_head else dense)


def build_model(
    cfg: ModelConfig,
    max_model_len: int,
    tp: TensorParallel,
    device: torch.device,
    dtype: torch.dtype,
    methods: LinearMethods,
) -> torch.nn.Module:
    """The modules of `cfg.architecture` (models/registry.py), on the device, weights empty."""
    cls = model_class(cfg.architecture)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = cls(cfg, max_model_len, tp, methods)
    finally:
        torch.set_default_dtype(previous)
    # A quantized checkpoint's tensors that carry nothing the method uses (loader.py).
    model.ignored_checkpoint_suffixes = getattr(methods.projections, "ignored_suffixes", ())
    return model.eval()


def fill_weights(
    model: torch.nn.Module, model_dir: Path, config: WorkerConfig, progress: bool, seed: int
) -> None:
    """The checkpoint's weights (or random ones, with model.load_format 'dummy'), then what each
    linear method derives from them (linear_method.py)."""
    if config.model.load_format == "dummy":
        init_dummy_weights(model, seed)
    else:
        files = checkpoint_files(model_dir)
        load_weights(
            model, iterate_checkpoint(files), total=count_tensors(files), progress=progress
        )
    process_after_loading(model)
