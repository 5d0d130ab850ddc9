"""The slot pool behind the sampler's per-sequence state: growing keeps every row, released
slots are reused, and the memory goes when the last sequence does."""

from __future__ import annotations

import pytest
import torch

from aioworker.compute.sampling.slot_pool import FIRST_CAPACITY, SlotPool

CPU = torch.device("cpu")


def make() -> SlotPool:
    return SlotPool(CPU, {"counts": ((5,), torch.int32), "scale": ((), torch.float32)})


def test_growing_keeps_the_rows_of_every_slot() -> None:
    pool = make()
    for seq_id in range(3 * FIRST_CAPACITY):  # grows twice
        slot = pool.take(seq_id)
        pool["counts"][slot] = seq_id
        pool["scale"][slot] = seq_id / 2
    assert pool.capacity == 4 * FIRST_CAPACITY
    for seq_id, slot in pool.slots.items():
        assert pool["counts"][slot].tolist() == [seq_id] * 5
        assert pool["scale"][slot].item() == seq_id / 2


def test_a_released_slot_is_reused_and_the_last_release_frees_the_tensors() -> None:
    pool = make()
    first, second = pool.take(10), pool.take(11)
    assert (first, second) == (0, 1)
    pool.release(10)
    pool.release(99)  # unknown: nothing happens
    assert pool.take(12) == first and len(pool) == 2
    pool.release(11)
    pool.release(12)
    assert len(pool) == 0 and pool.tensors == {} and pool.capacity == 0


def test_a_sequence_holds_one_slot() -> None:
    pool = make()
    pool.take(1)
    with pytest.raises(ValueError, match="sequence 1 already holds slot 0"):
        pool.take(1)
