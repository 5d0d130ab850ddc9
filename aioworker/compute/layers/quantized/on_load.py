"""The shared shape of a method that quantizes a dense checkpoint while loading it.

Its parameters hold only quantized values and their scales: no dense copy is ever made, in
device memory or in a staged update. The checkpoint names one dense tensor per weight; the
first parameter takes its name and the others are filled from the same tensor (ParamLoading's
`derived`). Each parameter's store quantizes the dense slice it is given (this rank's shard,
moved to the parameter's device first) and keeps its own piece, so a tensor-parallel shard is
quantized by the rank that holds it and the scales follow the split.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from aioworker.compute.layers.linear_method import NothingDerived
from aioworker.compute.layers.param_loading import ParamLoading, loading_of

# name -> (empty tensor, its piece of the quantized dense rows)
Pieces = dict[str, tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]]


class QuantizedOnLoad(NothingDerived):
    name: str

    def pieces(self, out_features: int, in_features: int, dense_dtype: torch.dtype) -> Pieces:
        raise NotImplementedError

    def create_weights(self, layer: nn.Module, out_features: int, in_features: int) -> None:
        dense_dtype = torch.get_default_dtype()  # the model's (build_model sets it)
        pieces = self.pieces(out_features, in_features, dense_dtype)
        names = list(pieces)
        for index, (name, (tensor, piece)) in enumerate(pieces.items()):
            param = nn.Parameter(tensor, requires_grad=False)
            param.loading = ParamLoading(
                store=_storing(piece),
                load_dtype=dense_dtype,
                derived=tuple(names[1:]) if index == 0 else (),
            )
            setattr(layer, name, param)
        layer.dense_shape = (out_features, in_features)
        layer.dense_dtype = dense_dtype
        layer.quantized_names = tuple(names)

    def fill_dummy(self, layer: nn.Module, fill: Callable[[torch.Tensor], None]) -> None:
        """Random dense weights, quantized as a loaded checkpoint's would be (dummy format)."""
        dense = torch.empty(layer.dense_shape, dtype=layer.dense_dtype, device=layer.weight.device)
        fill(dense)
        for name in layer.quantized_names:
            param = getattr(layer, name)
            loading_of(param).store(param.data, dense)

    def weight_bytes(self, layer: nn.Module) -> int:
        return sum(
            getattr(layer, n).numel() * getattr(layer, n).element_size()
            for n in layer.quantized_names
        )


def _storing(piece: Callable[[torch.Tensor], torch.Tensor]):
    def store(target: torch.Tensor, dense: torch.Tensor) -> None:
        values = piece(dense.to(target.device))
        if values.shape != target.shape:
            raise ValueError(
                f"quantized slice has shape {tuple(values.shape)}, expected {tuple(target.shape)}"
            )
        target.copy_(values)

    return store


def kernel_rows(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1])


def finish(y: torch.Tensor, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """A product of kernel rows back to x's leading shape and dtype, with the bias."""
    y = y.to(x.dtype).reshape(*x.shape[:-1], y.shape[-1])
    return y if bias is None else y + bias


def refresh(layer: nn.Module, name: str, value: torch.Tensor) -> None:
    """Set a derived tensor, in place where one of the same shape exists: CUDA graphs captured
    with it keep reading the right memory after a weights update."""
    current = getattr(layer, name, None)
    if current is not None and current.shape == value.shape and current.dtype == value.dtype:
        current.copy_(value)
    else:
        setattr(layer, name, value)
