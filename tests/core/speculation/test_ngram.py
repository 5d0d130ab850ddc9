import pytest
from hypothesis import given
from hypothesis import strategies as st

from aioworker.core.speculation.ngram import NgramProposer


def brute_force(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    for n in range(min(max_n, len(tokens) - 1), min_n - 1, -1):
        suffix = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start : start + n] == suffix:
                return tokens[start + n : start + n + k]
    return []


def test_the_longest_match_wins_and_its_continuation_is_proposed() -> None:
    proposer = NgramProposer(1, 3)
    #         a  b  c  X  Y  b  c  Z  a  b  c
    tokens = [1, 2, 3, 9, 8, 2, 3, 7, 1, 2, 3]
    assert proposer.propose(tokens, 2) == [9, 8]  # "1 2 3" beats the later "2 3"
    assert NgramProposer(1, 2).propose(tokens, 2) == [7, 1]  # the latest "2 3"


def test_nothing_is_proposed_without_a_match_or_room() -> None:
    proposer = NgramProposer(2, 3)
    assert proposer.propose([1, 2, 3, 4], 4) == []
    assert proposer.propose([1, 2, 1, 2], 0) == []
    assert proposer.propose([5], 3) == []


def test_a_match_across_token_boundaries_in_the_bytes_is_not_taken() -> None:
    # 256 = 0x100 packs as 00 01 00 00; bytes of neighbours can line up with a pattern shifted
    # by one byte, which must be skipped.
    tokens = [256, 0, 0, 9, 1, 0]  # 00 01 00 00 | 00 00 00 00 | 00 ... holds "1 0" at byte 1
    assert NgramProposer(2, 2).propose(tokens, 1) == []
    assert NgramProposer(2, 2).propose([1, 0, 5, *tokens], 1) == [5]


@given(
    # Values whose bytes overlap, so unaligned byte matches happen.
    st.lists(st.sampled_from([0, 1, 2, 256, 65536, 16777216]), min_size=1, max_size=40),
    st.integers(1, 5),
    st.integers(1, 3),
    st.integers(0, 2),
)
def test_it_agrees_with_a_brute_force_search(tokens, k, min_n, extra) -> None:
    max_n = min_n + extra
    assert NgramProposer(min_n, max_n).propose(tokens, k) == brute_force(tokens, k, min_n, max_n)


def test_bad_sizes_are_refused_naming_them() -> None:
    with pytest.raises(ValueError, match="ngram_min <= ngram_max"):
        NgramProposer(3, 2)
