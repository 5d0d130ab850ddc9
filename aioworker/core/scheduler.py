"""Continuous batching under one token budget. Torch-free.

Each step: running sequences first (oldest first: decodes and unfinished prompt chunks), then
waiting ones while the budget, `max_num_seqs` and free KV blocks allow. A long prompt is cut
into chunks that fit the budget. When a running sequence cannot grow, the newest running one is
preempted: its blocks are freed and it is recomputed later from its tokens, which gives the
same output because sampling depends only on a sequence's own tokens and seed.

With a Speculator, a decoding sequence may be scheduled with drafts (core/speculation/): its
step computes 1 + k tokens and gives back between 1 and k + 1. Its rejected drafts' slots are
given back (`BlockManager.trim`) when the result comes in, and no draft ever registers a block
in the prefix cache. Drafts never cost a preemption: where blocks or the token budget run
short, a sequence is scheduled without them.

With a KV connector (core/kv_connector.py), a waiting sequence may start from KV the connector
supplies past the device's prefix hits: it is LOADING, holding its blocks, until the copy is
reported, and runs from there. A preempted sequence may be swapped out instead of recomputed,
and the cached free blocks next in line for eviction may be copied out first (while empty
blocks run short); either way the blocks are held until the copy is reported. Plans carry the
copies; a plan may carry only copies. That part of the scheduler is in core/scheduler_kv.py.

Taking a step's results (tokens appended, drafts accepted, stops, outputs) is in
core/scheduler_results.py.
"""

from __future__ import annotations

from collections import deque

from aioworker.core.block_manager import BlockManager
from aioworker.core.kv_connector import (
    KvConnector,
    KvTransfers,
    NoKvConnector,
)
from aioworker.core.kv_in_flight import KvInFlight
from aioworker.core.outputs import FinishReason
from aioworker.core.plan import StepPlan
from aioworker.core.plan_builder import PlanBuilder, new_seq
from aioworker.core.scheduler_kv import KvScheduling
from aioworker.core.scheduler_results import ResultTaking
from aioworker.core.sequence import SeqStatus, Sequence
from aioworker.core.speculation.speculator import Speculator

_NO_BLOCKS: list[int] = []


