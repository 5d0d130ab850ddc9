"""The logit controls a sampler applies (SamplingParams has their meaning): per-sequence state on
the sampler's device, admitted and released with the plans, and for each step the rows that use
a control, so that each control runs one set of tensor ops over all of them.

In a step: min_tokens masking (the step pipeline's logits stage), then `process_logits` (allowed ids, logit_bias and
one-token bad words; bad words of several tokens; penalties), temperature, `truncate` (min_p),
top-k and top-p, the draw, then `record` (counts and windows take the drawn tokens). A rank
whose running sequences use no control holds no state and builds no StepControls.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from aioworker.compute.sampling.bad_words import BadWords
from aioworker.compute.sampling.min_p import MinP
from aioworker.compute.sampling.penalties import Penalties
from aioworker.compute.sampling.token_bias import TokenBias
from aioworker.compute.small_copies import to_device
from aioworker.core.plan import NewSeq

TOKEN_BIAS, BAD_WORDS, PENALTIES, MIN_P = range(4)


class SamplingControls:
    def __init__(self, device: torch.device, vocab_size: int) -> None:
        self.device = device
        # In the order the step applies them.
        self.kinds = (
            TokenBias(device, vocab_size),
            BadWords(device),
            Penalties(device, vocab_size),
            MinP(device),
        )
        # seq id -> the kinds it uses, each with its slot in that kind's pool.
        self.seqs: dict[int, list[tuple[int, int]]] = {}

    def __len__(self) -> int:
        return len(self.seqs)

    def admit(self, new: NewSeq) -> None:
        """A sequence (re)admitted by a plan; nothing is kept unless it uses a control."""
        controls = new.sampling.controls
        if controls is None:
            return
        self.release((new.seq_id,))  # a plan that re-admits a sequence released it first
        entry = [
            (index, kind.admit(new))
            for index, kind in enumerate(self.kinds)
            if kind.wants(controls)
        ]
        if entry:
            self.seqs[new.seq_id] = entry

    def release(self, seq_ids: Iterable[int]) -> None:
        for seq_id in seq_ids:
            for index, _ in self.seqs.pop(seq_id, ()):
                self.kinds[index].pool.release(seq_id)

    def for_step(self, sampled_seq_ids: Iterable[int]) -> StepControls | None:
        """The rows (in sampling order) that use a control, per kind; None if none does."""
        rows: list[list[int]] = [[] for _ in self.kinds]
        slots: list[list[int]] = [[] for _ in self.kinds]
        find = self.seqs.get
        for row, seq_id in enumerate(sampled_seq_ids):
            entry = find(seq_id)
            if entry is not None:
                for index, slot in entry:
                    rows[index].append(row)
                    slots[index].append(slot)
        if not any(rows):
            return None
        return StepControls(self, rows, slots)


class StepControls:
    """One step's rows per control, as device indices (one copy for all of them)."""

    def __init__(
        self, state: SamplingControls, rows: list[list[int]], slots: list[list[int]]
    ) -> None:
        self.kinds = state.kinds
        flat = [value for r, s in zip(rows, slots, strict=True) for value in (*r, *s)]
        on_device = to_device(state.device, flat, torch.int64)
        # Per kind: (rows of the batch [n], slots of its pool [n]), or None where no row uses it.
        self.parts: list[tuple[torch.Tensor, torch.Tensor] | None] = []
        offset = 0
        for kind_rows in rows:
            n = len(kind_rows)
            part = on_device[offset : offset + n], on_device[offset + n : offset + 2 * n]
            self.parts.append(part if n else None)
            offset += 2 * n

    def process_logits(self, logits: torch.Tensor) -> None:
        """Masks, biases and penalties on the float32 logits [R, V], in place, before
        temperature."""
        for index in (TOKEN_BIAS, BAD_WORDS, PENALTIES):
            if self.parts[index] is not None:
                self.kinds[index].process_logits(logits, *self.parts[index])

    def truncate(self, scaled: torch.Tensor) -> torch.Tensor:
        """min_p on logits / temperature; a new tensor where a row uses it."""
        if self.parts[MIN_P] is None:
            return scaled
        return self.kinds[MIN_P].truncate(scaled, *self.parts[MIN_P])

    def record(self, tokens: torch.Tensor) -> None:
        """The drawn tokens [R] into the counts and windows, on the device, right after the draw."""
        for index in (BAD_WORDS, PENALTIES):
            if self.parts[index] is not None:
                self.kinds[index].record(tokens, *self.parts[index])
