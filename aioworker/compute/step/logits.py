"""The logits stage of the step pipeline: the sampled rows' logits in float32, with every mask
that must apply before any draw: a sequence's stop tokens while it has fewer than min_tokens
outputs, and the grammar masks of guided rows (core/grammar.py). The sampler, the verifier and
the logprobs only ever see logits that are final, so a guided row's logprobs are those of the
masked distribution.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from aioworker.compute.sampling.sampler import SampleRow
from aioworker.compute.small_copies import to_device
from aioworker.core.grammar import StepMasks


def logits_stage(
    logits: torch.Tensor, rows: list[SampleRow], masks: StepMasks | None = None
) -> torch.Tensor:
    """logits [S, V] of the sampled rows -> float32 logits ready for the sampler."""
    logits = logits.float()
    if masks is not None and masks.rows:
        apply_grammar_masks(logits, masks)
    mask_stop_tokens(logits, rows)
    return logits


def apply_grammar_masks(logits: torch.Tensor, masks: StepMasks) -> None:
    """In place: -inf on every token a guided row's grammar does not allow next."""
    if logits.device.type == "cpu":
        _apply_on_cpu(logits, masks)
        return
    # Every row at once (unguided rows allow every token): a few kernels, no gather or scatter.
    device, (num_rows, vocab_size) = logits.device, logits.shape
    words = to_device(device, masks.bitmask)  # [S, W] int32, bit t of word w: token 32w + t
    allowed = ((words.unsqueeze(-1) >> _shifts(device)) & 1).view(num_rows, -1)[:, :vocab_size]
    logits.masked_fill_(allowed == 0, float("-inf"))


@functools.cache
def _shifts(device: torch.device) -> torch.Tensor:
    return torch.arange(32, device=device, dtype=torch.int32)


def _apply_on_cpu(logits: torch.Tensor, masks: StepMasks) -> None:
    """The guided rows only, each in place; numpy unpacks the bits (one byte per token)."""
    vocab_size = logits.shape[1]
    words = masks.bitmask[masks.rows]
    bits = np.unpackbits(words.view(np.uint8), axis=1, bitorder="little")[:, :vocab_size]
    refused = torch.from_numpy(bits == 0)
    if len(masks.rows) == logits.shape[0]:
        logits.masked_fill_(refused, float("-inf"))
        return
    for i, row in enumerate(masks.rows):
        logits[row].masked_fill_(refused[i], float("-inf"))


def mask_stop_tokens(logits: torch.Tensor, rows: list[SampleRow]) -> None:
    """In place: -inf on a row's stop tokens until it has min_tokens outputs; a guided row
    keeps them where its grammar allows nothing else (the grammar has ended)."""
    for i, row in enumerate(rows):
        if row.num_output_tokens < row.sampling.min_tokens and row.sampling.stop_token_ids:
            stops = to_device(logits.device, row.sampling.stop_token_ids)
            if not row.sampling.guided:
                logits[i, stops] = float("-inf")
                continue
            masked = logits[i].index_fill(0, stops, float("-inf"))
            logits[i] = torch.where(torch.isinf(masked).all(), logits[i], masked)
