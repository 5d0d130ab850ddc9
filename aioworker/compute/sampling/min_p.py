"""min_p: after temperature, tokens less likely than min_p times the likeliest one are dropped
(set to -inf) before top-k and top-p, as transformers' MinPLogitsWarper does."""

from __future__ import annotations

import torch

from aioworker.compute.sampling.slot_pool import SlotPool
from aioworker.compute.small_copies import to_device
from aioworker.core.plan import LogitControls, NewSeq


class MinP:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.pool = SlotPool(device, {"min_p": ((), torch.float32)})

    @staticmethod
    def wants(controls: LogitControls) -> bool:
        return controls.min_p > 0.0

    def admit(self, new: NewSeq) -> int:
        slot = self.pool.take(new.seq_id)
        value = to_device(self.device, new.sampling.controls.min_p, torch.float32)
        self.pool["min_p"][slot].copy_(value)
        return slot

    def truncate(
        self, scaled: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor
    ) -> torch.Tensor:
        """scaled [R, V]: logits / temperature; returns a new tensor (logprobs read `scaled`)."""
        x = scaled.index_select(0, rows)  # [n, V]
        probs = torch.softmax(x, dim=-1)
        floor = self.pool["min_p"].index_select(0, slots)[:, None] * probs.amax(-1, keepdim=True)
        return scaled.index_copy(0, rows, x.masked_fill(probs < floor, float("-inf")))