class Scheduler(KvScheduling, ResultTaking):
    def __init__(
        self,
        block_manager: BlockManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        speculator: Speculator | None = None,
        connector: KvConnector | None = None,
    ) -> None:
        self.block_manager = block_manager
        self.speculator = speculator
        self.connector: KvConnector = connector if connector is not None else NoKvConnector()
        self.kv = KvInFlight()
        # Sequences whose KV a copy loaded: they run before any waiting one (they hold blocks).
        self.loaded: deque[Sequence] = deque()
        # Cached free blocks kept saved ahead of eviction (a connector that writes back): what
        # a step or two may take, or an eighth of the cache.
        budget_blocks = block_manager.blocks_for_tokens(max_num_batched_tokens)
        self.write_back_reserve = min(
            block_manager.num_blocks, max(block_manager.num_blocks // 8, 2 * budget_blocks)
        )
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.seqs: dict[int, Sequence] = {}
        # The same unfinished sequences by request id (a request's samples): aborts name requests.
        self.seqs_by_request: dict[str, list[Sequence]] = {}
        # Leaders of parallel samples whose followers wait for their prompt to be computed.
        self._leaders: list[Sequence] = []
        self.num_preemptions = 0
        # Unfinished sequences with a grammar: steps look for guided rows only while there are.
        self.num_guided = 0
        # False holds waiting requests back (a weights update in `wait` mode lets the running
        # ones finish first).
        self.admit_new = True
        self._released_seq_ids: list[int] = []
        # Block tables cut since the last plan: seq id -> blocks kept.
        self._trimmed: dict[int, int] = {}
        self._next_step_id = 0

    # -- requests in and out ------------------------------------------------------------------

    def add(self, seq: Sequence, followers: list[Sequence] = ()) -> None:
        """Queue a request's sequence; `followers` (its other samples) start once its prompt is
        computed, from the blocks it cached (right away when there is no prefix cache)."""
        samples = [seq, *followers]
        if seq.request_id in self.seqs_by_request or any(s.seq_id in self.seqs for s in samples):
            raise ValueError(f"sequence {seq.seq_id} ({seq.request_id!r}) is already scheduled")
        self.seqs_by_request[seq.request_id] = samples
        for sample in samples:
            self.seqs[sample.seq_id] = sample
        if seq.grammar is not None:
            self.num_guided += len(samples)
        self.waiting.append(seq)
        if followers and self.block_manager.enable_prefix_caching:
            seq.followers = list(followers)
            for follower in followers:
                follower.leader = seq
            self._leaders.append(seq)
        else:
            self.waiting.extend(followers)

    def abort(self, seq_id: int) -> Sequence | None:
        """Finish a sequence now and free its blocks; None if it is unknown or already done."""
        seq = self.seqs.get(seq_id)
        if seq is None:
            return None
        if seq.status is SeqStatus.LOADING:
            self._stop_loading(seq)
        elif seq.status is SeqStatus.WAITING:
            leader = seq.leader
            if leader is not None and leader.followers and seq in leader.followers:
                leader.followers.remove(seq)  # still held back
            else:
                self.waiting.remove(seq)
        self._finish(seq, FinishReason.ABORT)
        return seq

    def stop_request(self, request_id: str, sample_index: int = 0) -> None:
        """End one sample of a request with "stop" now (its text completed a stop string)."""
        for seq in self.seqs_by_request.get(request_id, ()):
            if seq.sample_index == sample_index:
                self._finish(seq, FinishReason.STOP)
                return

    def preempt_all(self) -> int:
        """Send every running sequence back to waiting (its KV cache is being freed); they are
        recomputed from their tokens later, and so are those that were loading KV or had it
        loaded. Returns how many were running."""
        count = len(self.running)
        while self.running:
            self._preempt(self.running.pop(), may_swap=False)
        self.drop_loaded_kv()
        return count

    @property
    def has_work(self) -> bool:
        return bool(self.seqs)

    @property
    def num_loading(self) -> int:
        return self.kv.num_loading + len(self.loaded)

    def wants_drafts(self) -> bool:
        """Whether the next plan would give its sequences drafts: they must then have no token
        in flight, so the engine does not schedule a step ahead."""
        speculator = self.speculator
        if speculator is None or not self.running:
            return False
        return speculator.policy.probe_due or speculator.num_draft_tokens(self.running) > 0

    # -- one step -----------------------------------------------------------------------------

    def schedule(self) -> StepPlan | None:
        """The next step's plan, or None when nothing can run (plan ids stay consecutive)."""
        if self.connector.writes_back:  # before this step takes blocks: it may evict some
            self._write_back()
        builder = PlanBuilder(self.block_manager)
        budget, preempted = self._schedule_running(self.max_num_batched_tokens, builder)
        if not preempted:
            self._schedule_waiting(budget, builder)
        if self._leaders:
            self._release_followers()
        kv = self._kv_transfers(bool(builder.seq_ids))
        if not builder.seq_ids and kv is None:
            return None
        return self._build_plan(builder, kv)

    def _release_followers(self) -> None:
        """Followers whose leader's prompt is scheduled in full (steps run in order: its blocks
        are written before the next plan reads them) or ended join the front of the queue."""
        keep = []
        for leader in self._leaders:
            if leader.num_computed_tokens >= leader.num_prompt_tokens or leader.is_finished:
                self.waiting.extendleft(reversed(leader.followers))
                leader.followers = None
            else:
                keep.append(leader)
        self._leaders = keep

    # -- internals ----------------------------------------------------------------------------

    def _schedule_running(self, budget: int, builder: PlanBuilder) -> tuple[int, bool]:
        """Returns the budget left and whether anything was preempted."""
        num_preemptions_before = self.num_preemptions
        block_size = self.block_manager.block_size
        max_drafts = 0
        if self.speculator is not None:
            max_drafts = self.speculator.num_draft_tokens(self.running, probe=True)
        num_asked = num_given = 0
        index = 0
        while index < len(self.running) and budget > 0:
            seq = self.running[index]
            index += 1
            if seq.num_draft_tokens:
                continue  # its drafts are being verified: what comes next is not known yet
            if self._finishes_with_pending(seq):
                continue  # its token in flight is its last: nothing more to run
            # Drafts never take the budget of the sequences after this one (`index`: past it).
            room = budget - 1 - (len(self.running) - index) if max_drafts else 0
            if room > 0 and self.speculator.may_speculate(seq):
                drafts = self.speculator.drafts(seq, min(max_drafts, room))
                if drafts and seq.grammar is not None:
                    drafts = seq.grammar.valid_prefix(drafts)
                num_asked += 1
                num_given += bool(drafts)
                if drafts and self._schedule_drafts(seq, drafts, builder):
                    budget -= 1 + len(drafts)
                    self._ask_next_drafts(seq, max_drafts, builder)
                    continue
            seq.next_drafts = []  # unused: they follow a token this step computes plainly
            start = seq.num_computed_tokens
            num_tokens = min(seq.num_uncomputed_tokens, budget)
            num_missing = -(-(start + num_tokens) // block_size) - len(seq.block_table)
            if num_missing <= 0:
                builder.add(seq, num_tokens, _NO_BLOCKS)
            elif self._make_room(seq, num_missing):
                builder.add(seq, num_tokens, self.block_manager.append_blocks(seq, num_missing))
            else:
                break  # `seq` itself was preempted, and so was every sequence after it
            budget -= num_tokens
            if max_drafts:
                self._ask_next_drafts(seq, max_drafts, builder)
        if num_asked:
            self.speculator.policy.observe_proposals(num_asked, num_given)
        return budget, self.num_preemptions > num_preemptions_before

    def _schedule_drafts(self, seq: Sequence, drafts: list[int], builder: PlanBuilder) -> bool:
        """Schedule `seq` with its drafts where free blocks hold them; False leaves it to the
        plain path (drafts never preempt anyone)."""
        blocks = self.block_manager
        end = seq.num_computed_tokens + 1 + len(drafts)
        num_missing = blocks.num_missing_blocks(seq, end)
        if num_missing > blocks.num_free_blocks:
            return False
        builder.add_with_drafts(seq, drafts, blocks.append_blocks(seq, num_missing))
        return True

    def _ask_next_drafts(self, seq: Sequence, num_drafts: int, builder: PlanBuilder) -> None:
        """Where the executor drafts: have it draft `num_drafts` for `seq` after this step, if
        the step samples for it and free blocks hold the drafts' KV (never preempting anyone).
        The drafts follow its last kept token, at most at the step's end position."""
        if not (self.speculator.drafts_on_executor and builder.sample[-1] and seq.can_speculate):
            return
        end = seq.num_computed_tokens + num_drafts  # positions the draft writes, past the last
        if end > self.max_model_len:
            return
        blocks = self.block_manager
        num_missing = blocks.num_missing_blocks(seq, end)
        if num_missing > blocks.num_free_blocks:
            return
        builder.ask_next_drafts(num_drafts, blocks.append_blocks(seq, num_missing))

    def _finishes_with_pending(self, seq: Sequence) -> bool:
        """Whether the token in flight will end `seq` by length (a stop token cannot be known)."""
        if not seq.num_pending_tokens:
            return False
        length = len(seq.token_ids) + seq.num_pending_tokens
        return (
            length - seq.num_prompt_tokens >= seq.params.max_tokens or length >= self.max_model_len
        )

    def _make_room(self, seq: Sequence, num_blocks: int) -> bool:
        """Preempt the newest running sequences until `num_blocks` are free; False if `seq` went too."""
        while self.block_manager.num_free_blocks < num_blocks:
            victim = self.running.pop()
            self._preempt(victim)
            if victim is seq:
                return False
        return True

    def _schedule_waiting(self, budget: int, builder: PlanBuilder) -> None:
        while self.loaded and budget > 0 and len(self.running) < self.max_num_seqs:
            budget -= self._start_loaded(self.loaded.popleft(), budget, builder)
        headroom = None  # for loads, computed at the first
        while (
            self.admit_new
            and self.waiting
            and budget > 0
            and len(self.running) + self.num_loading < self.max_num_seqs
        ):
            seq = self.waiting[0]  # nothing computed: new, or preempted
            blocks = self.block_manager
            hits, keys_after = blocks.lookup_prefix(seq)
            num_cached = len(hits) * blocks.block_size
            match = self.connector.match(seq, num_cached, keys_after)
            if match is not None:
                if headroom is None:
                    headroom = self._growth_blocks()
                if not self._start_loading(seq, hits, match, headroom):
                    break
                continue
            num_tokens = min(len(seq.token_ids) - num_cached, budget)
            num_new_blocks = blocks.blocks_for_tokens(num_cached + num_tokens) - len(hits)
            if num_new_blocks > blocks.num_free_after(hits):
                break
            self.waiting.popleft()
            seq.status = SeqStatus.RUNNING
            self.running.append(seq)
            blocks.use_cached(seq, hits)
            blocks.allocate(seq, num_cached + num_tokens)
            builder.add(seq, num_tokens, list(seq.block_table))
            builder.new_seqs.append(new_seq(seq))
            budget -= num_tokens

    def _build_plan(self, builder: PlanBuilder, kv: KvTransfers | None = None) -> StepPlan:
        trimmed = []
        if self._trimmed:
            released = set(self._released_seq_ids)
            trimmed = [item for item in self._trimmed.items() if item[0] not in released]
            self._trimmed = {}
        plan = builder.plan(self._next_step_id, self._released_seq_ids, trimmed, kv)
        self._released_seq_ids = []
        self._next_step_id += 1
        return plan

    def _preempt(self, seq: Sequence, may_swap: bool = True) -> None:
        # A swap keeps KV of the current weights only: a sequence admitted before a reset (new
        # weights) is recomputed, as it would be without a host tier.
        may_swap = may_swap and seq.cache_epoch == self.block_manager.epoch
        transfer_id = self.connector.swap_out(seq) if may_swap else None
        if transfer_id is None:
            self.block_manager.free(seq)
        else:  # its blocks are copied out from behind the steps in flight: held till then
            self.kv.held_tables[transfer_id].append(seq.block_table)
            seq.block_table = []
        seq.num_stale_tokens += seq.num_pending_tokens
        self._back_to_waiting(seq)
        self._released_seq_ids.append(seq.seq_id)
        self.num_preemptions += 1

    def _back_to_waiting(self, seq: Sequence) -> None:
        seq.num_computed_tokens = 0
        seq.num_pending_tokens = 0
        seq.num_draft_tokens = 0
        seq.next_drafts = []
        seq.status = SeqStatus.WAITING
        self.waiting.appendleft(seq)

    def _finish(self, seq: Sequence, reason: FinishReason, still_listed: bool = False) -> None:
        """`still_listed`: the caller removes finished sequences from `running` itself."""
        if seq.status is SeqStatus.RUNNING and not still_listed:
            self.running.remove(seq)
        if seq.block_table or seq.status is SeqStatus.RUNNING:
            self._released_seq_ids.append(seq.seq_id)
        self.block_manager.free(seq)
        self.connector.forget(seq)
        seq.status = SeqStatus.FINISHED
        seq.finish_reason = reason
        del self.seqs[seq.seq_id]
        if seq.grammar is not None:
            self.num_guided -= 1
        samples = self.seqs_by_request[seq.request_id]
        samples.remove(seq)
        if not samples:
            del self.seqs_by_request[seq.request_id]
