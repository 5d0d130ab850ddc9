"""Give device memory back and take it again without a restart (RL rollouts hand the GPU to the
trainer between rounds). Weights are offloaded (GPU: to pinned host memory; CPU, where they already
live in host memory: to a file), the KV cache and CUDA graphs are dropped; resuming restores the
weights, allocates the cache again and re-captures the graphs. Freed memory is measured with the
device's own counters."""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import tempfile
from collections.abc import Callable

import torch
from torch import nn

from aioworker.checkpoint.source import cache_dir
from aioworker.compute.layers.linear_method import drop_derived, process_after_loading
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
            for layer in self.runner.kv_layers():
                layer.k_cache = layer.v_cache = torch.empty(0)
            # Every sequence was preempted with the cache (runtime/weights.py): the state of
            # its logit controls is rebuilt when it is admitted again.
            self.runner.controls.release(list(self.runner.controls.seqs))
            self.cache_released = True
        if weights and self.offloaded is None:
            self.offloaded = self._offload_weights()
        gc.collect()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()
        else:
            return_freed_heap()
        return before - used_bytes(device)

    @torch.inference_mode()
    def resume(self) -> None:
        device = self.runner.device
        if self.offloaded is not None:
            for name, param in rank_parameters(self.runner).items():
                # copy=True: on the CPU, .to() would keep the file mapping itself as the weight.
                # Popping drops each offloaded tensor as soon as it is restored.
                param.data = self.offloaded.pop(name).to(device, copy=True)
            self.offloaded = None
            for model in self.runner.weight_models().values():
                process_after_loading(model)  # what was derived went with the weights
        if self.cache_released:
            self.reallocate_cache()
            self.cache_released = False
        self.runner.recapture_graphs()

    def _offload_weights(self) -> dict[str, torch.Tensor]:
        params = rank_parameters(self.runner)
        if self.runner.device.type == "cuda":
            offloaded = {name: param.data.to("cpu").pin_memory() for name, param in params.items()}
        else:
            offloaded = offload_to_file(params)
        for param in params.values():
            param.data = torch.empty(0, dtype=param.dtype, device=param.device)
        for model in self.runner.weight_models().values():
            drop_derived(model)
        return offloaded


def rank_parameters(runner) -> dict[str, torch.nn.Parameter]:
    """Every weight the rank holds, a separate draft's under its prefix."""
    return {
        prefix + name: param
        for prefix, model in runner.weight_models().items()
        for name, param in live_parameters(model).items()
    }


def return_freed_heap() -> None:
    """Hand memory that glibc's malloc holds free back to the system. Tensors below malloc's mmap
    threshold (a few MB, once larger blocks were freed) live in its heaps, and freeing them keeps
    the pages in the process until they are trimmed. Elsewhere than glibc: nothing to do."""
    libc_name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(libc_name) if libc_name else None
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


_ALIGNMENT = 64  # each tensor starts at a multiple of this, so views of the mapping take any dtype


def offload_to_file(params: dict[str, nn.Parameter]) -> dict[str, torch.Tensor]:
    """Write CPU weights to a file and return views of it, mapped privately: pages come back from
    disk when touched (on resume), so the process holds none meanwhile. The file, in the cache
    directory, is deleted at once: the mapping keeps it readable, and a process that dies leaves
    nothing behind."""
    directory = cache_dir() / "released"
    directory.mkdir(parents=True, exist_ok=True)
    layout: dict[str, tuple[int, int]] = {}  # name -> (offset, bytes)
    with tempfile.NamedTemporaryFile(dir=directory, prefix="weights-") as file:
        offset = 0
        for name, param in params.items():
            raw = param.data.detach().contiguous().reshape(-1).view(torch.uint8)
            offset = -(-offset // _ALIGNMENT) * _ALIGNMENT
            file.seek(offset)
            file.write(raw.numpy())
            layout[name] = (offset, raw.numel())
            offset += raw.numel()
        file.flush()
        mapped = torch.from_file(file.name, shared=False, size=offset, dtype=torch.uint8)
    return {
        name: mapped[start : start + size].view(params[name].dtype).view(params[name].shape)
        for name, (start, size) in layout.items()
    }
