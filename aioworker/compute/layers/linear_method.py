"""How a linear layer holds its weight and multiplies by it: the seam that weight formats plug
into (quantized ones next to today's two).

A method has three moments, each called by one owner:
- `create_weights(layer, out_features, in_features)`: when the layer is built, before loading;
  it registers the parameters the checkpoint loads into (a dense `weight` here; a quantized
  format adds its scales);
- `process_after_loading(layer)`: after the weights are loaded, and again after every weights
  update is committed and every resume: whatever is derived from the loaded weights (a packed
  copy, quantized values) is made here, never by the loader;
- `apply(layer, x, bias)`: the layer's forward, y = x W^T (+ bias);
- `weight_bytes(layer)`: the bytes of weight `apply` reads (the startup log, benchmarks).

A method may also have `apply_gated(layer, x)`: silu(x gate^T) * (x up^T) for a layer holding
[gate; up], the activation fused into the product (`gated_product` falls back to both steps).

`drop_derived(layer)` forgets what `process_after_loading` made (memory is being released;
resume processes the restored weights again). Methods are stateless: one instance serves every
layer, and what a layer needs lives on the layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from aioworker.compute.layers.gemv.add_norm_input import PreNormed
from aioworker.compute.layers.norm import RMSNorm
from aioworker.compute.layers.ops import add_rms_norm, silu_and_mul


class LinearMethod(Protocol):
    name: str

    def create_weights(self, layer: nn.Module, out_features: int, in_features: int) -> None: ...

    def process_after_loading(self, layer: nn.Module) -> None: ...

    def drop_derived(self, layer: nn.Module) -> None: ...

    def apply(
        self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor: ...

    def weight_bytes(self, layer: nn.Module) -> int:
        """Bytes of weight one forward reads (what bounds a decode step)."""
        ...


class NothingDerived:
    """For methods that multiply by what was loaded, as loaded: nothing to derive or drop."""

    def process_after_loading(self, layer: nn.Module) -> None:
        pass

    def drop_derived(self, layer: nn.Module) -> None:
        pass


class Unquantized(NothingDerived):
    """The dense weight in the model's dtype, multiplied by torch (cuBLAS on the GPU)."""

    name = "none"

    def create_weights(self, layer: nn.Module, out_features: int, in_features: int) -> None:
        layer.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)

    def apply(
        self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        return F.linear(x, layer.weight, bias)

    def weight_bytes(self, layer: nn.Module) -> int:
        return layer.weight.numel() * layer.weight.element_size()


UNQUANTIZED = Unquantized()


@dataclass(frozen=True)
class LinearMethods:
    """A model's methods: one for its decoder projections, one for its LM head (whose weight
    is an embedding's and stays dense: a format reaches it only as a method that keeps the
    dense weight, quantized/head_copy.py on a GPU)."""

    projections: LinearMethod = UNQUANTIZED
    lm_head: LinearMethod = UNQUANTIZED


DENSE = LinearMethods()


def gated_product(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """silu(x gate^T) * (x up^T) for a layer holding [gate; up]: in one kernel where its method
    has one (`apply_gated`), else the product, then the activation."""
    fused = getattr(layer.linear_method, "apply_gated", None)
    if fused is not None and layer.bias is None:
        return fused(layer, x)
    return silu_and_mul(layer(x))


def normed_product(
    layer: nn.Module,
    norm: RMSNorm,
    x: torch.Tensor,
    residual: torch.Tensor | None,
    gated: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(the layer's product of norm(x + residual), x + residual); for `gated`, the product is
    `gated_product`'s. The add and the norm run inside the product's kernel where the layer's
    method can (`apply_normed`), else first, in a kernel of their own. A PreNormed x (the
    product before did half of them) is finished inside the product (`apply_prenormed`), else
    normed from its sum, which is the new residual."""
    if isinstance(x, PreNormed):
        prenormed = getattr(layer.linear_method, "apply_prenormed", None)
        if prenormed is not None and x.weight is norm.weight and x.eps == norm.eps:
            y = prenormed(layer, x, gated)
            if y is not None:
                return y, x.h
        x, residual = add_rms_norm(norm, x, None)
        return (gated_product(layer, x) if gated else layer(x)), residual
    fused = getattr(layer.linear_method, "apply_normed", None)
    if fused is not None and not (gated and layer.bias is not None):
        done = fused(layer, x, residual, norm, gated)
        if done is not None:
            return done
    x, residual = add_rms_norm(norm, x, residual)
    return (gated_product(layer, x) if gated else layer(x)), residual


def methods_in(model: nn.Module):
    """(layer, its method) for every layer of the model that multiplies through one."""
    for module in model.modules():
        method = getattr(module, "linear_method", None)
        if method is not None:
            yield module, method


def process_after_loading(model: nn.Module) -> None:
    """Every layer's derived state, from the weights it holds now."""
    for layer, method in methods_in(model):
        method.process_after_loading(layer)


def drop_derived(model: nn.Module) -> None:
    for layer, method in methods_in(model):
        method.drop_derived(layer)


def weight_bytes(model: nn.Module) -> int:
    """Bytes of weight a decode step reads through the model's linear methods."""
    return sum(method.weight_bytes(layer) for layer, method in methods_in(model))
