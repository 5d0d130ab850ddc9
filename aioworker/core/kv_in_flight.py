"""The scheduler's side of KV copies in flight (core/kv_connector.py): which device blocks each
copy holds, and which sequences wait for a copy into their blocks. Torch-free."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from aioworker.core.sequence import Sequence


@dataclass
class KvInFlight:
    # transfer id -> cached blocks copied out, held by the block manager (release_held).
    held_blocks: dict[int, list[int]] = field(default_factory=dict)
    # transfer id -> block tables whose references a copy keeps (a swapped-out sequence's, or a
    # loading sequence's that ended first): freed when the copy ends.
    held_tables: defaultdict[int, list[list[int]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    # transfer id -> sequences whose blocks it fills; they run once it is reported done.
    loading: defaultdict[int, list[Sequence]] = field(default_factory=lambda: defaultdict(list))
    # Reported since the last plan: the next one tells every rank (KvTransfers.completed).
    completed: list[int] = field(default_factory=list)
    # A plan that carries nothing but waits for copies is in flight.
    polling: bool = False

    @property
    def num_loading(self) -> int:
        return sum(len(seqs) for seqs in self.loading.values())

    @property
    def is_idle(self) -> bool:
        return not (self.held_blocks or self.held_tables or self.loading)

    def abandon(self, seq: Sequence) -> None:
        """`seq` stops waiting for its load (aborted, preempted): the copy keeps its blocks."""
        for transfer_id, seqs in self.loading.items():
            if seq in seqs:
                seqs.remove(seq)
                self.held_tables[transfer_id].append(seq.block_table)
                seq.block_table = []
                return
        raise ValueError(f"sequence {seq.seq_id} waits for no KV copy")
