"""Bad words of several tokens: a word's last token is banned in a step where the output ends
with its other tokens. Each sequence keeps a window of its latest outputs on the device, shifted
right after each draw, so the check never waits for the host (one-token words are banned
outright, in compute/sampling/token_bias.py)."""

from __future__ import annotations

import numpy as np
import torch

from aioworker.compute.sampling.slot_pool import SlotPool
from aioworker.compute.small_copies import to_device
from aioworker.core.plan import LogitControls, NewSeq
from aioworker.core.sampling_params import MAX_BAD_WORD_TOKENS, MAX_BAD_WORDS

# The most output tokens a word's prefix can span.
WINDOW = MAX_BAD_WORD_TOKENS - 1
# A window entry before the first output; prefix entries of a word shorter than the window
# (matching anything), and of an unused word (matching nothing). Token ids are >= 0.
NO_TOKEN, ANY, NEVER = -1, -2, -3


class BadWords:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        # Per slot, in int32: the window, each word's prefix right-aligned to the window's end,
        # and its last token: (15 + 128 * 16) * 4 bytes, about 8 KB.
        self.pool = SlotPool(
            device,
            {
                "window": ((WINDOW,), torch.int32),
                "prefixes": ((MAX_BAD_WORDS, WINDOW), torch.int32),
                "last": ((MAX_BAD_WORDS,), torch.int32),
            },
        )

    @staticmethod
    def wants(controls: LogitControls) -> bool:
        return any(len(word) > 1 for word in controls.bad_words_token_ids)

    def admit(self, new: NewSeq) -> int:
        """The window starts from the outputs before a preemption (`new.token_ids`)."""
        words = [w for w in new.sampling.controls.bad_words_token_ids if len(w) > 1]
        prefixes = np.full((MAX_BAD_WORDS, WINDOW), NEVER, dtype=np.int32)
        last = np.zeros(MAX_BAD_WORDS, dtype=np.int32)
        for index, word in enumerate(words):
            prefixes[index, :] = ANY
            prefixes[index, WINDOW - len(word) + 1 :] = word[:-1]
            last[index] = word[-1]
        outputs = new.token_ids[new.num_prompt_tokens :][-WINDOW:]
        window = np.full(WINDOW, NO_TOKEN, dtype=np.int32)
        window[WINDOW - len(outputs) :] = outputs
        slot = self.pool.take(new.seq_id)
        for name, value in (("prefixes", prefixes), ("last", last), ("window", window)):
            self.pool[name][slot].copy_(to_device(self.device, value))
        return slot

    def process_logits(self, logits: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor) -> None:
        """logits [R, V] float32, in place; rows [n] of them use the pool's `slots` [n]."""
        window = self.pool["window"].index_select(0, slots)[:, None, :]  # [n, 1, W]
        prefixes = self.pool["prefixes"].index_select(0, slots)  # [n, B, W]
        matched = ((prefixes == window) | (prefixes == ANY)).all(dim=-1)  # [n, B]
        last = self.pool["last"].index_select(0, slots).long()  # [n, B]
        ban = torch.zeros(matched.shape, dtype=logits.dtype, device=logits.device)
        ban.masked_fill_(matched, float("-inf"))
        # Adding 0 leaves a logit as it is; a token banned twice stays -inf.
        logits.index_put_((rows[:, None].expand_as(last), last), ban, accumulate=True)

    def record(self, tokens: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor) -> None:
        """Shift the tokens just drawn (tokens [R]) into the windows."""
        window = self.pool["window"].index_select(0, slots)
        drawn = tokens.index_select(0, rows).to(torch.int32)[:, None]
        self.pool["window"].index_copy_(0, slots, torch.cat([window[:, 1:], drawn], dim=1))
