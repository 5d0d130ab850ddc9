"""The logits stage: min_tokens and grammar masks, in float32, before any draw; with nothing to
mask, the logits as the head made them."""

import numpy as np
import torch

from aioworker.compute.sampling.sampler import SampleRow
from aioworker.compute.step.logits import logits_stage, refused_tokens
from aioworker.core.grammar import StepMasks
from aioworker.core.plan import SamplingSettings


def test_stop_tokens_are_masked_until_min_tokens_is_reached() -> None:
    logits = torch.zeros(2, 10, dtype=torch.bfloat16)
    logits[:, 3] = 100.0  # the stop token dominates
    settings = SamplingSettings(0.0, 0, 1.0, None, min_tokens=4, stop_token_ids=[3])
    early, late = SampleRow(settings, 10, 3), SampleRow(settings, 11, 4)
    staged = logits_stage(logits, [early, late])
    assert staged.dtype == torch.float32
    assert staged.argmax(dim=-1).tolist()[0] != 3 and staged[0, 3] == float("-inf")
    assert staged.argmax(dim=-1).tolist()[1] == 3


def test_with_nothing_to_mask_the_logits_pass_as_the_head_made_them() -> None:
    """No float32 pass for a step that masks nothing: a greedy step's argmax reads bf16 as it is
    (exact), and the sampler widens what it computes on."""
    logits = torch.randn(2, 10).bfloat16()
    settings = SamplingSettings(0.0, 0, 1.0, None, min_tokens=4, stop_token_ids=[3])
    done = SampleRow(settings, 10, 4)  # min_tokens reached: its stops are not masked
    free = SampleRow(SamplingSettings(0.0, 0, 1.0, None, min_tokens=4, stop_token_ids=[]), 5, 0)
    assert logits_stage(logits, [done, free]) is logits
    masks = StepMasks(0, [], bitmask(10, []))
    assert logits_stage(logits, [done], refused_tokens(masks, logits.device, 10)) is logits


def bitmask(num_tokens: int, allowed: list[list[int]]) -> np.ndarray:
    """Rows of int32 words, bit t set where token t is allowed."""
    bits = np.zeros((len(allowed), -(-num_tokens // 32) * 32), np.uint8)
    for row, tokens in enumerate(allowed):
        bits[row, tokens] = 1
    return np.packbits(bits, axis=1, bitorder="little").view(np.int32)


def test_grammar_masks_leave_only_allowed_tokens_in_their_rows() -> None:
    vocab = 70  # not a multiple of 32: the last word's spare bits are cut off
    logits = torch.randn(3, vocab)
    free = SamplingSettings(0.0, 0, 1.0, None, 0, [])
    rows = [SampleRow(free, 5, 0)] * 3
    masks = StepMasks(0, [0, 2], bitmask(vocab, [[1, 33, 69], list(range(vocab)), [64]]))
    staged = logits_stage(logits.clone(), rows, refused_tokens(masks, logits.device, vocab))
    assert torch.isfinite(staged[0]).nonzero().flatten().tolist() == [1, 33, 69]
    assert torch.equal(staged[1], logits[1])  # an unguided row is untouched
    assert torch.isfinite(staged[2]).nonzero().flatten().tolist() == [64]


def test_min_tokens_yields_where_the_grammar_allows_only_a_stop_token() -> None:
    logits = torch.zeros(2, 40)
    settings = SamplingSettings(0.0, 0, 1.0, None, min_tokens=8, stop_token_ids=[3], guided=True)
    rows = [SampleRow(settings, 10, 2), SampleRow(settings, 10, 2)]
    masks = StepMasks(0, [0, 1], bitmask(40, [[3], [3, 5]]))
    staged = logits_stage(logits, rows, refused_tokens(masks, logits.device, 40))
    assert staged[0].argmax() == 3  # the grammar has ended: its stop token stays
    assert torch.isfinite(staged[1]).nonzero().flatten().tolist() == [5]
