"""Per-sequence sampler state on the device: a slot (the same row of a few tensors) for each
sequence that needs one, grown by doubling, reused once its sequence is released.

The tensors exist only while some sequence holds a slot, so a rank whose requests use no
sampling control keeps none of this memory.
"""

from __future__ import annotations

import torch

FIRST_CAPACITY = 8


class SlotPool:
    def __init__(self, device: torch.device, rows: dict[str, tuple[tuple[int, ...], torch.dtype]]):
        """`rows`: name -> (shape of one slot's row, dtype)."""
        self.device = device
        self.rows = rows
        self.tensors: dict[str, torch.Tensor] = {}
        self.slots: dict[int, int] = {}  # by seq id
        self.free: list[int] = []

    def __len__(self) -> int:
        return len(self.slots)

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.tensors[name]

    @property
    def capacity(self) -> int:
        return len(self.slots) + len(self.free)

    def take(self, seq_id: int) -> int:
        """A slot for `seq_id`, its rows holding garbage until the caller writes them."""
        if seq_id in self.slots:
            raise ValueError(f"sequence {seq_id} already holds slot {self.slots[seq_id]}")
        if not self.free:
            self._grow(max(FIRST_CAPACITY, 2 * self.capacity))
        slot = self.free.pop()
        self.slots[seq_id] = slot
        return slot

    def release(self, seq_id: int) -> None:
        slot = self.slots.pop(seq_id, None)
        if slot is None:
            return
        self.free.append(slot)
        if not self.slots:  # the last user left: give the memory back
            self.tensors, self.free = {}, []

    def _grow(self, capacity: int) -> None:
        old = self.capacity
        for name, (shape, dtype) in self.rows.items():
            bigger = torch.empty((capacity, *shape), dtype=dtype, device=self.device)
            if old:
                bigger[:old].copy_(self.tensors[name])
            self.tensors[name] = bigger
        # Lowest slots first, so a small pool stays dense.
        self.free.extend(range(capacity - 1, old - 1, -1))
