"""Build a model's modules on a device and fill its weights: the target's and a separate draft's
alike (build_rank.py, draft_builder.py)."""

from __future__ import annotations

from pathlib import Path

import torch

from aioworker.checkpoint.model_config import ModelConfig
from aioworker.compute.layers import cpu_packing
from aioworker.compute.layers.linear_method import (
    UNQUANTIZED,
    LinearMethods,
    process_after_loading,
)
from aioworker.compute.layers.weight_only import WINT4, WINT8
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

WEIGHT_ONLY = {"wint8": WINT8, "wint4": WINT4}


def linear_methods(cfg: ModelConfig, config: WorkerConfig, device: torch.device) -> LinearMethods:
    """How the model's linear layers hold and multiply their weights: the projections as
    model.quantization says, the LM head dense; on the CPU the dense ones packed for oneDNN
    where it serves (device.cpu_packed_weights), elsewhere torch's dense matmul."""
    if cfg.quant_method:
        raise ValueError(
            f"the checkpoint is quantized (quantization_config.quant_method "
            f"{cfg.quant_method!r}), and this version loads unquantized checkpoints only; "
            "give a bf16, fp16 or fp32 checkpoint"
        )
    dense = UNQUANTIZED
    if config.device.cpu_packed_weights and cpu_packing.is_available(device):
        dense = cpu_packing.CPU_PACKED
    quantization = config.model.quantization
    if quantization == "none":
        return LinearMethods(dense, dense)
    if device.type != "cpu":
        raise ConfigError(
            f"model.quantization {quantization!r} runs on the CPU only so far; set it to "
            "'none' on a GPU"
        )
    return LinearMethods(WEIGHT_ONLY[quantization], dense)


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
