"""Paged KV block allocator: a free list and a reference count per block. Torch-free."""

from __future__ import annotations

from collections import deque

from aioworker.core.sequence import Sequence


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(
                f"need num_blocks > 0 and block_size > 0, got {num_blocks}, {block_size}"
            )
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.ref_counts = [0] * num_blocks
        self._free_block_ids: deque[int] = deque(range(num_blocks))

    @property
    def num_free_blocks(self) -> int:
        return len(self._free_block_ids)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free_block_ids)

    def blocks_for_tokens(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def num_missing_blocks(self, seq: Sequence, num_tokens: int) -> int:
        """Blocks `seq` still needs so that its first `num_tokens` tokens have a slot."""
        return max(0, self.blocks_for_tokens(num_tokens) - len(seq.block_table))

    def can_allocate(self, seq: Sequence, num_tokens: int) -> bool:
        return self.num_missing_blocks(seq, num_tokens) <= len(self._free_block_ids)

    def allocate(self, seq: Sequence, num_tokens: int) -> list[int]:
        """Grow `seq.block_table` to hold `num_tokens` tokens; returns the new block ids."""
        num_missing = self.num_missing_blocks(seq, num_tokens)
        if num_missing > len(self._free_block_ids):
            raise MemoryError(
                f"need {num_missing} KV blocks, {len(self._free_block_ids)} free; "
                "call can_allocate first"
            )
        new_block_ids = [self._take() for _ in range(num_missing)]
        seq.block_table.extend(new_block_ids)
        return new_block_ids

    def append_blocks(self, seq: Sequence, num_blocks: int) -> list[int]:
        """Append `num_blocks` free blocks to `seq` (the caller checked there are enough)."""
        new_block_ids = [self._take() for _ in range(num_blocks)]
        seq.block_table.extend(new_block_ids)
        return new_block_ids

    def share(self, seq: Sequence, block_ids: list[int]) -> None:
        """Append already-filled blocks (another sequence's prefix) to `seq`, counting the reference."""
        for block_id in block_ids:
            if self.ref_counts[block_id] <= 0:
                raise ValueError(f"block {block_id} is free and cannot be shared")
            self.ref_counts[block_id] += 1
        seq.block_table.extend(block_ids)

    def free(self, seq: Sequence) -> None:
        # Release in reverse so the tail blocks are reused last, keeping shared prefixes warm.
        for block_id in reversed(seq.block_table):
            self.ref_counts[block_id] -= 1
            if self.ref_counts[block_id] == 0:
                self._free_block_ids.append(block_id)
        seq.block_table = []

    def _take(self) -> int:
        block_id = self._free_block_ids.popleft()
        self.ref_counts[block_id] = 1
        return block_id
