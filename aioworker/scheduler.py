"""Continuous batching under one token budget. Torch-free.

Each step: running sequences first (oldest first: decodes and unfinished prompt chunks), then
waiting ones while the budget, `max_num_seqs` and free KV blocks allow. A long prompt is cut
into chunks that fit the budget. When a running sequence cannot grow, the newest running one is
preempted: its blocks are freed and it is recomputed later from its tokens, which gives the
same output because sampling depends only on a sequence's own tokens and seed.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from aioworker.block_manager import BlockManager
from aioworker.plan import NewSeq, SamplingSpec, StepPlan, StepResult
from aioworker.sequence import FinishReason, SeqStatus, Sequence


@dataclass(slots=True)
class SeqOutput:
    request_id: str
    token_id: int
    finish_reason: FinishReason | None


@dataclass(slots=True)
class _Scheduled:
    seq: Sequence
    num_tokens: int
    new_block_ids: list[int]
    is_new: bool


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
    ) -> None:
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.seqs: dict[int, Sequence] = {}
        self.num_preemptions = 0
        self._released_seq_ids: list[int] = []
        self._next_step_id = 0

    # -- requests in and out ------------------------------------------------------------------

    def add(self, seq: Sequence) -> None:
        if seq.seq_id in self.seqs:
            raise ValueError(f"sequence {seq.seq_id} is already scheduled")
        self.seqs[seq.seq_id] = seq
        self.waiting.append(seq)

    def abort(self, seq_id: int) -> Sequence | None:
        """Finish a sequence now and free its blocks; None if it is unknown or already done."""
        seq = self.seqs.get(seq_id)
        if seq is None:
            return None
        if seq.status is SeqStatus.WAITING:
            self.waiting.remove(seq)
        self._finish(seq, FinishReason.ABORT)
        return seq

    @property
    def num_unfinished(self) -> int:
        return len(self.seqs)

    @property
    def has_work(self) -> bool:
        return bool(self.seqs)

    # -- one step -----------------------------------------------------------------------------

    def schedule(self) -> StepPlan | None:
        """The next step's plan, or None when nothing can run (plan ids stay consecutive)."""
        budget = self.max_num_batched_tokens
        scheduled: list[_Scheduled] = []
        budget, preempted = self._schedule_running(budget, scheduled)
        if not preempted:
            self._schedule_waiting(budget, scheduled)
        return self._build_plan(scheduled) if scheduled else None

    def update(self, plan: StepPlan, result: StepResult) -> list[SeqOutput]:
        """Append sampled tokens, finish sequences that stop; returns one output per sampled token."""
        if result.step_id != plan.step_id:
            raise ValueError(f"result of step {result.step_id} given for plan {plan.step_id}")
        sampled = iter(result.sampled_token_ids)
        outputs: list[SeqOutput] = []
        for seq_id, do_sample in zip(plan.seq_ids, plan.sample, strict=True):
            if not do_sample:
                continue
            token_id = next(sampled)
            seq = self.seqs.get(seq_id)
            if seq is None or seq.status is not SeqStatus.RUNNING:
                continue  # aborted or preempted while the step ran
            seq.token_ids.append(token_id)
            reason = self._stop_reason(seq, token_id)
            if reason is not None:
                self._finish(seq, reason)
            outputs.append(SeqOutput(seq.request_id, token_id, reason))
        return outputs

    # -- internals ----------------------------------------------------------------------------

    def _schedule_running(self, budget: int, scheduled: list[_Scheduled]) -> tuple[int, bool]:
        """Returns the budget left and whether anything was preempted."""
        num_preemptions_before = self.num_preemptions
        index = 0
        while index < len(self.running) and budget > 0:
            seq = self.running[index]
            num_tokens = min(seq.num_uncomputed_tokens, budget)
            if not self._make_room(seq, num_tokens):
                break  # `seq` itself was preempted, and so was every sequence after it
            scheduled.append(self._allocate(seq, num_tokens, is_new=False))
            budget -= num_tokens
            index += 1
        return budget, self.num_preemptions > num_preemptions_before

    def _make_room(self, seq: Sequence, num_tokens: int) -> bool:
        """Preempt the newest running sequences until `seq` can grow; False if `seq` went too."""
        target = seq.num_computed_tokens + num_tokens
        while not self.block_manager.can_allocate(seq, target):
            victim = self.running.pop()
            self._preempt(victim)
            if victim is seq:
                return False
        return True

    def _schedule_waiting(self, budget: int, scheduled: list[_Scheduled]) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            num_tokens = min(seq.num_uncomputed_tokens, budget)
            if not self.block_manager.can_allocate(seq, seq.num_computed_tokens + num_tokens):
                break
            self.waiting.popleft()
            seq.status = SeqStatus.RUNNING
            self.running.append(seq)
            scheduled.append(self._allocate(seq, num_tokens, is_new=True))
            budget -= num_tokens

    def _allocate(self, seq: Sequence, num_tokens: int, is_new: bool) -> _Scheduled:
        new_block_ids = self.block_manager.allocate(seq, seq.num_computed_tokens + num_tokens)
        if is_new:
            new_block_ids = list(seq.block_table)
        return _Scheduled(seq, num_tokens, new_block_ids, is_new)

    def _build_plan(self, scheduled: list[_Scheduled]) -> StepPlan:
        input_token_ids: list[int] = []
        start_positions: list[int] = []
        sample: list[bool] = []
        for item in scheduled:
            seq = item.seq
            start = seq.num_computed_tokens
            input_token_ids.extend(seq.token_ids[start : start + item.num_tokens])
            start_positions.append(start)
            seq.num_computed_tokens = start + item.num_tokens
            sample.append(seq.num_computed_tokens == len(seq.token_ids))
        plan = StepPlan(
            step_id=self._next_step_id,
            seq_ids=[item.seq.seq_id for item in scheduled],
            num_scheduled_tokens=[item.num_tokens for item in scheduled],
            start_positions=start_positions,
            new_block_ids=[item.new_block_ids for item in scheduled],
            sample=sample,
            input_token_ids=input_token_ids,
            new_seqs=[_new_seq(item.seq) for item in scheduled if item.is_new],
            released_seq_ids=self._released_seq_ids,
        )
        self._released_seq_ids = []
        self._next_step_id += 1
        return plan

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        seq.num_computed_tokens = 0
        seq.status = SeqStatus.WAITING
        self.waiting.appendleft(seq)
        self._released_seq_ids.append(seq.seq_id)
        self.num_preemptions += 1

    def _finish(self, seq: Sequence, reason: FinishReason) -> None:
        if seq.status is SeqStatus.RUNNING:
            self.running.remove(seq)
        if seq.block_table or seq.status is SeqStatus.RUNNING:
            self._released_seq_ids.append(seq.seq_id)
        self.block_manager.free(seq)
        seq.status = SeqStatus.FINISHED
        seq.finish_reason = reason
        del self.seqs[seq.seq_id]

    def _stop_reason(self, seq: Sequence, token_id: int) -> FinishReason | None:
        if token_id in seq.stop_token_ids and seq.num_output_tokens > seq.params.min_tokens:
            return FinishReason.STOP
        if seq.num_output_tokens >= seq.params.max_tokens or len(seq) >= self.max_model_len:
            return FinishReason.LENGTH
        return None


def _new_seq(seq: Sequence) -> NewSeq:
    params = seq.params
    spec = SamplingSpec(
        temperature=params.temperature,
        top_k=params.top_k,
        top_p=params.top_p,
        seed=params.seed,
        min_tokens=params.min_tokens,
        stop_token_ids=sorted(seq.stop_token_ids) if params.min_tokens else [],
    )
    return NewSeq(seq.seq_id, seq.num_prompt_tokens, spec)
