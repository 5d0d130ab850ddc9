"""The block manager with prefix caching, driven by hypothesis through random admit / append /
fork / free / evict / reset sequences against a shadow of what each block holds."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from aioworker.core.block_manager import BlockManager
from aioworker.core.sampling_params import SamplingParams
from aioworker.core.sequence import Sequence

BLOCK = 4
NUM_BLOCKS = 24
# Prompts drawn from a tiny alphabet and a few shared stems, so prefixes repeat often.
STEMS = [[1] * 9, [1, 2, 3, 4, 5, 6, 7, 8], [2] * 4]
tails = st.lists(st.integers(1, 3), min_size=0, max_size=9)


class PrefixCacheMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = BlockManager(NUM_BLOCKS, BLOCK, enable_prefix_caching=True)
        self.live: list[Sequence] = []
        self.next_id = 0
        # What each block holds: the tokens written into it when it was last allocated.
        self.content: dict[int, tuple[int, ...]] = {}

    def _new_seq(self, token_ids: list[int]) -> Sequence:
        self.next_id += 1
        return Sequence(self.next_id, f"r{self.next_id}", token_ids, SamplingParams())

    def _compute(self, seq: Sequence, first_new_block: int) -> None:
        """The step that computes `seq`'s uncomputed tokens: writes its new blocks."""
        for index in range(first_new_block, len(seq.block_table)):
            chunk = seq.token_ids[index * BLOCK : (index + 1) * BLOCK]
            self.content[seq.block_table[index]] = tuple(chunk)
        seq.num_computed_tokens = len(seq.token_ids)
        self.blocks.register_full_blocks(seq)

    @rule(stem=st.sampled_from(STEMS), tail=tails)
    def admit(self, stem: list[int], tail: list[int]) -> None:
        seq = self._new_seq(stem + tail)
        hits = self.blocks.cached_prefix(seq)
        for index, block_id in enumerate(hits):  # a hit holds exactly these tokens
            assert self.content[block_id] == tuple(
                seq.token_ids[index * BLOCK : (index + 1) * BLOCK]
            )
        assert len(hits) * BLOCK < len(seq.token_ids)  # the last token is always computed
        need = self.blocks.blocks_for_tokens(len(seq.token_ids)) - len(hits)
        if need > self.blocks.num_free_after(hits):
            return
        self.blocks.use_cached(seq, hits)
        self.blocks.allocate(seq, len(seq.token_ids))
        self._compute(seq, len(hits))
        self.live.append(seq)

    @precondition(lambda self: self.live)
    @rule(data=st.data(), extra=st.integers(1, 6))
    def append(self, data, extra: int) -> None:
        seq = data.draw(st.sampled_from(self.live))
        seq.token_ids += data.draw(st.lists(st.integers(1, 3), min_size=extra, max_size=extra))
        first_new = len(seq.block_table)
        partial_shared = (
            seq.num_computed_tokens % BLOCK and self.blocks.ref_counts[seq.block_table[-1]] > 1
        )
        if partial_shared or not self.blocks.can_allocate(seq, len(seq.token_ids)):
            seq.token_ids = seq.token_ids[:-extra]
            return
        self.blocks.allocate(seq, len(seq.token_ids))
        # The tokens land in its last partial block too: only this sequence writes it.
        if seq.num_computed_tokens % BLOCK:
            first_new -= 1
        self._compute(seq, first_new)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def fork(self, data) -> None:
        """A child shares its parent's full blocks and computes the rest itself."""
        parent = data.draw(st.sampled_from(self.live))
        num_full = parent.num_computed_tokens // BLOCK
        if num_full == 0 or self.blocks.num_free_blocks < 1:
            return
        child = self._new_seq(list(parent.token_ids[: num_full * BLOCK]) + [9])
        self.blocks.share(child, parent.block_table[:num_full])
        child.num_computed_tokens = num_full * BLOCK
        child.cache_epoch, child.block_hashes = parent.cache_epoch, parent.block_hashes[:num_full]
        self.blocks.allocate(child, len(child.token_ids))
        self._compute(child, num_full)
        self.live.append(child)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data) -> None:
        seq = data.draw(st.sampled_from(self.live))
        self.live.remove(seq)
        self.blocks.free(seq)

    @rule(n=st.integers(1, 8))
    def evict(self, n: int) -> None:
        """Allocate fresh blocks (evicting cached ones), then give them back."""
        seq = self._new_seq([7] * (n * BLOCK))
        if not self.blocks.can_allocate(seq, n * BLOCK):
            return
        self.blocks.allocate(seq, n * BLOCK)
        self._compute(seq, 0)
        self.blocks.free(seq)

    @rule()
    def reset(self) -> None:
        self.blocks.reset_prefix_cache()
        assert self.blocks.num_cached_blocks == 0

    @invariant()
    def reference_counts_match_the_users(self) -> None:
        users = [0] * NUM_BLOCKS
        for seq in self.live:
            for block_id in seq.block_table:
                users[block_id] += 1
        assert self.blocks.ref_counts == users  # never negative, never a lost reference

    @invariant()
    def every_block_is_in_exactly_one_place(self) -> None:
        blocks = self.blocks
        empty, cached_free = set(blocks._empty), set(blocks._cached_free)
        assert len(empty) == len(blocks._empty) and not empty & cached_free
        in_use = {b for b in range(NUM_BLOCKS) if blocks.ref_counts[b] > 0}
        assert not in_use & (empty | cached_free)  # a block with users is never evictable
        assert in_use | empty | cached_free == set(range(NUM_BLOCKS))
        assert cached_free <= set(blocks._key_of_block)

    @invariant()
    def addresses_name_what_blocks_hold(self) -> None:
        for key, block_id in self.blocks._block_of_key.items():
            assert self.blocks._key_of_block[block_id] == key
            assert self.content[block_id] == key[1]


