"""Paged KV blocks: reference counts, and with prefix caching a content address per full block,
so a prompt (or a recomputed sequence) reuses the longest chain of blocks already computed.
Torch-free.

A block is in one of three places: in use (reference count > 0), free and empty, or free and
cached (reference count 0, still holding KV that a later prefix may hit). New blocks come from
the empty ones first, then from the cached ones, least recently freed first (evicting them).

With a KV connector that keeps blocks in another tier (a host tier), the cached free blocks next
in line for eviction are copied out ahead of it (`next_to_evict`, `hold`): while its copy runs,
a block is held (still a prefix hit, never reused), and once `release_held` says the copy
ended it is *saved*, so evicting it loses nothing. Nothing is copied while empty blocks are
plentiful: a workload that never evicts never copies.
"""

from __future__ import annotations

from collections import OrderedDict, deque

from aioworker.core.block_hashes import BlockHasher, BlockKey
from aioworker.core.sequence import Sequence


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False):
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(
                f"need num_blocks > 0 and block_size > 0, got {num_blocks}, {block_size}"
            )
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        self._empty: deque[int] = deque(range(num_blocks))
        # Free blocks that still hold KV, least recently freed first.
        self._cached_free: OrderedDict[int, None] = OrderedDict()
        self._block_of_key: dict[BlockKey, int] = {}
        self._key_of_block: dict[int, BlockKey] = {}
        # Bumped by reset_prefix_cache (new weights, released memory): part of every hash.
        self.epoch = 0
        self.hasher = BlockHasher()
        # Prompt tokens looked up, and found computed already.
        self.num_queried_tokens = 0
        self.num_hit_tokens = 0
        # Cached free blocks being copied to another tier (never reused meanwhile), and cached
        # blocks whose KV that tier holds (evicting them loses nothing).
        self._held: set[int] = set()
        self.saved: set[int] = set()

    # -- counts -------------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return len(self._empty) + len(self._cached_free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def num_cached_blocks(self) -> int:
        """Blocks with a content address, in use or free."""
        return len(self._key_of_block)

    def blocks_for_tokens(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def num_missing_blocks(self, seq: Sequence, num_tokens: int) -> int:
        """Blocks `seq` still needs so that its first `num_tokens` tokens have a slot."""
        return max(0, self.blocks_for_tokens(num_tokens) - len(seq.block_table))

    def can_allocate(self, seq: Sequence, num_tokens: int) -> bool:
        return self.num_missing_blocks(seq, num_tokens) <= self.num_free_blocks

    # -- growing and freeing ------------------------------------------------------------------

    def allocate(self, seq: Sequence, num_tokens: int) -> list[int]:
        """Grow `seq.block_table` to hold `num_tokens` tokens; returns the new block ids."""
        num_missing = self.num_missing_blocks(seq, num_tokens)
        if num_missing > self.num_free_blocks:
            raise MemoryError(
                f"need {num_missing} KV blocks, {self.num_free_blocks} free; "
                "call can_allocate first"
            )
        return self.append_blocks(seq, num_missing)

    def append_blocks(self, seq: Sequence, num_blocks: int) -> list[int]:
        """Append `num_blocks` free blocks to `seq` (the caller checked there are enough)."""
        new_block_ids = [self._take() for _ in range(num_blocks)]
        seq.block_table.extend(new_block_ids)
        return new_block_ids

    def share(self, seq: Sequence, block_ids: list[int]) -> None:
        """Append blocks in use by another sequence to `seq`, counting the reference."""
        for block_id in block_ids:
            if self.ref_counts[block_id] <= 0:
                raise ValueError(f"block {block_id} is free and cannot be shared")
            self.ref_counts[block_id] += 1
        seq.block_table.extend(block_ids)

    def free(self, seq: Sequence) -> None:
        self.free_blocks(seq.block_table)
        seq.block_table = []

    def free_blocks(self, block_ids: list[int]) -> None:
        """Drop one reference to each block of a block table."""
        # In reverse, so a sequence's tail blocks are evicted before its prefix.
        for block_id in reversed(block_ids):
            self.ref_counts[block_id] -= 1
            if self.ref_counts[block_id] == 0 and block_id not in self._held:
                if block_id in self._key_of_block:
                    self._cached_free[block_id] = None
                else:
                    self._empty.append(block_id)

    # -- another tier -------------------------------------------------------------------------

    def next_to_evict(self, reserve: int) -> list[tuple[int, BlockKey]]:
        """Unsaved cached free blocks, oldest first, that must be copied out for `reserve` blocks
        to be taken without losing a cached one; empty while that many are empty or saved."""
        short = reserve - len(self._empty)
        if short <= 0:
            return []
        unsaved = []
        for block_id in self._cached_free:
            if block_id not in self.saved:
                unsaved.append((block_id, self._key_of_block[block_id]))
            short -= 1
            if short <= 0:
                break
        return unsaved

    def hold(self, block_ids: list[int]) -> None:
        """Cached free blocks being copied out: not taken until `release_held`."""
        for block_id in block_ids:
            del self._cached_free[block_id]
        self._held.update(block_ids)

    def release_held(self, block_ids: list[int], saved: bool) -> None:
        """Held blocks whose copy ended (`saved`: it succeeded). Free ones go back where they
        were in eviction order, first."""
        for block_id in reversed(block_ids):
            self._held.discard(block_id)
            if block_id not in self._key_of_block:
                if self.ref_counts[block_id] == 0:  # a reset forgot it meanwhile
                    self._empty.append(block_id)
                continue
            if saved:
                self.saved.add(block_id)
            if self.ref_counts[block_id] == 0:
                self._cached_free[block_id] = None
                self._cached_free.move_to_end(block_id, last=False)

    def mark_saved(self, block_ids: list[int]) -> None:
        """Cached blocks whose KV the other tier holds already."""
        self.saved.update(block_ids)

    def trim(self, seq: Sequence, num_tokens: int) -> int:
        """Give back the tail blocks of `seq` beyond what its first `num_tokens` tokens need
        (slots written for drafts that were rejected). Returns how many were freed. Only blocks
        full of known tokens ever get a content address, so trimmed blocks were never shared."""
        keep = self.blocks_for_tokens(num_tokens)
        tail = seq.block_table[keep:]
        for block_id in reversed(tail):
            if block_id in self._key_of_block:
                raise ValueError(f"block {block_id} holds cached tokens and cannot be trimmed")
            self.ref_counts[block_id] -= 1
            if self.ref_counts[block_id] == 0:
                self._empty.append(block_id)
        del seq.block_table[keep:]
        return len(tail)

    def _take(self) -> int:
        if self._empty:
            block_id = self._empty.popleft()
        else:
            block_id, _ = self._cached_free.popitem(last=False)  # evict the oldest
            del self._block_of_key[self._key_of_block.pop(block_id)]
            self.saved.discard(block_id)
        self.ref_counts[block_id] = 1
        return block_id

    # -- prefix caching -----------------------------------------------------------------------

    def cached_prefix(self, seq: Sequence) -> list[int]:
        """The blocks of the longest computed chain that starts `seq` (a waiting sequence with
        nothing computed), leaving at least its last token to compute so there are logits to
        sample from. Takes nothing yet (`use_cached` does); readies `seq` to address its blocks."""
        return self.lookup_prefix(seq)[0]

    def lookup_prefix(self, seq: Sequence) -> tuple[list[int], list[BlockKey]]:
        """`cached_prefix`, and the content addresses of the full blocks past the hits (where
        another tier may hold them)."""
        seq.cache_epoch = self.epoch  # its KV begins under these weights
        if not self.enable_prefix_caching:
            return [], []
        seq.block_hashes = []
        if seq.prompt_logprobs is not None:
            return [], []  # prompt logprobs need every prompt position computed
        num_full = (len(seq.token_ids) - 1) // self.block_size
        keys = self.hasher.extend(
            seq.block_hashes, seq.token_ids, num_full, self.block_size, self.epoch
        )
        hits = []
        for key in keys:
            block_id = self._block_of_key.get(key)
            if block_id is None:
                break
            hits.append(block_id)
        del seq.block_hashes[len(hits) :]  # the rest are addressed as they are computed
        return hits, keys[len(hits) :]

    def num_free_after(self, hits: list[int]) -> int:
        """Free blocks left once `hits` are in use (cached free ones among them stop being free)."""
        held = self._held
        return self.num_free_blocks - sum(
            1 for b in hits if self.ref_counts[b] == 0 and b not in held
        )

    def use_cached(self, seq: Sequence, hits: list[int]) -> None:
        """Start `seq` with the blocks `cached_prefix` found: their tokens count as computed."""
        for block_id in hits:
            if self.ref_counts[block_id] == 0 and block_id not in self._held:
                del self._cached_free[block_id]
            self.ref_counts[block_id] += 1
        seq.block_table = list(hits)
        seq.num_computed_tokens = seq.num_cached_tokens = len(hits) * self.block_size
        if self.enable_prefix_caching:
            self.num_queried_tokens += len(seq.token_ids)
            self.num_hit_tokens += seq.num_cached_tokens

    def register_full_blocks(self, seq: Sequence) -> None:
        """Give the blocks of `seq` that are full (every token known and scheduled) their content
        address. Steps run in plan order, so a block is written before any later plan reads it."""
        if seq.cache_epoch != self.epoch:
            return  # its KV began under other weights (or caching is off): never shared
        num_full = min(seq.num_computed_tokens, len(seq.token_ids)) // self.block_size
        if num_full <= len(seq.block_hashes):
            return
        first = len(seq.block_hashes)
        keys = self.hasher.extend(
            seq.block_hashes, seq.token_ids, num_full, self.block_size, self.epoch
        )
        for key, block_id in zip(keys, seq.block_table[first:num_full], strict=True):
            if key not in self._block_of_key and block_id not in self._key_of_block:
                self._block_of_key[key] = block_id
                self._key_of_block[block_id] = key

    def reset_prefix_cache(self) -> int:
        """Forget every content address (new weights, released memory, an operator's reset);
        blocks in use stay with their sequences. Returns how many addresses were dropped."""
        dropped = len(self._key_of_block)
        self.epoch += 1
        self._empty.extend(self._cached_free)
        self._cached_free.clear()
        self._block_of_key.clear()
        self._key_of_block.clear()
        self.saved.clear()
        return dropped
