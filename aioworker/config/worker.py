"""The whole worker config, the checks across its sections, and loading it from TOML plus
command-line overrides."""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import Any

import msgspec

from aioworker.config.device import DeviceOptions
from aioworker.config.engine import (
    CacheOptions,
    GuidedOptions,
    ModelOptions,
    ParallelOptions,
    SchedulerOptions,
    SpeculativeOptions,
)
from aioworker.config.section import ConfigError, Section, check_positive
from aioworker.config.service import ApiOptions, LauncherOptions, RuntimeOptions, SecurityOptions


class WorkerConfig(Section):
    model: ModelOptions = ModelOptions()
    cache: CacheOptions = CacheOptions()
    scheduler: SchedulerOptions = SchedulerOptions()
    speculative: SpeculativeOptions = SpeculativeOptions()
    guided: GuidedOptions = GuidedOptions()
    device: DeviceOptions = DeviceOptions()
    parallel: ParallelOptions = ParallelOptions()
    runtime: RuntimeOptions = RuntimeOptions()
    launcher: LauncherOptions = LauncherOptions()
    security: SecurityOptions = SecurityOptions()
    api: ApiOptions = ApiOptions()

    def __post_init__(self) -> None:
        check_positive("cache.block_size", self.cache.block_size)
        check_positive("scheduler.max_num_seqs", self.scheduler.max_num_seqs)
        check_positive("scheduler.max_waiting", self.scheduler.max_waiting)
        if self.scheduler.max_num_batched_tokens < 0:
            raise ConfigError(
                f"scheduler.max_num_batched_tokens is {self.scheduler.max_num_batched_tokens}; "
                "give tokens per step (0: by device)"
            )
        check_positive("parallel.tensor_parallel_size", self.parallel.tensor_parallel_size)
        check_positive("parallel.data_parallel_size", self.parallel.data_parallel_size)
        if not self.runtime.heartbeat_interval_s > 0:
            raise ConfigError(
                f"runtime.heartbeat_interval_s is {self.runtime.heartbeat_interval_s}; it must be > 0"
            )
        check_positive("runtime.max_message_bytes", self.runtime.max_message_bytes)
        check_positive("runtime.max_client_sockets", self.runtime.max_client_sockets)
        if not self.runtime.client_timeout_s > 0:
            raise ConfigError(
                f"runtime.client_timeout_s is {self.runtime.client_timeout_s}; it must be > 0"
            )
        check_positive("runtime.max_admin_message_bytes", self.runtime.max_admin_message_bytes)
        if self.cache.num_blocks < 0:
            raise ConfigError(f"cache.num_blocks is {self.cache.num_blocks}; use 0 (auto) or more")
        if self.cache.host_kv_bytes < 0:
            raise ConfigError(
                f"cache.host_kv_bytes is {self.cache.host_kv_bytes}; use 0 (no host tier) or "
                "the bytes of host memory per rank, e.g. 17179869184 for 16 GiB"
            )
        if not 0.0 < self.cache.gpu_memory_utilization <= 1.0:
            raise ConfigError(
                f"cache.gpu_memory_utilization is {self.cache.gpu_memory_utilization}; "
                "it must be in (0, 1]"
            )

        self._check_device()
        self._check_launcher()
        self._check_api()

    def _check_device(self) -> None:
        """A switch that refines another, set without it, would do nothing, silently. (Not
        norms_in_product_finish: it is on by default, so small_batch_kernels = false alone
        switches both off.)"""
        device = self.device
        if device.fused_norm_products and not device.small_batch_kernels:
            raise ConfigError(
                "device.fused_norm_products works inside the small-batch kernels; set "
                "device.small_batch_kernels = true, or fused_norm_products = false"
            )
        if device.pdl_max_batch < 1:
            raise ConfigError(
                f"device.pdl_max_batch is {device.pdl_max_batch}; give the largest decode graph "
                "batch to launch with PDL (1 or more; device.pdl = false switches it off)"
            )
        if device.decode_attention_tile_128_from_programs < 0:
            raise ConfigError(
                f"device.decode_attention_tile_128_from_programs is "
                f"{device.decode_attention_tile_128_from_programs}; give a count of (sequence, KV "
                "head) pairs (0: none)"
            )
        if not 0 <= device.decode_attention_stages <= 8:
            raise ConfigError(
                f"device.decode_attention_stages is {device.decode_attention_stages}; give 0 "
                "(Triton's default) or a pipelining depth of 1 to 8"
            )

    def _check_launcher(self) -> None:
        launcher = self.launcher
        if not 0 <= launcher.restart_backoff_s <= launcher.max_restart_backoff_s < math.inf:
            raise ConfigError(
                f"launcher.restart_backoff_s is {launcher.restart_backoff_s} and "
                f"launcher.max_restart_backoff_s {launcher.max_restart_backoff_s}; give "
                "0 <= restart_backoff_s <= max_restart_backoff_s seconds"
            )
        if launcher.max_restarts < 0:
            raise ConfigError(
                f"launcher.max_restarts is {launcher.max_restarts}; give 0 (no restarts) or more"
            )
        if not 0 < launcher.restart_window_s < math.inf:
            raise ConfigError(
                f"launcher.restart_window_s is {launcher.restart_window_s}; give seconds > 0"
            )

    def _check_api(self) -> None:
        if not 0 <= self.api.port < 65536:
            raise ConfigError(f"api.port is {self.api.port}; give a tcp port (0: any free one)")
        check_positive("api.retry_after_s", self.api.retry_after_s)
        if not 0 <= self.api.request_timeout_s < math.inf:
            raise ConfigError(
                f"api.request_timeout_s is {self.api.request_timeout_s}; give seconds (0: none)"
            )

    @property
    def world_size(self) -> int:
        """Ranks in the whole deployment: data-parallel groups x tensor-parallel ranks."""
        return self.parallel.tensor_parallel_size * self.parallel.data_parallel_size


def load_config(
    path: str | Path | None = None, overrides: dict[str, Any] | None = None
) -> WorkerConfig:
    """Read a TOML file (or the defaults) and apply dotted-key overrides like {"cache.block_size": 32}."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(Path(path).read_text())
        except FileNotFoundError as exc:
            raise ConfigError(f"config file {path} does not exist") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
    for dotted, value in (overrides or {}).items():
        if value is not None:
            _set_dotted(data, dotted, value)
    try:
        return msgspec.convert(data, WorkerConfig)
    except msgspec.ValidationError as exc:
        where = f" in {path}" if path else ""
        raise ConfigError(f"invalid configuration{where}: {exc}") from exc


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = data
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value