TestPrefixCache = PrefixCacheMachine.TestCase
TestPrefixCache.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def test_everything_comes_back_after_all_sequences_end() -> None:
    blocks = BlockManager(8, BLOCK, enable_prefix_caching=True)
    seqs = [Sequence(i, f"r{i}", [1] * 9 + [i], SamplingParams()) for i in range(3)]
    for seq in seqs:
        hits = blocks.cached_prefix(seq)
        blocks.use_cached(seq, hits)
        blocks.allocate(seq, len(seq.token_ids))
        seq.num_computed_tokens = len(seq.token_ids)
        blocks.register_full_blocks(seq)
    assert [s.num_cached_tokens for s in seqs] == [0, 8, 8]  # two shared full blocks
    assert blocks.num_used_blocks == 2 + 3  # the shared two, one partial block each
    for seq in seqs:
        blocks.free(seq)
    assert blocks.num_free_blocks == 8 and blocks.num_cached_blocks == 2
    assert blocks.reset_prefix_cache() == 2 and blocks.num_cached_blocks == 0


def test_the_cache_holds_bounded_memory_under_churn() -> None:
    """Addresses live only as long as their blocks: churning prompts through a full cache keeps
    its memory flat (the fuzz test's RSS check relies on it)."""
    import random
    import tracemalloc

    blocks, rng = BlockManager(128, BLOCK, enable_prefix_caching=True), random.Random(0)

    def churn(num: int) -> None:
        for i in range(num):
            seq = Sequence(
                i, "r", [rng.randrange(49000) for _ in range(rng.randint(1, 40))], SamplingParams()
            )
            blocks.use_cached(seq, blocks.cached_prefix(seq))
            blocks.allocate(seq, len(seq.token_ids))
            seq.num_computed_tokens = len(seq.token_ids)
            blocks.register_full_blocks(seq)
            blocks.free(seq)

    churn(3000)
    tracemalloc.start()
    try:
        churn(3000)
        first = tracemalloc.get_traced_memory()[0]
        churn(6000)
        second = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert blocks.num_cached_blocks <= 128
    assert second <= first + 16 * 1024, (first, second)
