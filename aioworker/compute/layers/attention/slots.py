"""Where each token lives in the paged cache: slot = block_table[pos // block_size] * block_size + pos % block_size."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(slots=True)
class SeqSlots:
    """One scheduled sequence as the attention backends see it."""

    num_tokens: int  # tokens computed this step
    start_pos: int  # tokens already cached
    block_table: list[int]

    def context_slots(self, block_size: int) -> np.ndarray:
        """Slots of positions [0, start_pos + num_tokens)."""
        return _slots(self.block_table, 0, self.start_pos + self.num_tokens, block_size)

    def new_slots(self, block_size: int) -> np.ndarray:
        return _slots(
            self.block_table, self.start_pos, self.start_pos + self.num_tokens, block_size
        )


def _slots(block_table: list[int], start: int, end: int, block_size: int) -> np.ndarray:
    positions = np.arange(start, end)
    blocks = np.asarray(block_table, dtype=np.int64)[positions // block_size]
    return blocks * block_size + positions % block_size


def slot_mapping(seqs: list[SeqSlots], block_size: int) -> np.ndarray:
    if not seqs:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate([seq.new_slots(block_size) for seq in seqs])
