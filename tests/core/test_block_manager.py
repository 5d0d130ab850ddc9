from __future__ import annotations

import pytest

from aioworker.core.block_manager import BlockManager
from aioworker.core.sampling_params import SamplingParams
from aioworker.core.sequence import Sequence


def seq(seq_id: int = 0, num_tokens: int = 5) -> Sequence:
    return Sequence(seq_id, f"r{seq_id}", list(range(num_tokens)), SamplingParams())


def test_allocate_takes_blocks_in_order_and_grows_by_block() -> None:
    manager = BlockManager(num_blocks=8, block_size=4)
    s = seq()
    assert manager.allocate(s, 5) == [0, 1]
    assert manager.allocate(s, 8) == []  # still fits in two blocks
    assert manager.allocate(s, 9) == [2]
    assert s.block_table == [0, 1, 2]
    assert manager.num_free_blocks == 5


def test_free_returns_blocks_and_they_are_reused() -> None:
    manager = BlockManager(num_blocks=4, block_size=4)
    a, b = seq(0), seq(1)
    manager.allocate(a, 8)
    manager.free(a)
    assert a.block_table == [] and manager.num_free_blocks == 4
    manager.allocate(b, 16)
    assert sorted(b.block_table) == [0, 1, 2, 3]


def test_can_allocate_and_allocate_refuse_beyond_free_blocks() -> None:
    manager = BlockManager(num_blocks=2, block_size=4)
    s = seq()
    assert manager.can_allocate(s, 8)
    assert not manager.can_allocate(s, 9)
    with pytest.raises(MemoryError):
        manager.allocate(s, 9)
    assert manager.num_free_blocks == 2


def test_shared_blocks_return_only_when_the_last_owner_frees() -> None:
    manager = BlockManager(num_blocks=4, block_size=4)
    owner, sharer = seq(0), seq(1)
    manager.allocate(owner, 8)
    manager.share(sharer, owner.block_table[:1])
    assert manager.ref_counts[:2] == [2, 1]
    manager.free(owner)
    assert manager.num_free_blocks == 3
    manager.free(sharer)
    assert manager.num_free_blocks == 4
    with pytest.raises(ValueError, match="is free"):
        manager.share(sharer, [0])
