"""The host tier's blocks ("slots", to keep them apart from device blocks): free ones, cached
prefix blocks by content address in least-recently-used order, and pins. A slot a copy in
flight reads or writes is pinned: never evicted, and freed only when the copy ends. Torch-free.
"""

from __future__ import annotations

from collections import Counter, OrderedDict

from aioworker.core.block_hashes import BlockKey


class HostSlots:
    def __init__(self, num_slots: int) -> None:
        self.num_slots = num_slots
        self._free = list(range(num_slots - 1, -1, -1))  # popped from the end: slot 0 first
        # Cached prefix blocks, least recently used first.
        self._slot_of_key: OrderedDict[BlockKey, int] = OrderedDict()
        self._pins: Counter[int] = Counter()
        # Dropped while pinned: freed when the last pin goes.
        self._doomed: set[int] = set()

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_cached(self) -> int:
        return len(self._slot_of_key)

    def __contains__(self, key: BlockKey) -> bool:
        return key in self._slot_of_key

    def lookup(self, keys: list[BlockKey]) -> list[int]:
        """The slots of the longest run of `keys` cached, from the first."""
        slots = []
        for key in keys:
            slot = self._slot_of_key.get(key)
            if slot is None:
                break
            slots.append(slot)
        return slots

    def touch(self, keys: list[BlockKey]) -> None:
        for key in keys:
            self._slot_of_key.move_to_end(key)

    def take(self, count: int) -> list[int] | None:
        """`count` slots, evicting least recently used cached blocks that no copy pins; None
        (and nothing taken) where there are not that many."""
        taken = self.take_up_to(count)
        if len(taken) < count:
            self._free.extend(taken)
            return None
        return taken

    def take_up_to(self, count: int) -> list[int]:
        taken = []
        while len(taken) < count:
            slot = self._free.pop() if self._free else self._evict()
            if slot is None:
                break
            taken.append(slot)
        return taken

    def _evict(self) -> int | None:
        for key, slot in self._slot_of_key.items():
            if not self._pins[slot]:
                del self._slot_of_key[key]
                return slot
        return None

    def cache(self, key: BlockKey, slot: int) -> None:
        """`slot` now holds the block `key` names: a later prefix may hit it."""
        if key in self._slot_of_key or slot in self._doomed:
            self.drop([slot])
            return
        self._slot_of_key[key] = slot

    def drop(self, slots: list[int]) -> None:
        """Free slots held outside the cache (a swap, a copy that failed)."""
        for slot in slots:
            if self._pins[slot]:
                self._doomed.add(slot)
            else:
                self._free.append(slot)

    def drop_cached(self) -> int:
        """Forget every cached block; returns how many."""
        dropped = list(self._slot_of_key.values())
        self._slot_of_key.clear()
        self.drop(dropped)
        return len(dropped)

    def pin(self, slots: list[int]) -> None:
        self._pins.update(slots)

    def unpin(self, slots: list[int]) -> None:
        for slot in slots:
            self._pins[slot] -= 1
            if not self._pins[slot]:
                del self._pins[slot]
                if slot in self._doomed:
                    self._doomed.discard(slot)
                    self._free.append(slot)
