"""logit_bias, allowed_token_ids and bad words of one token, folded at admission into one row
per sequence that is added to its logits: the bias where one is given, -inf where a token may
not be sampled (outside allowed_token_ids, or a banned word), 0 elsewhere."""

from __future__ import annotations

import torch

from aioworker.compute.sampling.slot_pool import SlotPool
from aioworker.compute.small_copies import to_device
from aioworker.core.plan import LogitControls, NewSeq


def one_token_words(controls: LogitControls) -> list[int]:
    return [word[0] for word in controls.bad_words_token_ids if len(word) == 1]


class TokenBias:
    def __init__(self, device: torch.device, vocab_size: int) -> None:
        self.device = device
        self.pool = SlotPool(device, {"bias": ((vocab_size,), torch.float32)})

    @staticmethod
    def wants(controls: LogitControls) -> bool:
        return (
            bool(controls.logit_bias)
            or controls.allowed_token_ids is not None
            or bool(one_token_words(controls))
        )

    def admit(self, new: NewSeq) -> int:
        controls = new.sampling.controls
        slot = self.pool.take(new.seq_id)
        row = self.pool["bias"][slot]  # [V]
        if controls.allowed_token_ids is not None:
            row.fill_(float("-inf"))
            row.index_fill_(0, to_device(self.device, controls.allowed_token_ids), 0.0)
        else:
            row.zero_()
        if controls.logit_bias:  # its keys are distinct: one add each
            ids = to_device(self.device, list(controls.logit_bias))
            values = to_device(self.device, list(controls.logit_bias.values()), torch.float32)
            row.index_add_(0, ids, values)
        banned = one_token_words(controls)
        if banned:
            row.index_fill_(0, to_device(self.device, banned), float("-inf"))
        return slot

    def process_logits(self, logits: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor) -> None:
        """logits [R, V] float32, in place; rows [n] of them use the pool's `slots` [n]."""
        logits.index_add_(0, rows, self.pool["bias"].index_select(0, slots))
