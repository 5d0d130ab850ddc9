"""repetition_penalty, presence_penalty and frequency_penalty, from per-sequence counts that live
on the device and are updated right after each draw, so a step launched while the previous one
still runs (the GPU's run-ahead) already counts the token that step samples.

repetition_penalty follows CTRL: over every token of the prompt or the output, a positive logit
is divided by the penalty and a negative one multiplied. presence and frequency follow OpenAI,
over output tokens only: logit -= presence * (count > 0) + frequency * count.
"""

from __future__ import annotations

import torch

from aioworker.compute.sampling.slot_pool import SlotPool
from aioworker.compute.small_copies import to_device
from aioworker.core.plan import LogitControls, NewSeq


class Penalties:
    def __init__(self, device: torch.device, vocab_size: int) -> None:
        self.device = device
        # Per slot: each output token's count, whether a token is in the prompt, and the
        # penalties (repetition, presence, frequency): 5 bytes per vocabulary entry, plus 12.
        self.pool = SlotPool(
            device,
            {
                "counts": ((vocab_size,), torch.int32),
                "in_prompt": ((vocab_size,), torch.bool),
                "penalties": ((3,), torch.float32),
            },
        )
        self.one = torch.ones((), dtype=torch.int32, device=device)

    @staticmethod
    def wants(controls: LogitControls) -> bool:
        return controls.uses_penalties

    def admit(self, new: NewSeq) -> int:
        """The counts of what the sequence has seen (`new.token_ids`: prompt, then outputs)."""
        controls = new.sampling.controls
        slot = self.pool.take(new.seq_id)
        counts, in_prompt = self.pool["counts"][slot], self.pool["in_prompt"][slot]
        counts.zero_()
        in_prompt.zero_()
        outputs = new.token_ids[new.num_prompt_tokens :]
        if outputs:
            counts.index_put_((to_device(self.device, outputs),), self.one, accumulate=True)
        if controls.repetition_penalty != 1.0:
            prompt = to_device(self.device, new.token_ids[: new.num_prompt_tokens])
            in_prompt.index_fill_(0, prompt, True)
        settings = [
            controls.repetition_penalty,
            controls.presence_penalty,
            controls.frequency_penalty,
        ]
        self.pool["penalties"][slot].copy_(to_device(self.device, settings, torch.float32))
        return slot

    def process_logits(self, logits: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor) -> None:
        """logits [R, V] float32, in place; rows [n] of them use the pool's `slots` [n]."""
        x = logits.index_select(0, rows)  # [n, V]
        counts = self.pool["counts"].index_select(0, slots)  # [n, V]
        penalties = self.pool["penalties"].index_select(0, slots)  # [n, 3]
        repetition, presence, frequency = penalties[:, 0:1], penalties[:, 1:2], penalties[:, 2:3]
        in_output = counts > 0
        seen = in_output | self.pool["in_prompt"].index_select(0, slots)
        x = torch.where(seen, torch.where(x < 0, x * repetition, x / repetition), x)
        x = x - frequency * counts - presence * in_output
        logits.index_copy_(0, rows, x)

    def record(self, tokens: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor) -> None:
        """Count the tokens just drawn (tokens [R]); a slot appears once per step."""
        drawn = tokens.index_select(0, rows)
        self.pool["counts"].index_put_((slots, drawn), self.one, accumulate=True)
