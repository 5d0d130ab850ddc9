"""The logits stage of the step pipeline: the sampled rows' logits in float32, with every mask
that must apply before any draw. Today that is one: a sequence's stop tokens while it has fewer
than min_tokens outputs. Grammar masks and speculative verification come in here too, so the
sampler only ever sees logits that are final.
"""

from __future__ import annotations

import torch

from aioworker.compute.sampling.sampler import SampleRow
from aioworker.compute.small_copies import to_device


def logits_stage(logits: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
    """logits [S, V] of the sampled rows -> float32 logits ready for the sampler."""
    logits = logits.float()
    mask_stop_tokens(logits, rows)
    return logits


def mask_stop_tokens(logits: torch.Tensor, rows: list[SampleRow]) -> None:
    """In place: -inf on a row's stop tokens until it has min_tokens outputs."""
    for i, row in enumerate(rows):
        if row.num_output_tokens < row.sampling.min_tokens and row.sampling.stop_token_ids:
            logits[i, to_device(logits.device, row.sampling.stop_token_ids)] = float("-inf")
