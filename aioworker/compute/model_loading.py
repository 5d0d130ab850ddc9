"""Build a model's modules on a device and fill its weights: the target's and a separate draft's
alike (build_rank.py, draft_builder.py)."""

from __future__ import annotations

from pathlib import Path

import torch

from aioworker.checkpoint.model_config import ModelConfig
from aioworker.compute.layers import cpu_packing
from aioworker.compute.loader import (
    checkpoint_files,
    count_tensors,
    init_dummy_weights,
    iterate_checkpoint,
    load_weights,
)
from aioworker.compute.models.llama import LlamaForCausalLM
from aioworker.compute.parallel import TensorParallel
from aioworker.config import WorkerConfig


def build_model(
    cfg: ModelConfig, max_model_len: int, tp: TensorParallel, device, dtype
) -> LlamaForCausalLM:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(cfg, max_model_len, tp)
    finally:
        torch.set_default_dtype(previous)
    return model.eval()


def fill_weights(
    model: torch.nn.Module, model_dir: Path, config: WorkerConfig, progress: bool, seed: int
) -> None:
    """The checkpoint's weights (or random ones, with model.load_format 'dummy'), then packed for
    the CPU's kernels where they serve."""
    if config.model.load_format == "dummy":
        init_dummy_weights(model, seed)
    else:
        files = checkpoint_files(model_dir)
        load_weights(
            model, iterate_checkpoint(files), total=count_tensors(files), progress=progress
        )
    device = next(model.parameters()).device
    if config.device.cpu_packed_weights and cpu_packing.is_available(device):
        cpu_packing.pack_model(model)
