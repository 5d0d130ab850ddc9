"""Continuous batching under one token budget. Torch-free.

Each step: running sequences first (oldest first: decodes and unfinished prompt chunks), then
waiting ones while the budget, `max_num_seqs` and free KV blocks allow. A long prompt is cut
into chunks that fit the budget. When a running sequence cannot grow, the newest running one is
preempted: its blocks are freed and it is recomputed later from its tokens, which gives the
same output because sampling depends only on a sequence's own tokens and seed.
"""

from __future__ import annotations

from collections import deque

from aioworker.core.block_manager import BlockManager
from aioworker.core.outputs import FinishReason, RequestOutput
from aioworker.core.plan import StepPlan, StepResult
from aioworker.core.plan_builder import PlanBuilder, new_seq
from aioworker.core.sequence import SeqStatus, Sequence

_NO_BLOCKS: list[int] = []


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
        # The same unfinished sequences by request id (a request's samples): aborts name requests.
        self.seqs_by_request: dict[str, list[Sequence]] = {}
        # Leaders of parallel samples whose followers wait for their prompt to be computed.
        self._leaders: list[Sequence] = []
        self.num_preemptions = 0
        # False holds waiting requests back (a weights update in `wait` mode lets the running
        # ones finish first).
        self.admit_new = True
        self._released_seq_ids: list[int] = []
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
        if seq.status is SeqStatus.WAITING:
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
        recomputed from their tokens later. Returns how many."""
        count = len(self.running)
        while self.running:
            self._preempt(self.running.pop())
        return count

    @property
    def has_work(self) -> bool:
        return bool(self.seqs)

    # -- one step -----------------------------------------------------------------------------

    def schedule(self) -> StepPlan | None:
        """The next step's plan, or None when nothing can run (plan ids stay consecutive)."""
        builder = PlanBuilder(self.block_manager)
        budget, preempted = self._schedule_running(self.max_num_batched_tokens, builder)
        if not preempted:
            self._schedule_waiting(budget, builder)
        if self._leaders:
            self._release_followers()
        return self._build_plan(builder) if builder.seq_ids else None

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

    def update(
        self, plan: StepPlan, result: StepResult, weights_version: int = 0
    ) -> list[RequestOutput]:
        """Append sampled tokens, finish sequences that stop; returns one output per sampled token."""
        if result.step_id != plan.step_id:
            raise ValueError(f"result of step {result.step_id} given for plan {plan.step_id}")
        self._keep_prompt_logprobs(result)
        sampled = iter(result.sampled_token_ids)
        logprobs = iter(result.logprobs) if result.logprobs is not None else None
        outputs: list[RequestOutput] = []
        step_id = plan.step_id
        find, running = self.seqs.get, SeqStatus.RUNNING  # locals: this loop runs per sequence
        finished = False
        for seq_id, do_sample in zip(plan.seq_ids, plan.sample, strict=True):
            if not do_sample:
                continue
            token_id = next(sampled)
            entry = next(logprobs) if logprobs is not None else None
            seq = find(seq_id)
            if seq is None:
                continue  # finished or aborted while the step ran
            if seq.num_stale_tokens:
                seq.num_stale_tokens -= 1  # sampled before a preemption: recomputed later
                continue
            seq.num_pending_tokens -= 1
            seq.token_ids.append(token_id)
            reason = self._stop_reason(seq, token_id)
            if reason is not None:
                self._finish(seq, reason, still_listed=True)
                finished = True
            out = RequestOutput(seq.request_id, [token_id], reason, None, step_id, weights_version)
            if seq.sample_index:
                out.sample_index = seq.sample_index
            if entry is not None or seq.prompt_logprobs is not None:
                out = _with_logprobs(out, seq, entry)
            outputs.append(out)
        if finished:  # one pass instead of a list.remove per finished sequence
            self.running = [seq for seq in self.running if seq.status is running]
        return outputs

    # -- internals ----------------------------------------------------------------------------

    def _keep_prompt_logprobs(self, result: StepResult) -> None:
        for scored in result.prompt_logprobs:
            seq = self.seqs.get(scored.seq_id)
            if seq is not None and seq.prompt_logprobs is not None:
                seq.add_prompt_logprobs(scored.first_position, scored.entries)

    def _schedule_running(self, budget: int, builder: PlanBuilder) -> tuple[int, bool]:
        """Returns the budget left and whether anything was preempted."""
        num_preemptions_before = self.num_preemptions
        block_size = self.block_manager.block_size
        index = 0
        while index < len(self.running) and budget > 0:
            seq = self.running[index]
            index += 1
            if self._finishes_with_pending(seq):
                continue  # its token in flight is its last: nothing more to run
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
        return budget, self.num_preemptions > num_preemptions_before

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
        while (
            self.admit_new and self.waiting and budget > 0 and len(self.running) < self.max_num_seqs
        ):
            seq = self.waiting[0]  # nothing computed: new, or preempted and recomputed
            blocks = self.block_manager
            hits = blocks.cached_prefix(seq)
            num_cached = len(hits) * blocks.block_size
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

    def _build_plan(self, builder: PlanBuilder) -> StepPlan:
        plan = builder.plan(self._next_step_id, self._released_seq_ids)
        self._released_seq_ids = []
        self._next_step_id += 1
        return plan

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        seq.num_computed_tokens = 0
        seq.num_stale_tokens += seq.num_pending_tokens
        seq.num_pending_tokens = 0
        seq.status = SeqStatus.WAITING
        self.waiting.appendleft(seq)
        self._released_seq_ids.append(seq.seq_id)
        self.num_preemptions += 1

    def _finish(self, seq: Sequence, reason: FinishReason, still_listed: bool = False) -> None:
        """`still_listed`: the caller removes finished sequences from `running` itself."""
        if seq.status is SeqStatus.RUNNING and not still_listed:
            self.running.remove(seq)
        if seq.block_table or seq.status is SeqStatus.RUNNING:
            self._released_seq_ids.append(seq.seq_id)
        self.block_manager.free(seq)
        seq.status = SeqStatus.FINISHED
        seq.finish_reason = reason
        del self.seqs[seq.seq_id]
        samples = self.seqs_by_request[seq.request_id]
        samples.remove(seq)
        if not samples:
            del self.seqs_by_request[seq.request_id]

    def _stop_reason(self, seq: Sequence, token_id: int) -> FinishReason | None:
        num_outputs = len(seq.token_ids) - seq.num_prompt_tokens
        if token_id in seq.stop_token_ids and num_outputs > seq.params.min_tokens:
            return FinishReason.STOP
        if num_outputs >= seq.params.max_tokens or len(seq.token_ids) >= self.max_model_len:
            return FinishReason.LENGTH
        return None


def _with_logprobs(out: RequestOutput, seq: Sequence, entry) -> RequestOutput:
    """The token's logprobs, and on a request's first token its prompt's."""
    if entry is not None:
        out.logprobs = [entry]
    if seq.prompt_logprobs is not None and seq.num_output_tokens == 1:
        out.prompt_logprobs = seq.prompt_logprobs
    return out
