"""Prompt lookup: the tokens that followed the latest earlier occurrence of the sequence's last
n tokens, trying the longest n first. Copy-heavy work (rewriting, quoting, code edits) repeats
long runs of its prompt, and this costs no model at all.

It runs on the host, in the scheduler, because it needs only the token history the scheduler
already holds: searching packs the history into bytes once and lets `bytes.rfind` (C speed)
find the pattern: 38 us for a 2,000-token history with no match (every n tried) on the 2-core
CPU machine (docs/benchmarks.md). A search on the device was not built or measured.
"""

from __future__ import annotations

from array import array

_ITEM = array("i").itemsize


class NgramProposer:
    def __init__(self, min_n: int, max_n: int) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= ngram_min <= ngram_max, got {min_n} and {max_n}")
        self.min_n = min_n
        self.max_n = max_n

    def propose(self, token_ids: list[int], max_tokens: int) -> list[int]:
        length = len(token_ids)
        if max_tokens <= 0 or length < self.min_n + 1:
            return []
        packed = array("i", token_ids).tobytes()
        for n in range(min(self.max_n, length - 1), self.min_n - 1, -1):
            start = _latest_earlier(packed, length, n)
            if start >= 0:
                follow = start + n
                return token_ids[follow : follow + max_tokens]
        return []


def _latest_earlier(packed: bytes, length: int, n: int) -> int:
    """Index of the latest occurrence of the last n tokens that ends before the last token
    (so at least one token follows it), or -1."""
    pattern = packed[(length - n) * _ITEM :]
    end = (length - 1) * _ITEM  # the occurrence must lie within the first length - 1 tokens
    while True:
        at = packed.rfind(pattern, 0, end)
        if at < 0:
            return -1
        if at % _ITEM == 0:
            return at // _ITEM
        end = at + len(pattern) - 1  # a match across token boundaries: look further back
