"""What every rank runs when its weights change: one phase of a two-phase update (stage, then
commit or rollback), or a release / resume of device memory. Plain types: the driver sends them
to its peers, and each rank's executor runs them."""

from __future__ import annotations

from typing import Literal

import msgspec

WeightsOp = Literal["stage", "commit", "rollback", "release", "resume"]


class IpcTensor(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    """A CUDA tensor of another process on this host, as torch.multiprocessing shares it: an
    IPC memory handle plus the layout to rebuild the tensor (no pickle)."""

    name: str
    dtype: str
    size: list[int]
    stride: list[int]
    offset: int
    device: int
    handle: bytes
    storage_size_bytes: int
    storage_offset_bytes: int
    ref_counter_handle: bytes
    ref_counter_offset: int
    event_handle: bytes
    event_sync_required: bool


class WeightsPhase(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    op: WeightsOp
    version: int = 0
    path: str = ""  # stage: a safetensors directory...
    ipc_tensors: list[IpcTensor] = []  # ...or tensors shared by a trainer process
    weights: bool = True  # release: what to free
    kv_cache: bool = True
