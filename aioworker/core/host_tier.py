"""The host KV tier's scheduler half (a KvConnector, core/kv_connector.py): cached blocks next in
line for eviction from the device are copied to host memory first, a later prefix that misses
the device but hits the host loads them back, and a preempted sequence is swapped out where copying its KV
out and back costs less than recomputing it. Torch-free; the copies are compute/host_kv.py's.

Host blocks are addressed by the same content keys as device blocks, so a prefix hits either
tier alike, and a reset (new weights, released memory) empties both.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import count
from typing import Literal

from aioworker.core.block_hashes import BlockKey
from aioworker.core.host_slots import HostSlots
from aioworker.core.kv_connector import ExternalMatch, KvCopy, KvReport, Saving
from aioworker.core.sequence import Sequence

PreemptionMode = Literal["auto", "swap", "recompute"]
# Steps this long or longer time the device's prefill rate (decode steps are bound by weights).
_PREFILL_STEP_TOKENS = 32
_RATE_WEIGHT = 0.2  # of each new measurement in the running rates


@dataclass(slots=True)
class _Swap:
    slots: list[int]
    num_tokens: int  # positions whose KV the slots hold, from 0


@dataclass(slots=True)
class _Load:
    slots: list[int]
    swapped_seq_id: int | None  # the swap it consumes, else a prefix hit


class HostKvConnector:
    writes_back = True

    def __init__(
        self,
        num_slots: int,
        block_size: int,
        block_bytes: int,
        preemption: PreemptionMode = "auto",
    ) -> None:
        """`block_bytes`: one block's KV on this rank (its shard under tensor parallelism)."""
        self.slots = HostSlots(num_slots)
        self.block_size = block_size
        self.block_bytes = block_bytes
        self.preemption = preemption
        self._transfer_ids = count()
        self._swaps: dict[int, _Swap] = {}
        # Copies in flight by transfer id: prefix saves ((slot, key) pairs, and the generation
        # they began in: a reset since then keeps them out of the cache), swaps out, loads.
        self._saves: dict[int, tuple[list[tuple[int, BlockKey]], int]] = {}
        self._swap_saves: dict[int, tuple[int, list[int]]] = {}
        self._loads: dict[int, _Load] = {}
        self._generation = 0
        self._pending_saves: list[KvCopy] = []
        self._pending_loads: list[KvCopy] = []
        # Measured: bytes a second both ways, and prompt tokens a second (None: not yet).
        self.copy_rate: float | None = None
        self.prefill_rate: float | None = None
        self.counts = dict.fromkeys(
            ("hit_blocks", "saved_blocks", "swaps_out", "swaps_in", "copy_failures"), 0
        )
        self.bytes_saved = self.bytes_loaded = 0
        self.seconds_saving = self.seconds_loading = 0.0

    # -- admission ----------------------------------------------------------------------------

    def match(
        self, seq: Sequence, num_device_tokens: int, keys_after: list[BlockKey]
    ) -> ExternalMatch | None:
        swap = self._swaps.get(seq.seq_id)
        if swap is not None:
            end = min(swap.num_tokens, len(seq.token_ids) - 1)  # its last token is recomputed
            if end > num_device_tokens:
                first, last = num_device_tokens // self.block_size, -(-end // self.block_size)
                source = _Load(swap.slots[first:last], seq.seq_id)
                return ExternalMatch(end - num_device_tokens, source)
            self._drop_swap(seq.seq_id)  # the device holds as much
        slots = self.slots.lookup(keys_after)
        if not slots:
            return None
        self.slots.touch(keys_after[: len(slots)])
        return ExternalMatch(len(slots) * self.block_size, _Load(slots, None))

    def load(self, seq: Sequence, match: ExternalMatch, block_ids: list[int]) -> int:
        load: _Load = match.source
        if len(load.slots) != len(block_ids):
            raise ValueError(f"{len(load.slots)} host blocks to load into {len(block_ids)}")
        transfer_id = next(self._transfer_ids)
        self.slots.pin(load.slots)
        self._loads[transfer_id] = load
        self._pending_loads.append(KvCopy(transfer_id, block_ids, load.slots))
        if load.swapped_seq_id is None:
            self.counts["hit_blocks"] += len(block_ids)
        else:
            self.counts["swaps_in"] += 1
        return transfer_id

    # -- copies out ---------------------------------------------------------------------------

    def save_cached(self, blocks: list[tuple[int, BlockKey]]) -> Saving:
        present = [(block_id, key) for block_id, key in blocks if key in self.slots]
        self.slots.touch([key for _, key in present])
        new = [(block_id, key) for block_id, key in blocks if key not in self.slots]
        slots = self.slots.take_up_to(len(new))
        present_ids = [block_id for block_id, _ in present]
        if not slots:
            return Saving(None, [], present_ids)
        new = new[: len(slots)]  # too few: the next to be evicted first
        transfer_id = next(self._transfer_ids)
        self.slots.pin(slots)
        self._saves[transfer_id] = (
            [(slot, key) for slot, (_, key) in zip(slots, new, strict=True)],
            self._generation,
        )
        block_ids = [block_id for block_id, _ in new]
        self._pending_saves.append(KvCopy(transfer_id, block_ids, slots))
        return Saving(transfer_id, block_ids, present_ids)

    def swap_out(self, seq: Sequence) -> int | None:
        if self.preemption == "recompute" or seq.needs_prompt_logprobs:
            return None
        num_tokens = min(seq.num_computed_tokens, len(seq.token_ids))
        num_blocks = -(-num_tokens // self.block_size)
        if num_tokens <= 1 or (self.preemption == "auto" and not self._swap_pays(num_tokens)):
            return None
        slots = self.slots.take(num_blocks)
        if slots is None:
            return None
        transfer_id = next(self._transfer_ids)
        self.slots.pin(slots)
        self._swaps[seq.seq_id] = _Swap(slots, num_tokens)
        self._swap_saves[transfer_id] = (seq.seq_id, slots)
        self._pending_saves.append(KvCopy(transfer_id, seq.block_table[:num_blocks], slots))
        self.counts["swaps_out"] += 1
        return transfer_id

    def _swap_pays(self, num_tokens: int) -> bool:
        """Copying the KV out and back beats recomputing it, at the rates measured so far (a
        swap, until both are measured: it is how the copy rate gets measured)."""
        if self.copy_rate is None or self.prefill_rate is None:
            return True
        num_bytes = -(-num_tokens // self.block_size) * self.block_bytes
        return 2 * num_bytes / self.copy_rate < num_tokens / self.prefill_rate

    # -- bookkeeping --------------------------------------------------------------------------

    def forget(self, seq: Sequence) -> None:
        self._drop_swap(seq.seq_id)

    def _drop_swap(self, seq_id: int) -> None:
        swap = self._swaps.pop(seq_id, None)
        if swap is not None:
            self.slots.drop(swap.slots)

    def take_copies(self) -> tuple[list[KvCopy], list[KvCopy]]:
        copies = self._pending_saves, self._pending_loads
        self._pending_saves, self._pending_loads = [], []
        return copies

    def finished(self, report: KvReport) -> list[int]:
        self._measure(report)
        lost = []
        for transfer_id in report.failed:  # first: a load from a swap that failed lost its KV
            self.counts["copy_failures"] += 1
            lost.extend(self._end(transfer_id, ok=False))
        for transfer_id in report.done:
            self._end(transfer_id, ok=True)
        return lost

    def _end(self, transfer_id: int, ok: bool) -> list[int]:
        """A copy ended; returns the sequences whose swapped KV it lost."""
        if transfer_id in self._saves:
            pairs, generation = self._saves.pop(transfer_id)
            slots = [slot for slot, _ in pairs]
            if ok and generation == self._generation:
                for slot, key in pairs:
                    self.slots.cache(key, slot)
                self.counts["saved_blocks"] += len(pairs)
            else:
                self.slots.drop(slots)
            self.slots.unpin(slots)
        elif transfer_id in self._swap_saves:
            seq_id, slots = self._swap_saves.pop(transfer_id)
            self.slots.unpin(slots)
            if not ok and seq_id in self._swaps:  # still resumes from it, or loads it now
                self._drop_swap(seq_id)
                return [seq_id]
        elif transfer_id in self._loads:
            load = self._loads.pop(transfer_id)
            self.slots.unpin(load.slots)
            if load.swapped_seq_id is not None:
                self._drop_swap(load.swapped_seq_id)
        return []

    def _measure(self, report: KvReport) -> None:
        self.bytes_saved += report.bytes_saved
        self.bytes_loaded += report.bytes_loaded
        self.seconds_saving += report.seconds_saving
        self.seconds_loading += report.seconds_loading
        seconds = report.seconds_saving + report.seconds_loading
        if seconds > 0:
            rate = (report.bytes_saved + report.bytes_loaded) / seconds
            self.copy_rate = _blend(self.copy_rate, rate)

    def observe_step(self, num_tokens: int, seconds: float) -> None:
        if num_tokens >= _PREFILL_STEP_TOKENS and seconds > 0:
            self.prefill_rate = _blend(self.prefill_rate, num_tokens / seconds)

    def reset(self) -> int:
        """Nothing kept serves again: cached blocks and swaps go (a swapped sequence is then
        recomputed), and prefix saves in flight never enter the cache."""
        self._generation += 1
        dropped = self.slots.drop_cached()
        for seq_id in list(self._swaps):
            dropped += len(self._swaps[seq_id].slots)
            self._drop_swap(seq_id)
        return dropped

    def stats(self) -> dict[str, int | float]:
        return {
            "host_kv_blocks_total": self.slots.num_slots,
            "host_kv_blocks_used": self.slots.num_slots - self.slots.num_free,
            "host_kv_blocks_cached": self.slots.num_cached,
            "host_kv_hit_blocks": self.counts["hit_blocks"],
            "host_kv_saved_blocks": self.counts["saved_blocks"],
            "host_kv_swaps_out": self.counts["swaps_out"],
            "host_kv_swaps_in": self.counts["swaps_in"],
            "host_kv_copy_failures": self.counts["copy_failures"],
            "host_kv_bytes_saved": self.bytes_saved,
            "host_kv_bytes_loaded": self.bytes_loaded,
            "host_kv_ms_saving": round(self.seconds_saving * 1e3, 3),
            "host_kv_ms_loading": round(self.seconds_loading * 1e3, 3),
        }


def _blend(old: float | None, new: float) -> float:
    return new if old is None else (1 - _RATE_WEIGHT) * old + _RATE_WEIGHT * new
