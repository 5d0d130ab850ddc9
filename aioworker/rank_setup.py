"""Build one rank's compute: resolve the model, pick device and dtype, build the model on the
executor thread, load weights, size and allocate the KV cache.

Returns the executor and a torch-free `RankSpec` the scheduler side needs (block counts,
lengths, vocabulary, EOS ids).
"""

from __future__ import annotations

import logging
import time

import torch

from aioworker.config import WorkerConfig
from aioworker.executor import Executor
from aioworker.kv_cache import allocate_kv_cache, bytes_per_block, num_blocks_for_bytes
from aioworker.layers import cpu_packing
from aioworker.layers.attention import select_backend
from aioworker.loader import (
    checkpoint_files,
    count_tensors,
    init_dummy_weights,
    iterate_checkpoint,
    load_weights,
)
from aioworker.model_config import ModelConfig, load_model_config
from aioworker.model_runner import ModelRunner
from aioworker.model_source import resolve_model_path
from aioworker.models.llama import LlamaForCausalLM
from aioworker.parallel import SINGLE, TensorParallel, init_tensor_parallel
from aioworker.sampling import Sampler
from aioworker.spec import RankSpec

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class CacheTooSmallError(ValueError):
    """The KV cache cannot hold one sequence of max_model_len tokens."""


def pick_device(kind: str, index: int = 0) -> torch.device:
    """`index` is the rank's number on its host: each GPU rank takes its own device."""
    if kind == "auto":
        kind = "cuda" if torch.cuda.is_available() else "cpu"
    if kind != "cuda":
        return torch.device(kind)
    if not torch.cuda.is_available():
        raise RuntimeError(
            "device.kind is 'cuda' but torch sees no CUDA device; use 'cpu' or 'auto'"
        )
    return torch.device("cuda", index % torch.cuda.device_count())


def pick_dtype(name: str, device: torch.device, cfg: ModelConfig) -> torch.dtype:
    if name != "auto":
        return _DTYPES[name]
    if device.type == "cpu":
        return torch.float32  # bf16 matmuls are slow on most CPUs
    return _DTYPES.get(cfg.dtype, torch.bfloat16) if cfg.dtype != "float32" else torch.bfloat16


def build_rank(
    config: WorkerConfig,
    tp: TensorParallel = SINGLE,
    progress: bool = True,
    dist_init: str | None = None,
    device_index: int = 0,
) -> tuple[Executor, RankSpec]:
    """Build the rank's compute; with tensor parallelism, first join the group at `dist_init`."""
    started = time.monotonic()
    model_dir = resolve_model_path(config.model.path, progress)
    cfg = load_model_config(model_dir)
    device = pick_device(config.device.kind, device_index)
    dtype = pick_dtype(config.model.dtype, device, cfg)
    max_model_len = config.model.max_model_len or cfg.max_position_embeddings
    if config.device.num_threads and device.type == "cpu":
        torch.set_num_threads(config.device.num_threads)
    executor = Executor(device)
    try:
        if tp.size > 1:
            backend = "nccl" if device.type == "cuda" else "gloo"
            executor.call(
                lambda: init_tensor_parallel(tp.rank, tp.size, dist_init, backend)
            ).result()
        num_blocks = executor.call(
            lambda: _build_runner(
                executor, config, cfg, model_dir, device, dtype, max_model_len, tp, progress
            )
        ).result()
    except BaseException:
        executor.shutdown()
        raise
    spec = RankSpec(
        model_dir=model_dir,
        model_config=cfg,
        device=str(device),
        dtype=str(dtype).removeprefix("torch."),
        num_blocks=num_blocks,
        block_size=config.cache.block_size,
        max_model_len=max_model_len,
        load_seconds=time.monotonic() - started,
    )
    return executor, spec


def _build_runner(
    executor, config, cfg, model_dir, device, dtype, max_model_len, tp, progress
) -> int:
    """Runs on the executor thread: the device's state is created where it will be used."""
    model = _build_model(cfg, max_model_len, tp, device, dtype)
    if config.model.load_format == "dummy":
        init_dummy_weights(model, config.model.seed)
    else:
        files = checkpoint_files(model_dir)
        load_weights(
            model, iterate_checkpoint(files), total=count_tensors(files), progress=progress
        )
    if config.device.cpu_packed_weights and cpu_packing.is_available(device):
        cpu_packing.pack_model(model)
    layers = model.attention_layers()
    num_blocks = _num_blocks(config, cfg, layers[0].num_kv_heads, dtype, max_model_len)
    allocate_kv_cache(layers, num_blocks, config.cache.block_size, dtype, device)
    backend = select_backend(
        config.device.attention_backend, device.type, config.cache.block_size, cfg.sliding_window
    )
    executor.runner = ModelRunner(model, backend, Sampler(config.model.seed, device), device, tp)
    return num_blocks


def _build_model(
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


def _num_blocks(
    config: WorkerConfig, cfg: ModelConfig, num_kv_heads: int, dtype, max_model_len: int
) -> int:
    block_size = config.cache.block_size
    num_blocks = config.cache.num_blocks or num_blocks_for_bytes(
        config.cache.cpu_cache_bytes, bytes_per_block(cfg, num_kv_heads, block_size, dtype)
    )
    if num_blocks * block_size < max_model_len:
        raise CacheTooSmallError(
            f"the KV cache holds {num_blocks} blocks x {block_size} = {num_blocks * block_size} tokens, "
            f"fewer than max_model_len ({max_model_len}); raise cache.cpu_cache_bytes or "
            "cache.num_blocks, or lower model.max_model_len"
        )
    return num_blocks
