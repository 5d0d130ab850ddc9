"""The scheduler's part in KV copies (core/kv_connector.py), kept apart from scheduling proper:
sequences that load KV from another tier and then run, cached blocks written back before they
are evicted, and the copies' reports, including the requests a failed copy ends. Torch-free.

`KvScheduling` is a part of `Scheduler` (core/scheduler.py): its methods use the scheduler's
queues, block manager and connector, which `Scheduler.__init__` sets up.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from aioworker.core.block_manager import BlockManager
from aioworker.core.kv_connector import ExternalMatch, KvConnector, KvReport, KvTransfers
from aioworker.core.kv_in_flight import KvInFlight
from aioworker.core.outputs import ErrorKind, FinishReason, RequestOutput
from aioworker.core.plan_builder import PlanBuilder, new_seq
from aioworker.core.sequence import SeqStatus, Sequence

# A load leaves each running sequence the blocks for this many more tokens (or to its end).
LOAD_HEADROOM_TOKENS = 256


class KvScheduling:
    if TYPE_CHECKING:  # set by Scheduler.__init__
        block_manager: BlockManager
        connector: KvConnector
        kv: KvInFlight
        loaded: deque[Sequence]
        waiting: deque[Sequence]
        running: list[Sequence]
        seqs: dict[int, Sequence]
        max_num_batched_tokens: int
        max_model_len: int
        write_back_reserve: int

        def _back_to_waiting(self, seq: Sequence) -> None: ...
        def _finish(
            self, seq: Sequence, reason: FinishReason, still_listed: bool = False
        ) -> None: ...

    def drop_loaded_kv(self) -> None:
        """Sequences loading KV from another tier, or holding KV loaded and not yet scheduled,
        are recomputed instead: that KV may predate new weights or a released cache."""
        for seqs in list(self.kv.loading.values()):
            for seq in list(seqs):
                self.kv.abandon(seq)
                self._back_to_waiting(seq)
        while self.loaded:
            seq = self.loaded.pop()
            self.block_manager.free(seq)
            self._back_to_waiting(seq)

    def _start_loading(
        self, seq: Sequence, hits: list[int], match: ExternalMatch, headroom: int
    ) -> bool:
        """Admit `seq` to wait for the KV the connector supplies past its device hits: blocks
        for its first step are taken now. False where fewer than those and `headroom` are free."""
        blocks = self.block_manager
        num_ready = len(hits) * blocks.block_size + match.num_tokens
        num_tokens = min(len(seq.token_ids), num_ready + self.max_num_batched_tokens)
        num_new_blocks = blocks.blocks_for_tokens(num_tokens) - len(hits)
        if num_new_blocks + headroom > blocks.num_free_after(hits):
            return False
        self.waiting.popleft()
        blocks.use_cached(seq, hits)
        blocks.allocate(seq, num_tokens)
        filled = seq.block_table[len(hits) : blocks.blocks_for_tokens(num_ready)]
        transfer_id = self.connector.load(seq, match, filled)
        seq.num_computed_tokens = num_ready
        seq.status = SeqStatus.LOADING
        self.kv.loading[transfer_id].append(seq)
        return True

    def _growth_blocks(self) -> int:
        """Blocks the running sequences need for their next LOAD_HEADROOM_TOKENS tokens, or to
        their end. A load takes a whole history's blocks at once; leaving these free keeps it
        from preempting a running sequence a few steps later (a simulation of W9: 676
        preemptions leaving one block each, 72 with this)."""
        blocks, total = self.block_manager, 0
        for seq in self.running:
            end = min(
                seq.num_prompt_tokens + seq.params.max_tokens,
                len(seq.token_ids) + LOAD_HEADROOM_TOKENS,
                self.max_model_len,
            )
            total += max(0, blocks.blocks_for_tokens(end) - len(seq.block_table))
        return total

    def _start_loaded(self, seq: Sequence, budget: int, builder: PlanBuilder) -> int:
        """Schedule a sequence whose KV was loaded, within the blocks it holds; returns the
        tokens scheduled."""
        start = seq.num_computed_tokens
        room = len(seq.block_table) * self.block_manager.block_size - start
        num_tokens = min(len(seq.token_ids) - start, budget, room)
        seq.status = SeqStatus.RUNNING
        self.running.append(seq)
        builder.add(seq, num_tokens, list(seq.block_table))
        builder.new_seqs.append(new_seq(seq))
        return num_tokens

    def _kv_transfers(self, has_seqs: bool) -> KvTransfers | None:
        """The next plan's copies; for a plan without sequences, None unless it has copies to
        start or report, or must wait for copies in flight (the loading can then go on)."""
        saves, loads = self.connector.take_copies()
        kv = self.kv
        if not (saves or loads or kv.completed) and (has_seqs or kv.polling or kv.is_idle):
            return None
        if not has_seqs:
            kv.polling = True
        transfers = KvTransfers(saves, loads, kv.completed)
        kv.completed = []
        return transfers

    def _write_back(self) -> None:
        """Copy out the cached free blocks next in line for eviction, so that evicting them
        loses nothing; they are held meanwhile."""
        blocks = self.block_manager.next_to_evict(self.write_back_reserve)
        if not blocks:
            return
        saving = self.connector.save_cached(blocks)
        self.block_manager.mark_saved(saving.present)
        if saving.copied:
            self.block_manager.hold(saving.copied)
            self.kv.held_blocks[saving.transfer_id] = saving.copied

    def _take_kv_report(self, report: KvReport, step_id: int) -> list[RequestOutput]:
        """Copies that ended: their blocks go back, and the sequences they filled wait to run.
        Returns one error output per sequence whose KV a failed copy lost."""
        kv, blocks = self.kv, self.block_manager
        failed = set(report.failed)
        lost = []
        for transfer_id in (*report.done, *report.failed):
            kv.completed.append(transfer_id)
            blocks.release_held(kv.held_blocks.pop(transfer_id, ()), transfer_id not in failed)
            for table in kv.held_tables.pop(transfer_id, ()):
                blocks.free_blocks(table)
            seqs = kv.loading.pop(transfer_id, ())
            self.loaded.extend(seqs)  # they wait for nothing now
            if transfer_id in failed:
                lost.extend(seqs)  # ended below: their blocks go with them
        lost_ids = self.connector.finished(report)
        lost.extend(self.seqs[seq_id] for seq_id in lost_ids if seq_id in self.seqs)
        return [self._fail(seq, report.error, step_id) for seq in dict.fromkeys(lost)]

    def _fail(self, seq: Sequence, error: str, step_id: int) -> RequestOutput:
        """End `seq` with an error: a KV copy it depends on failed."""
        if seq.status is SeqStatus.LOADING:
            self._stop_loading(seq)
        elif seq.status is SeqStatus.WAITING and seq in self.waiting:
            self.waiting.remove(seq)
        self._finish(seq, FinishReason.ERROR)
        out = RequestOutput(seq.request_id, [], FinishReason.ERROR, None, step_id, 0)
        out.error = f"its KV cache was lost in a failed copy ({error or 'no cause given'})"
        out.error_kind = ErrorKind.INTERNAL
        out.sample_index = seq.sample_index
        return out

    def _stop_loading(self, seq: Sequence) -> None:
        """`seq` ends or is recomputed: if its copy is still in flight, the copy keeps its
        blocks until it ends; if loaded, they are freed with it."""
        if seq in self.loaded:
            self.loaded.remove(seq)
        else:
            self.kv.abandon(seq)
