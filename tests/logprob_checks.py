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
    """`reference_row`: a torch tensor of log-probabilities over the vocabulary. A value far in
    the tail carries float32's rounding of logits of its size: 1e-4, and 1e-5 of the value more
    (a prompt token at -21.88 differed by 1.3e-4 when the prompt was scored in passes of 7)."""
    assert entry.token_id == token_id
    expected = reference_row[token_id].item()
    assert abs(entry.logprob - expected) <= 1e-4 + 1e-5 * abs(expected)
    values, ids = reference_row.topk(k)
    assert list(entry.top_token_ids) == ids.tolist()
    assert max(abs(a - b) for a, b in zip(entry.top_logprobs, values.tolist(), strict=True)) <= 1e-4
