"""Build one rank's compute: resolve the model, pick device and dtype, build the model on the
executor thread, load weights, size and allocate the KV cache.

Returns the executor and a torch-free `LoadedRank`: what the scheduler side needs (block counts,
lengths, vocabulary, EOS ids).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from aioworker.checkpoint.model_config import ModelConfig, load_model_config
from aioworker.checkpoint.source import resolve_model_path
from aioworker.checkpoint.tokenizer import Tokenizer
from aioworker.compute.cpu_bf16 import computes_bf16_natively
from aioworker.compute.cpu_threads import num_threads_for_rank
from aioworker.compute.draft_builder import build_draft
from aioworker.compute.executor_thread import ExecutorThread
from aioworker.compute.host_tier_setup import HostTierSize, block_dim_of, install_host_tier
from aioworker.compute.kv_cache import (
    allocate_kv_cache,
    bytes_per_block,
    num_blocks_for_bytes,
    token_major_shape,
)
from aioworker.compute.kv_profile import profile_num_blocks
from aioworker.compute.layers import pdl
from aioworker.compute.layers.attention import TorchAttentionBackend, cpu_decode
from aioworker.compute.layers.attention.cpu_decode import PagedDecode
from aioworker.compute.layers.moe.load_meter import expert_load_meter
from aioworker.compute.model_loading import build_model, fill_weights, linear_methods
from aioworker.compute.parallel import SINGLE, TensorParallel, init_tensor_parallel
from aioworker.compute.sampling.sampler import Sampler
from aioworker.compute.step.runner import ModelRunner
from aioworker.compute.thread_governor import ThreadGovernor
from aioworker.compute.weights.rank_weights import RankWeights
from aioworker.compute.weights.summary import WeightsSummary, summarize
from aioworker.config import WorkerConfig
from aioworker.core.loaded_rank import LoadedRank

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
    if device.type == "cpu":  # bf16 where the processor computes it (cpu_bf16.py says why)
        return torch.bfloat16 if computes_bf16_natively() else torch.float32
    return _DTYPES.get(cfg.dtype, torch.bfloat16) if cfg.dtype != "float32" else torch.bfloat16


def build_rank(
    config: WorkerConfig,
    tp: TensorParallel = SINGLE,
    progress: bool = True,
    dist_init: str | None = None,
    device_index: int = 0,
    report_phase: Callable[[str], None] | None = None,
    global_rank: int | None = None,
    rendezvous_listen_fd: int | None = None,
) -> tuple[ExecutorThread, LoadedRank]:
    """Build the rank's compute; with tensor parallelism, first join the group at `dist_init`
    (rank 0 serving it on `rendezvous_listen_fd`, see init_tensor_parallel). `global_rank` (the
    worker's --rank) sizes its share of the host's CPU threads; the offline engine passes none
    and keeps torch's default."""
    started = time.monotonic()
    tp = replace(tp, expert_parallel_size=config.parallel.expert_parallel_size)
    model_dir = resolve_model_path(config.model.path, progress)
    cfg = load_model_config(model_dir)
    device = pick_device(config.device.kind, device_index)
    dtype = pick_dtype(config.model.dtype, device, cfg)
    max_model_len = config.model.max_model_len or cfg.max_position_embeddings
    governor = None
    if device.type == "cpu":
        num_threads = num_threads_for_rank(config, global_rank)
        _use_cpu_threads(num_threads)
        if num_threads > 1 and not config.device.num_threads and tp.size == 1:
            governor = ThreadGovernor(num_threads, torch.set_num_threads, log.info)
    executor = ExecutorThread(device, governor=governor)
    try:
        if tp.size > 1:
            backend = "nccl" if device.type == "cuda" else "gloo"
            executor.call(
                lambda: init_tensor_parallel(
                    tp.rank, tp.size, dist_init, backend, rendezvous_listen_fd
                )
            ).result()
        build = _Build(
            config,
            cfg,
            model_dir,
            device,
            dtype,
            max_model_len,
            tp,
            progress,
            report_phase or _ignore,
        )
        runner, weights, num_blocks, summary, host_tier = executor.call(
            lambda: _build_runner(build)
        ).result()
        executor.install(runner, weights)
        executor.expert_meter = expert_load_meter(runner.model)
        if executor.expert_meter is not None:
            log.info("MoE layers: %s on this rank", executor.expert_meter.layout.describe())
    except BaseException:
        executor.shutdown()
        raise
    loaded = LoadedRank(
        model_dir=model_dir,
        vocab_size=cfg.vocab_size,
        eos_token_ids=cfg.eos_token_ids,
        device=str(device),
        dtype=str(dtype).removeprefix("torch."),
        num_blocks=num_blocks,
        block_size=config.cache.block_size,
        max_model_len=max_model_len,
        load_seconds=time.monotonic() - started,
        tokenizer=_tokenizer_of(model_dir),
        grammars=_grammars_of(config, cfg, model_dir) if tp.rank == 0 else None,
        quantization=summary.quantization,
        weight_bytes_held=summary.bytes_held,
        weight_bytes_read=summary.bytes_read,
        expert_load=executor.expert_meter.read if executor.expert_meter is not None else None,
        num_host_blocks=host_tier.num_slots,
        kv_block_bytes=host_tier.block_bytes,
    )
    return executor, loaded


def _grammars_of(config: WorkerConfig, cfg, model_dir: Path):
    """The driver's grammar compiler, where the model has a tokenizer (guided decoding)."""
    tokenizer_file = Path(model_dir) / "tokenizer.json"
    if not tokenizer_file.is_file():
        return None
    from aioworker.compute.grammar.xgrammar_backend import XgrammarBackend

    return XgrammarBackend(tokenizer_file, cfg.vocab_size, cfg.eos_token_ids, config.guided)


def _tokenizer_of(model_dir: Path) -> Tokenizer | None:
    """The model's tokenizer, where its directory has one: token-id-only models still serve."""
    return Tokenizer(model_dir) if (Path(model_dir) / "tokenizer.json").is_file() else None


def _use_cpu_threads(num_threads: int) -> None:
    """Before the executor thread starts: a thread takes the count when it first runs an op."""
    if num_threads:
        torch.set_num_threads(num_threads)
        log.info("torch runs %d CPU threads", num_threads)


@dataclass(frozen=True)
class _Build:
    config: WorkerConfig
    model_config: ModelConfig
    model_dir: Path
    device: torch.device
    dtype: torch.dtype
    max_model_len: int
    tp: TensorParallel
    progress: bool
    report_phase: Callable[[str], None]  # PROFILING, WARMING: shown in heartbeats


def _build_runner(
    build: _Build,
) -> tuple[ModelRunner, RankWeights, int, WeightsSummary, HostTierSize]:
    """Runs on the executor thread: the device's state is created where it will be used.
    Returns the runner, its weights, the number of KV cache blocks, what the weights amount
    to, and the host KV tier's size."""
    config, device = build.config, build.device
    methods = linear_methods(build.model_config, config, device)
    pdl_on = _pdl_pays(config, device, methods.projections.name)
    pdl.enable(pdl_on, graphs_only=True, max_graph_batch=config.device.pdl_max_batch)
    model = build_model(
        build.model_config, build.max_model_len, build.tp, device, build.dtype, methods
    )
    fill_weights(model, build.model_dir, config, build.progress, config.model.seed)
    draft = build_draft(
        model, build.model_config, config, build.tp, build.max_model_len, build.progress
    )
    if device.type == "cuda" and config.device.attention_backend != "torch":
        runner, weights, num_blocks = _build_cuda_runner(model, draft, build)
        block_dim = block_dim_of(token_major_shape)
    else:
        runner, weights, num_blocks = _build_cpu_runner(model, draft, build)
        block_dim = block_dim_of(runner.backend.cache_shape)
    host_tier = install_host_tier(runner, config.cache.host_kv_bytes, block_dim)
    summary = summarize(runner.weight_models())
    log.info(
        "linear layers: projections %s, LM head %s; %.1f MiB of weights held, %.1f MiB read "
        "per decode step", methods.projections.name, methods.lm_head.name,
        summary.bytes_held / 2**20, summary.bytes_read / 2**20,
    )  # fmt: skip
    return runner, weights, num_blocks, summary, host_tier


def _pdl_pays(config: WorkerConfig, device: torch.device, format_name: str) -> bool:
    """device.pdl where the GPU has it, unless the projections' format is one of
    device.pdl_off_formats (those measured slower with it: wint8 by default)."""
    if not config.device.pdl or device.type != "cuda":
        return False
    if not _hopper_or_later(device):
        log.info("device.pdl needs a GPU of compute capability 9.0 or later; launching as usual")
        return False
    if format_name in config.device.pdl_off_formats:
        log.info("device.pdl: off for %s (device.pdl_off_formats)", format_name)
        return False
    return True


def _hopper_or_later(device: torch.device) -> bool:
    """Programmatic dependent launch (layers/pdl.py) needs compute capability 9.0."""
    return torch.cuda.get_device_capability(device) >= (9, 0)


def _build_cpu_runner(model, draft, build: _Build) -> tuple[ModelRunner, RankWeights, int]:
    config, device = build.config, build.device
    layers = model.attention_layers() + (draft.attention_layers() if draft else [])
    num_blocks = _num_blocks(config, layers, build.dtype, build.max_model_len)
    backend = TorchAttentionBackend(
        config.cache.block_size,
        build.model_config.sliding_window,
        _cpu_decode_kernel(build, layers),
    )

    def allocate_cache() -> None:
        allocate_kv_cache(
            layers, num_blocks, config.cache.block_size, build.dtype, device, backend.cache_shape
        )

    allocate_cache()
    runner = ModelRunner(
        model, backend, Sampler(config.model.seed, device), device, build.tp, draft
    )
    weights = RankWeights(runner, allocate_cache)
    return runner, weights, num_blocks


def _cpu_decode_kernel(build: _Build, layers: list) -> PagedDecode | None:
    """The CPU's paged decode kernel, where it serves every attention layer, a separate
    draft's too (device.attention_backend 'auto' on the CPU; 'torch' keeps every step in
    torch)."""
    if build.device.type != "cpu" or build.config.device.attention_backend != "auto":
        return None
    kernel = cpu_decode.load()
    serves = kernel is not None and all(
        kernel.serves(build.dtype, layer.num_heads, layer.num_kv_heads, layer.head_dim)
        for layer in layers
    )
    return kernel if serves else None


def _build_cuda_runner(model, draft, build: _Build) -> tuple[ModelRunner, RankWeights, int]:
    from aioworker.compute.layers.attention import select_cuda_backend  # Triton enters here
    from aioworker.compute.step.cuda_runner import CudaModelRunner
    from aioworker.compute.step.eager_warm_up import warm_up_eager

    config, device = build.config, build.device
    layers = model.attention_layers() + (draft.attention_layers() if draft else [])
    window = build.model_config.sliding_window
    if window is not None and window < build.max_model_len:
        raise ValueError(
            f"the model attends within a sliding window of {window} tokens, which the CUDA "
            "backends do not implement; set device.attention_backend = 'torch', or "
            f"model.max_model_len <= {window}"
        )

    def make_runner(num_blocks: int, capture: int = 0) -> CudaModelRunner:
        return CudaModelRunner(
            model,
            select_cuda_backend(config.device, config.cache.block_size),
            Sampler(config.model.seed, device),
            device,
            build.tp,
            block_size=config.cache.block_size,
            num_blocks=num_blocks,
            max_num_seqs=config.scheduler.max_num_seqs,
            max_model_len=build.max_model_len,
            max_capture_batch_size=capture,
            max_verify_queries=config.speculative.num_tokens + 1
            if config.speculative.method
            else 0,
            draft=draft,
        )

    num_blocks = config.cache.num_blocks
    if not num_blocks:
        build.report_phase("PROFILING")
        num_blocks = profile_num_blocks(
            make_runner, layers, config, build.model_config, build.dtype, device
        ).num_blocks
    _check_holds_one_sequence(
        num_blocks, config.cache.block_size, build.max_model_len, "gpu_memory_utilization"
    )

    # One block more than the scheduler may use: the scratch block of padded graph rows.
    def allocate_cache() -> None:
        allocate_kv_cache(layers, num_blocks + 1, config.cache.block_size, build.dtype, device)

    allocate_cache()
    capture = config.device.max_capture_batch_size if config.device.cuda_graphs else 0
    runner = make_runner(num_blocks, capture)
    weights = RankWeights(runner, allocate_cache)
    build.report_phase("WARMING")
    runner.capture_graphs()
    # The eager steps' kernels, which the graphs do not compile.
    warm_up_eager(runner, config.scheduler.step_token_budget(device.type))
    runner.sampler.warm_up(build.model_config.vocab_size, build.dtype)
    return runner, weights, num_blocks


def _ignore(_: str) -> None:
    pass


def _num_blocks(config: WorkerConfig, layers: list, dtype, max_model_len: int) -> int:
    block_size = config.cache.block_size
    num_blocks = config.cache.num_blocks or num_blocks_for_bytes(
        config.cache.cpu_cache_bytes, bytes_per_block(layers, block_size, dtype)
    )
    _check_holds_one_sequence(num_blocks, block_size, max_model_len, "cpu_cache_bytes")
    return num_blocks


def _check_holds_one_sequence(
    num_blocks: int, block_size: int, max_model_len: int, knob: str
) -> None:
    if num_blocks * block_size < max_model_len:
        raise CacheTooSmallError(
            f"the KV cache holds {num_blocks} blocks x {block_size} = {num_blocks * block_size} tokens, "
            f"fewer than max_model_len ({max_model_len}); raise cache.{knob} or "
            "cache.num_blocks, or lower model.max_model_len"
        )
