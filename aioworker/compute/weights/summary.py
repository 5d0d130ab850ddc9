"""What a rank's weights amount to, for operators (the startup log, heartbeats, `admin status`,
metrics): the quantization of its decoder projections, the bytes of weight it holds, and the
bytes a decode step reads."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import NamedTuple

import torch
from torch import nn

from aioworker.compute.layers.linear import MethodLinear
from aioworker.compute.layers.linear_method import methods_in, weight_bytes


class WeightsSummary(NamedTuple):
    # The linear method of the decoder projections ("none", "cpu-packed", "wint4", ...).
    quantization: str
    # Every weight tensor held: parameters, and what linear methods derive (packed, quantized).
    bytes_held: int
    # What one decode step reads through the linear methods.
    bytes_read: int


def summarize(models: dict[str, nn.Module]) -> WeightsSummary:
    """`models`: the rank's weight holders by prefix (runner.weight_models()), the target's
    first, then a separate draft's."""
    return WeightsSummary(
        quantization=_quantization(next(iter(models.values()))),
        bytes_held=_bytes_held(models.values()),
        bytes_read=sum(weight_bytes(model) for model in models.values()),
    )


def _quantization(model: nn.Module) -> str:
    """The projections' method (the LM head's stays dense); several are joined with '+'."""
    names = dict.fromkeys(
        method.name for layer, method in methods_in(model) if isinstance(layer, MethodLinear)
    )
    return "+".join(names) or "none"


def _bytes_held(models: Iterable[nn.Module]) -> int:
    """Each storage once: a tied embedding and LM head, or a view of a tensor, count once."""
    storages = dict(_storage(tensor) for model in models for tensor in _weight_tensors(model))
    return sum(storages.values())


def _weight_tensors(model: nn.Module) -> Iterator[torch.Tensor]:
    yield from model.parameters()
    for layer, _ in methods_in(model):
        # What a method derives is set as plain attributes (not parameters or buffers), or in a
        # module held so (an LM head's quantized copy) whose tensors are plain attributes too.
        for value in vars(layer).values():
            if isinstance(value, torch.Tensor):
                yield value
            elif isinstance(value, nn.Module):
                yield from (t for t in vars(value).values() if isinstance(t, torch.Tensor))


def _storage(tensor: torch.Tensor) -> tuple[object, int]:
    """(a key of the tensor's storage, the storage's bytes)."""
    if tensor.is_mkldnn:  # oneDNN's packed layout is opaque: no storage to share or measure
        return id(tensor), tensor.numel() * tensor.element_size()
    storage = tensor.untyped_storage()
    return (tensor.device, storage.data_ptr()), storage.nbytes()
