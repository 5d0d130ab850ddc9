"""Replace a running model's weights without a restart (executor side): stage the new weights
beside the live ones, validate them (names, shapes, dtypes, finite values, optional checksums),
and only then copy them in, in place, so CUDA graphs and the KV cache stay valid.

Staging happens in host memory, one copy of this rank's shard: the device needs no spare room.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from aioworker.compute.layers.linear_method import process_after_loading
from aioworker.compute.loader import (
    WeightsError,
    checkpoint_files,
    iterate_checkpoint,
    load_weights,
)

CHECKSUM_FILE = "checksums.json"  # {tensor name: sha256 hex of its bytes as stored}


def live_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    return dict(model.named_parameters())  # tied parameters once, under their first name


def directory_tensors(path: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    """The named tensors of the checkpoint at `path`, checked against its checksums file where
    it has one."""
    path = Path(path)
    if not path.is_dir():
        raise WeightsError(f"weights path {str(path)!r} is not a directory of safetensors files")
    checksums = _read_checksums(path)
    tensors = iterate_checkpoint(checkpoint_files(path))
    if checksums is not None:
        tensors = _verified(tensors, checksums, path / CHECKSUM_FILE)
    return tensors


def stage_from_directory(model: nn.Module, path: str | Path) -> dict[str, torch.Tensor]:
    """This rank's shard of the checkpoint at `path`, validated, in host memory."""
    return stage(model, directory_tensors(path))


def stage_models(
    models: dict[str, nn.Module],
    tensors: Iterator[tuple[str, torch.Tensor]],
    on_device: bool = False,
) -> dict[str, dict[str, torch.Tensor]]:
    """`stage` for a rank's models by prefix (runner.weight_models): tensors named with another
    model's prefix are set aside while the target's stream through, then staged for that model.
    A model none of whose tensors the update names is left out: it keeps its weights."""
    set_aside: dict[str, list[tuple[str, torch.Tensor]]] = {p: [] for p in models if p}

    def targets_tensors() -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in tensors:
            prefix = next((p for p in set_aside if name.startswith(p)), None)
            if prefix is None:
                yield name, tensor
            else:
                set_aside[prefix].append((name.removeprefix(prefix), tensor))

    staged = {"": stage(models[""], targets_tensors(), on_device)}
    for prefix, named in set_aside.items():
        if named:
            staged[prefix] = stage(models[prefix], iter(named), on_device)
    return staged


def stage(
    model: nn.Module, tensors: Iterator[tuple[str, torch.Tensor]], on_device: bool = False
) -> dict[str, torch.Tensor]:
    """Slice and check named tensors into buffers shaped like this rank's parameters: in host
    memory, or with `on_device` beside the live weights when the device has room for a second
    copy (tensors that are on the device already then never cross the bus)."""
    params = live_parameters(model)
    device = _staging_device(params, on_device)
    targets = {
        name: torch.empty(p.shape, dtype=p.dtype, device=device) for name, p in params.items()
    }
    load_weights(model, tensors, progress=False, targets=targets)
    for name, tensor in targets.items():
        if tensor.is_floating_point() and not _finite(tensor):
            raise WeightsError(f"{name}: this rank's slice holds NaN or infinite values")
    return targets


def _finite(tensor: torch.Tensor) -> bool:
    if tensor.element_size() == 1:  # fp8: isfinite has no kernel for it
        return bool(torch.isfinite(tensor.to(torch.bfloat16)).all())
    return bool(torch.isfinite(tensor).all())


@torch.inference_mode()
def commit(model: nn.Module, staged: dict[str, torch.Tensor]) -> None:
    """Copy staged weights into the live parameters, in place (device addresses do not move)."""
    for name, param in live_parameters(model).items():
        param.data.copy_(staged[name], non_blocking=True)
    process_after_loading(model)  # what the linear methods derive (packed copies) is stale
    if next(model.parameters()).is_cuda:
        torch.cuda.current_stream().synchronize()


def _staging_device(params: dict[str, nn.Parameter], on_device: bool) -> torch.device:
    device = next(iter(params.values())).device
    if not on_device or device.type != "cuda":
        return torch.device("cpu")
    needed = sum(p.numel() * p.element_size() for p in params.values())
    free, _ = torch.cuda.mem_get_info(device)
    return device if free > needed * 1.1 + (1 << 30) else torch.device("cpu")


def write_checksums(path: str | Path) -> Path:
    """Write checksums.json for a checkpoint directory (what a trainer would publish)."""
    path = Path(path)
    sums = {name: _digest(tensor) for name, tensor in iterate_checkpoint(checkpoint_files(path))}
    out = path / CHECKSUM_FILE
    out.write_text(json.dumps(sums, indent=1, sort_keys=True))
    return out


def _read_checksums(path: Path) -> dict[str, str] | None:
    file = path / CHECKSUM_FILE
    return json.loads(file.read_text()) if file.is_file() else None


def _verified(
    tensors, checksums: dict[str, str], checksum_file: Path
) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor must be listed: a checksum file that skips some would let exactly those
    through unchecked."""
    for name, tensor in tensors:
        expected = checksums.get(name)
        if expected is None:
            raise WeightsError(
                f"{name}: not listed in {checksum_file}; list every tensor of the checkpoint "
                "(write_checksums does) or remove the file"
            )
        if _digest(tensor) != expected:
            raise WeightsError(f"{name}: checksum mismatch with {CHECKSUM_FILE} (corrupted file?)")
        yield name, tensor


def _digest(tensor: torch.Tensor) -> str:
    raw = (
        tensor.contiguous().view(torch.uint8) if tensor.element_size() > 1 else tensor.contiguous()
    )
    return hashlib.sha256(raw.numpy().tobytes()).hexdigest()
