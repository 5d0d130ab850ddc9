"""The shared shape of a method that quantizes a dense checkpoint while loading it.

Its parameters hold only quantized values and their scales: no dense copy is ever made, in
device memory or in a staged update. The checkpoint names one dense tensor per weight; the
first parameter takes its name and the others are filled from the same tensor (ParamLoading's
`derived`). The dense slice (this rank's shard, moved to the parameters' device first) is quantized once,
and each parameter keeps its own piece, so a tensor-parallel shard is quantized by the rank that
holds it and the scales follow the split.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import nn

from aioworker.compute.layers.linear_method import NothingDerived
from aioworker.compute.layers.param_loading import ParamLoading, loading_of


class QuantizedOnLoad(NothingDerived):
    name: str

    def shapes(self, out_features: int, in_features: int) -> dict[str, torch.Tensor]:
        """The parameters, empty, the one named like the checkpoint's tensor first."""
        raise NotImplementedError

    def quantize(self, dense: torch.Tensor) -> dict[str, torch.Tensor]:
        """Every parameter's values for these dense rows."""
        raise NotImplementedError

    def create_weights(self, layer: nn.Module, out_features: int, in_features: int) -> None:
        dense_dtype = torch.get_default_dtype()  # the model's (build_model sets it)
        tensors = self.shapes(out_features, in_features)
        names = tuple(tensors)
        for index, (name, tensor) in enumerate(tensors.items()):
            param = nn.Parameter(tensor, requires_grad=False)
            param.loading = ParamLoading(
                store=functools.partial(self._store, layer, name),
                load_dtype=dense_dtype,
                derived=names[1:] if index == 0 else (),
            )
            setattr(layer, name, param)
        layer.dense_shape = (out_features, in_features)
        layer.dense_dtype = dense_dtype
        layer.quantized_names = names

    def _store(
        self, layer: nn.Module, name: str, target: torch.Tensor, dense: torch.Tensor
    ) -> None:
        """The first parameter's store quantizes the slice; its siblings, stored next from the
        same slice, take their values from that one quantization (kept on the layer until the
        last has)."""
        key = (dense.data_ptr(), tuple(dense.shape), tuple(dense.stride()), target.device)
        memo = getattr(layer, "_quantized_slice", None)
        if name == layer.quantized_names[0] or memo is None or memo[0] != key:
            memo = (key, self.quantize(dense.to(target.device)))
        last = name == layer.quantized_names[-1]
        layer._quantized_slice = None if last else memo
        values = memo[1][name]
        if values.shape != target.shape:
            raise ValueError(
                f"quantized slice has shape {tuple(values.shape)}, expected {tuple(target.shape)}"
            )
        target.copy_(values)

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
