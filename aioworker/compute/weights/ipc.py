"""Hand CUDA tensors from a trainer process to a rank on the same host without copying through
disk or host memory: torch.multiprocessing's CUDA IPC reduction, carried in a msgspec message
(IpcTensor) instead of a pickle.

Trainer side: `describe(name, tensor)`; keep the tensors alive until the update is answered.
Rank side: `rebuild(description)` maps the same device memory.
"""

from __future__ import annotations

import torch
from torch.multiprocessing.reductions import rebuild_cuda_tensor, reduce_tensor

from aioworker.core.weights_phase import IpcTensor


def describe(name: str, tensor: torch.Tensor) -> IpcTensor:
    if not tensor.is_cuda:
        raise ValueError(
            f"{name}: IPC hands over CUDA tensors only; this one is on {tensor.device}"
        )
    _, args = reduce_tensor(tensor)
    (
        _cls, size, stride, offset, _storage_cls, dtype, device, handle, storage_size_bytes,
        storage_offset_bytes, _requires_grad, ref_counter_handle, ref_counter_offset, event_handle,
        event_sync_required,
    ) = args  # fmt: skip
    return IpcTensor(
        name=name,
        dtype=str(dtype).removeprefix("torch."),
        size=list(size),
        stride=list(stride),
        offset=offset,
        device=device,
        handle=handle,
        storage_size_bytes=storage_size_bytes,
        storage_offset_bytes=storage_offset_bytes,
        ref_counter_handle=ref_counter_handle,
        ref_counter_offset=ref_counter_offset,
        event_handle=event_handle or b"",
        event_sync_required=event_sync_required,
    )


def rebuild(t: IpcTensor) -> torch.Tensor:
    return rebuild_cuda_tensor(
        torch.Tensor, torch.Size(t.size), tuple(t.stride), t.offset, torch.storage.UntypedStorage,
        getattr(torch, t.dtype), t.device, t.handle, t.storage_size_bytes, t.storage_offset_bytes,
        False, t.ref_counter_handle, t.ref_counter_offset, t.event_handle or None, t.event_sync_required,
    )  # fmt: skip
