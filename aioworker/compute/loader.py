"""Load safetensors checkpoints straight into (sharded) parameters, one tensor at a time.

Every parameter carries a `weight_loader` that copies its own slice, so tensor-parallel sharding
happens here and no second full copy of the model is ever held. Missing, unexpected and
mis-shaped tensors are errors that name the tensor.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn
from tqdm import tqdm

from aioworker.compute.layers.linear_method import methods_in
from aioworker.compute.layers.param_loading import loading_of
from aioworker.compute.models.checkpoint_names import expert_tensor_name, resolve


class WeightsError(ValueError):
    """The checkpoint does not fit the model; the message names the tensor."""


# Checkpoint tensors that carry no weights of ours (recomputed at start-up).
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def checkpoint_files(model_dir: str | Path) -> list[Path]:
    model_dir = Path(model_dir)
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [model_dir / name for name in sorted(set(weight_map.values()))]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise WeightsError(f"no *.safetensors files in {model_dir}; is this a model directory?")
    return files


def iterate_checkpoint(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    for path in files:
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open has no __iter__
                yield name, handle.get_tensor(name)


def count_tensors(files: list[Path]) -> int:
    total = 0
    for path in files:
        with safe_open(str(path), framework="pt") as handle:
            total += len(list(handle.keys()))  # noqa: SIM118
    return total


def load_weights(
    model: nn.Module,
    tensors: Iterator[tuple[str, torch.Tensor]],
    total: int | None = None,
    progress: bool = True,
    targets: dict[str, torch.Tensor] | None = None,
) -> None:
    """Copy each named checkpoint tensor into its parameter (merged ones by shard id).

    With `targets` (parameter name -> a tensor shaped like it), the slices go there instead and
    the model is untouched: that is how an update is staged and validated before it is applied.
    """
    params = dict(model.named_parameters(remove_duplicate=False))
    packed: dict[str, tuple[str, int]] = getattr(model, "packed_modules", {})
    tied = _tied_names(model)
    ignored = _IGNORED_SUFFIXES + tuple(getattr(model, "ignored_checkpoint_suffixes", ()))
    expected = {name for name in params if name not in tied}
    # A layout the checkpoint stores differently (ERNIE's interleaved rotary pairs).
    adapt = getattr(model, "adapt_checkpoint_tensor", None)
    loaded: set[str] = set()
    bar = tqdm(
        total=total, desc="loading weights", unit="tensor", disable=not progress, leave=False
    )
    for name, tensor in tensors:
        bar.update(1)
        if name.endswith(ignored) or name in tied:
            continue
        param_name, shard_id = resolve(name, packed)
        if adapt is not None:
            tensor = adapt(param_name, shard_id, tensor)
        if param_name not in params:
            raise WeightsError(
                f"unexpected tensor {name!r} in the checkpoint: the model has no such parameter"
            )
        # A weight quantized while loading fills its scales from the same tensor (derived).
        siblings = [
            f"{param_name.rpartition('.')[0]}.{d}" for d in loading_of(params[param_name]).derived
        ]
        for filled in (param_name, *siblings):
            target = params[filled] if targets is None else targets[filled]
            _load_one(params[filled], target, tensor, name, shard_id)
            loaded.add(filled if shard_id is None else f"{filled}#{shard_id}")
    bar.close()
    _check_complete(expected, loaded, packed, params)


def _load_one(
    param: nn.Parameter, target: torch.Tensor, tensor: torch.Tensor, name: str, shard_id: int | None
) -> None:
    """The parameter's own loader (it knows its tensor-parallel slice) writes into `target`."""
    loader = param.weight_loader if hasattr(param, "weight_loader") else _default_loader
    tensor = tensor.to(loading_of(param).load_dtype or param.dtype)
    try:
        with torch.no_grad():
            if shard_id is None:
                loader(target, tensor, name)
            else:
                loader(target, tensor, name, shard_id)
    except (ValueError, RuntimeError) as exc:
        raise WeightsError(str(exc) if name in str(exc) else f"{name}: {exc}") from exc


def _default_loader(param: nn.Parameter, loaded: torch.Tensor, name: str) -> None:
    if loaded.shape != param.shape:
        raise ValueError(
            f"{name}: checkpoint tensor has shape {tuple(loaded.shape)}, expected {tuple(param.shape)}"
        )
    param.data.copy_(loaded)


def _tied_names(model: nn.Module) -> set[str]:
    """Names that alias another parameter (tied LM head): loading the original fills them."""
    first_name: dict[int, str] = {}
    tied = set()
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in first_name:
            tied.add(name)
        else:
            first_name[id(param)] = name
    return tied


def _check_complete(
    expected: set[str],
    loaded: set[str],
    packed: dict[str, tuple[str, int]],
    params: dict[str, nn.Parameter],
) -> None:
    """Every parameter (every part of a merged one, every expert this rank holds) must have
    been loaded; name what was not."""
    parts_of: dict[str, list[tuple[str, int]]] = {}
    for part, (merged, shard_id) in packed.items():
        parts_of.setdefault(merged, []).append((part, shard_id))
    missing = []
    for name in sorted(expected):
        shards = getattr(params[name], "expected_shards", None)
        if shards is not None:  # stacked experts: loaded whole, or each of ours
            if name not in loaded:
                missing += [
                    expert_tensor_name(name, s) for s in shards if f"{name}#{s}" not in loaded
                ]
            continue
        merged = next((m for m in parts_of if f".{m}." in name), None)
        if merged is None:
            missing += [] if name in loaded else [name]
            continue
        missing += [
            name.replace(f".{merged}.", f".{part}.")
            for part, shard_id in parts_of[merged]
            if f"{name}#{shard_id}" not in loaded
        ]
    if missing:
        shown = ", ".join(missing[:5]) + (
            f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        )
        raise WeightsError(f"the checkpoint is missing {len(missing)} tensor(s): {shown}")


DUMMY_RANGE = 0.05


def init_dummy_weights(model: nn.Module, seed: int) -> None:
    """Random weights at the config's shapes, for benchmarks. Small uniform values keep
    activations finite through any depth; norms stay at one. Generated where the parameter lives.
    Weights quantized while loading are made dense and quantized as a checkpoint's would be."""
    generators: dict[torch.device, torch.Generator] = {}

    def generator(device: torch.device) -> torch.Generator:
        if device not in generators:
            generators[device] = torch.Generator(device=device).manual_seed(seed)
        return generators[device]

    with torch.no_grad():
        for name, param in model.named_parameters():
            if loading_of(param).load_dtype is not None:
                continue  # quantized on load: below
            if name.endswith("norm.weight"):
                param.fill_(1.0)
                continue
            param.uniform_(-DUMMY_RANGE, DUMMY_RANGE, generator=generator(param.device))
        for layer, method in methods_in(model):
            fill = getattr(method, "fill_dummy", None)
            if fill is not None:
                fill(layer, lambda dense: dense.uniform_(
                    -DUMMY_RANGE, DUMMY_RANGE, generator=generator(dense.device)
                ))  # fmt: skip
