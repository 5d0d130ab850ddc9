"""Give device memory back and take it again without a restart (RL rollouts hand the GPU to the
trainer between rounds). Weights are offloaded to host memory, the KV cache and CUDA graphs are
dropped; resuming restores the weights, allocates the cache again and re-captures the graphs.
Freed memory is measured with the device's own counters."""

from __future__ import annotations

import gc
import os
from collections.abc import Callable

import torch

from aioworker.compute.layers import cpu_packing
from aioworker.compute.weights.staging import live_parameters


def used_bytes(device: torch.device) -> int:
    """Memory in use as the device reports it (the CPU: this process's resident set)."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return total - free
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class DeviceMemory:
    def __init__(self, runner, reallocate_cache: Callable[[], None]) -> None:
        self.runner = runner
        self.reallocate_cache = reallocate_cache
        self.offloaded: dict[str, torch.Tensor] | None = None  # weights, while released
        self.cache_released = False

    @property
    def weights_released(self) -> bool:
        return self.offloaded is not None

    @torch.inference_mode()
    def release(self, weights: bool, kv_cache: bool) -> int:
        """Free what is asked; returns the bytes the device reports as freed."""
        device = self.runner.device
        before = used_bytes(device)
        self.runner.drop_graphs()  # they hold pointers to both weights and cache
        if kv_cache and not self.cache_released:
            for layer in self.runner.model.attention_layers():
                layer.k_cache = layer.v_cache = torch.empty(0)
            self.cache_released = True
        if weights and self.offloaded is None:
            self.offloaded = self._offload_weights()
        gc.collect()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()
        return before - used_bytes(device)

    @torch.inference_mode()
    def resume(self) -> None:
        device = self.runner.device
        if self.offloaded is not None:
            for name, param in live_parameters(self.runner.model).items():
                param.data = self.offloaded[name].to(device)
            self.offloaded = None
            if self.runner.packed:  # the packed copies were dropped with the weights
                cpu_packing.pack_model(self.runner.model)
        if self.cache_released:
            self.reallocate_cache()
            self.cache_released = False
        self.runner.recapture_graphs()

    def _offload_weights(self) -> dict[str, torch.Tensor]:
        offloaded = {}
        pin = self.runner.device.type == "cuda"
        for name, param in live_parameters(self.runner.model).items():
            host = param.data.to("cpu")
            offloaded[name] = host.pin_memory() if pin else host
            param.data = torch.empty(0, dtype=param.dtype, device=param.device)
        for module in self.runner.model.modules():
            if getattr(module, "packed_weight", None) is not None:
                module.packed_weight = None
        return offloaded
