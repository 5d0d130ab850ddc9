"""The logits stage of the step pipeline: the sampled rows' logits in float32, with every mask
that must apply before any draw: a sequence's stop tokens while it has fewer than min_tokens
outputs, and the grammar masks of guided rows (core/grammar.py). The sampler, the verifier and
the logprobs only ever see logits that are final, so a guided row's logprobs are those of the
masked distribution.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch

from aioworker.compute.sampling.sampler import SampleRow
from aioworker.compute.small_copies import to_device
from aioworker.core.grammar import StepMasks


@dataclass(slots=True)
class RefusedTokens:
    """A step's grammar masks as the logits stage applies them: True where a row's grammar
    refuses a token. Made by `refused_tokens` on the thread that provides the masks (on a GPU,
    queued on the executor's stream), so the step itself only has one fill to make."""

    step_id: int
    rows: list[int]  # the guided rows
    # [S, V] on a GPU (unguided rows refuse nothing); [len(rows), V] on the CPU.
    refused: torch.Tensor


def refused_tokens(masks: StepMasks, device: torch.device, vocab_size: int) -> RefusedTokens:
    """The bitmask unpacked, one bool per token: on a GPU every row in a few kernels; on the
    CPU the guided rows, by numpy (bit t of int32 word w is token 32w + t)."""
    if device.type == "cpu":
        words = masks.bitmask[masks.rows]
        bits = np.unpackbits(words.view(np.uint8), axis=1, bitorder="little")[:, :vocab_size]
        return RefusedTokens(masks.step_id, masks.rows, torch.from_numpy(bits == 0))
    words = to_device(device, masks.bitmask)  # [S, W] int32
    bits = (words.unsqueeze(-1) >> _shifts(device)) & 1  # [S, W, 32]
    refused = bits.view(len(masks.bitmask), -1)[:, :vocab_size] == 0
    return RefusedTokens(masks.step_id, masks.rows, refused)


@functools.cache
def _shifts(device: torch.device) -> torch.Tensor:
    return torch.arange(32, device=device, dtype=torch.int32)


def logits_stage(
    logits: torch.Tensor, rows: list[SampleRow], masks: RefusedTokens | None = None
) -> torch.Tensor:
    """logits [S, V] of the sampled rows -> logits ready for the sampler: float32 where a mask
    is written into them, else as the head made them (the sampler and verify widen them where
    they compute on them; a greedy step's argmax reads them as they are, with no float32 pass)."""
    grammar = masks is not None and bool(masks.rows)
    if not grammar and not any(_stops_masked(row) for row in rows):
        return logits
    logits = logits.float()
    if grammar:
        apply_grammar_masks(logits, masks)
    mask_stop_tokens(logits, rows)
    return logits


def apply_grammar_masks(logits: torch.Tensor, masks: RefusedTokens) -> None:
    """In place: -inf on every token a guided row's grammar does not allow next."""
    refused = masks.refused
    if refused.shape[0] == logits.shape[0]:  # every row (a GPU's; or all rows guided)
        logits.masked_fill_(refused, float("-inf"))
        return
    for i, row in enumerate(masks.rows):
        logits[row].masked_fill_(refused[i], float("-inf"))


def _stops_masked(row: SampleRow) -> bool:
    """Whether the row's stop tokens are masked this step: until it has min_tokens outputs."""
    return row.num_output_tokens < row.sampling.min_tokens and bool(row.sampling.stop_token_ids)


def mask_stop_tokens(logits: torch.Tensor, rows: list[SampleRow]) -> None:
    """In place: -inf on a row's stop tokens until it has min_tokens outputs; a guided row
    keeps them where its grammar allows nothing else (the grammar has ended)."""
    for i, row in enumerate(rows):
        if _stops_masked(row):
            stops = to_device(logits.device, row.sampling.stop_token_ids)
            if not row.sampling.guided:
                logits[i, stops] = float("-inf")
                continue
            masked = logits[i].index_fill(0, stops, float("-inf"))
            logits[i] = torch.where(torch.isinf(masked).all(), logits[i], masked)
