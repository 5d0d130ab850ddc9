"""The LM head through a GPU format (model.quantize_lm_head on a GPU): a quantized copy beside
its dense weight.

The head's weight stays dense. It may be the input embedding's (tied), and embedding lookups
need it dense. Checkpoints and weights updates load into it as they would anyway. After every
load, commit and resume (`process_after_loading`), the format quantizes a copy of this rank's
rows, and the products read only the copy: the bytes a decode step reads for the head fall
from 2 a weight (bf16) to the format's (e4m3 and int8: 1; int4: ~0.5), as gpt-fast's quantized
modes do for its output layer. The cost is the copy's memory on top of the dense weight.

The copy is a bare module held outside the head's own modules (`__dict__`, not registered), so
the loader, staging and the parameter walks never see it. Its tensors are refreshed in place
after an update, so captured CUDA graphs keep reading them.
"""

from __future__ import annotations

import torch
from torch import nn

from aioworker.compute.layers.linear_method import UNQUANTIZED
from aioworker.compute.layers.quantized.on_load import QuantizedOnLoad, refresh

COPY = "quantized_copy"  # the copy's attribute on the head


class QuantizedCopy:
    def __init__(self, fmt: QuantizedOnLoad) -> None:
        self.format = fmt
        self.name = f"{fmt.name} (a quantized copy)"

    def create_weights(self, layer: nn.Module, out_features: int, in_features: int) -> None:
        UNQUANTIZED.create_weights(layer, out_features, in_features)

    def process_after_loading(self, layer: nn.Module) -> None:
        copy = layer.__dict__.get(COPY)
        if copy is None:
            copy = layer.__dict__[COPY] = nn.Module()
        values = self.format.quantize(layer.weight.data)
        for name, value in values.items():
            refresh(copy, name, value)
        copy.quantized_names = tuple(values)
        self.format.process_after_loading(copy)

    def drop_derived(self, layer: nn.Module) -> None:
        layer.__dict__.pop(COPY, None)

    def copy_of(self, layer: nn.Module) -> nn.Module:
        copy = layer.__dict__.get(COPY)
        if copy is None:
            raise RuntimeError("the LM head's quantized copy is made after loading: none yet")
        return copy

    def apply(
        self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        return self.format.apply(self.copy_of(layer), x, bias)

    def weight_bytes(self, layer: nn.Module) -> int:
        return self.format.weight_bytes(self.copy_of(layer))
