"""Checking logprobs: two runs against each other (same tokens and top-k ids, values within 1e-4),
or one entry against a reference row of log-probabilities."""

from __future__ import annotations


def assert_logprobs_close(ours, expected, tolerance: float = 1e-4) -> None:
    assert ours is not None and expected is not None
    assert len(ours) == len(expected)
    for a, b in zip(ours, expected, strict=True):
        assert (a.token_id, a.top_token_ids) == (b.token_id, b.top_token_ids)
        values = [a.logprob, *a.top_logprobs], [b.logprob, *b.top_logprobs]
        assert max(abs(x - y) for x, y in zip(*values, strict=True)) <= tolerance


def assert_entry_matches(entry, reference_row, token_id: int, k: int) -> None:
    """`reference_row`: a torch tensor of log-probabilities over the vocabulary."""
    assert entry.token_id == token_id
    assert abs(entry.logprob - reference_row[token_id].item()) <= 1e-4
    values, ids = reference_row.topk(k)
    assert list(entry.top_token_ids) == ids.tolist()
    assert max(abs(a - b) for a, b in zip(entry.top_logprobs, values.tolist(), strict=True)) <= 1e-4
