"""The scheduler's taking of a step's results, kept apart from scheduling proper: each sampled
token appended to its sequence, drafts accepted or cut, stop conditions checked and sequences
finished, and one output per sampled token (with its logprobs). Torch-free.

`ResultTaking` is a part of `Scheduler` (core/scheduler.py): its methods use the scheduler's
sequences, block manager and speculator, which `Scheduler.__init__` sets up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aioworker.core.block_manager import BlockManager
from aioworker.core.kv_connector import KvReport
from aioworker.core.kv_in_flight import KvInFlight
from aioworker.core.outputs import ErrorKind, FinishReason, RequestOutput
from aioworker.core.plan import StepPlan, StepResult
from aioworker.core.sequence import SeqStatus, Sequence
from aioworker.core.speculation.speculator import Speculator


class ResultTaking:
    if TYPE_CHECKING:  # set by Scheduler.__init__, or its other parts
        block_manager: BlockManager
        speculator: Speculator | None
        kv: KvInFlight
        seqs: dict[int, Sequence]
        running: list[Sequence]
        max_model_len: int
        _trimmed: dict[int, int]

        def _take_kv_report(self, report: KvReport, step_id: int) -> list[RequestOutput]: ...

        def _finish(
            self, seq: Sequence, reason: FinishReason, still_listed: bool = False
        ) -> None: ...

    def update(
        self, plan: StepPlan, result: StepResult, weights_version: int = 0
    ) -> list[RequestOutput]:
        """Append sampled tokens, finish sequences that stop; returns one output per sampled token."""
        if result.step_id != plan.step_id:
            raise ValueError(f"result of step {result.step_id} given for plan {plan.step_id}")
        if plan.kv is not None and not plan.seq_ids:
            self.kv.polling = False
        failed = [] if result.kv is None else self._take_kv_report(result.kv, plan.step_id)
        for out in failed:
            out.weights_version = weights_version
        self._keep_prompt_logprobs(result)
        if plan.has_drafts:
            return failed + self._update_verified(plan, result, weights_version)
        if failed:
            return failed + self._update_plain(plan, result, weights_version)
        return self._update_plain(plan, result, weights_version)

    def _update_plain(
        self, plan: StepPlan, result: StepResult, weights_version: int
    ) -> list[RequestOutput]:
        """`update` for a plan without drafts."""
        sampled = iter(result.sampled_token_ids)
        logprobs = iter(result.logprobs) if result.logprobs is not None else None
        next_drafts = iter(result.next_drafts) if result.next_drafts else None
        outputs: list[RequestOutput] = []
        step_id = plan.step_id
        find, running = self.seqs.get, SeqStatus.RUNNING  # locals: this loop runs per sequence
        finished = False
        for seq_id, do_sample in zip(plan.seq_ids, plan.sample, strict=True):
            if not do_sample:
                continue
            token_id = next(sampled)
            entry = next(logprobs) if logprobs is not None else None
            drafts = next(next_drafts) if next_drafts is not None else None
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
            elif drafts:
                seq.next_drafts = drafts
            out = RequestOutput(seq.request_id, [token_id], reason, None, step_id, weights_version)
            if reason is FinishReason.ERROR:
                _refused_by_grammar(out, token_id)
            if seq.sample_index:
                out.sample_index = seq.sample_index
            if entry is not None or seq.prompt_logprobs is not None:
                out = _with_logprobs(out, seq, entry)
            outputs.append(out)
        if finished:  # one pass instead of a list.remove per finished sequence
            self.running = [seq for seq in self.running if seq.status is running]
        return outputs

    def _update_verified(
        self, plan: StepPlan, result: StepResult, weights_version: int
    ) -> list[RequestOutput]:
        """`update` for a plan with drafts: each sampled sequence gets its accepted drafts and
        one more token, cut short where one of them ends it."""
        if result.num_sampled is None:
            raise ValueError(f"result of step {result.step_id} has no counts for its drafts")
        outputs: list[RequestOutput] = []
        entries = result.logprobs
        first = 0
        num_proposed = num_accepted = num_verified = 0
        drafted = (
            (seq_id, k)
            for seq_id, k, do_sample in zip(
                plan.seq_ids, plan.num_draft_tokens, plan.sample, strict=True
            )
            if do_sample
        )
        next_drafts = iter(result.next_drafts) if result.next_drafts else None
        for (seq_id, num_drafts), count in zip(drafted, result.num_sampled, strict=True):
            tokens = result.sampled_token_ids[first : first + count]
            logprobs = entries[first : first + count] if entries is not None else None
            drafts = next(next_drafts) if next_drafts is not None else None
            first += count
            seq = self.seqs.get(seq_id)
            if seq is None:
                continue  # finished or aborted while the step ran
            if seq.num_stale_tokens:
                seq.num_stale_tokens -= 1  # scheduled before a preemption: recomputed later
                continue
            if num_drafts:
                num_proposed += num_drafts
                num_accepted += count - 1
                num_verified += 1
            out = self._append_verified(seq, num_drafts, tokens, logprobs, plan.step_id)
            out.weights_version = weights_version
            if drafts and out.finish_reason is None:
                seq.next_drafts = drafts
            outputs.append(out)
        self.running = [seq for seq in self.running if seq.status is SeqStatus.RUNNING]
        if self.speculator is not None:
            self.speculator.policy.observe_verified(num_proposed, num_accepted, num_verified)
        return outputs

    def _append_verified(
        self, seq: Sequence, num_drafts: int, tokens: list[int], logprobs, step_id: int
    ) -> RequestOutput:
        seq.num_pending_tokens -= 1
        seq.num_draft_tokens = 0
        # The step computed 1 + num_drafts positions; those past the accepted drafts are void.
        seq.num_computed_tokens -= num_drafts + 1 - len(tokens)
        num_accepted = len(tokens) - 1
        seq.num_proposed_tokens += num_drafts
        seq.num_accepted_tokens += num_accepted
        reason = None
        kept = 0
        for token_id in tokens:
            seq.token_ids.append(token_id)
            kept += 1
            reason = self._stop_reason(seq, token_id)
            if reason is not None:
                break
        tokens = tokens[:kept]
        if reason is not None:
            self._finish(seq, reason, still_listed=True)
        elif self.block_manager.trim(seq, len(seq.token_ids)):
            self._trimmed[seq.seq_id] = len(seq.block_table)
        out = RequestOutput(seq.request_id, tokens, reason, None, step_id, 0)
        if reason is FinishReason.ERROR:
            _refused_by_grammar(out, tokens[-1])
        out.num_draft_tokens, out.num_accepted_tokens = num_drafts, num_accepted
        if seq.sample_index:
            out.sample_index = seq.sample_index
        if logprobs is not None and any(entry is not None for entry in logprobs):
            out.logprobs = logprobs[:kept]
        if seq.prompt_logprobs is not None and seq.num_output_tokens == len(tokens):
            out.prompt_logprobs = seq.prompt_logprobs
        return out

    def _keep_prompt_logprobs(self, result: StepResult) -> None:
        for scored in result.prompt_logprobs:
            seq = self.seqs.get(scored.seq_id)
            if seq is not None and seq.prompt_logprobs is not None:
                seq.add_prompt_logprobs(scored.first_position, scored.entries)

    def _stop_reason(self, seq: Sequence, token_id: int) -> FinishReason | None:
        grammar = seq.grammar
        if grammar is not None:
            grammar.keep(token_id)  # the mask thread has the matcher accept it
            if grammar.is_broken:  # found by the mask thread: a token before this one
                return FinishReason.ERROR
        num_outputs = len(seq.token_ids) - seq.num_prompt_tokens
        if token_id in seq.stop_token_ids and num_outputs > seq.params.min_tokens:
            return FinishReason.STOP
        if num_outputs >= seq.params.max_tokens or len(seq.token_ids) >= self.max_model_len:
            return FinishReason.LENGTH
        return None


def _refused_by_grammar(out: RequestOutput, token_id: int) -> None:
    out.error = f"a token before {token_id} does not follow the request's guided grammar"
    out.error_kind = ErrorKind.INTERNAL


def _with_logprobs(out: RequestOutput, seq: Sequence, entry) -> RequestOutput:
    """The token's logprobs, and on a request's first token its prompt's."""
    if entry is not None:
        out.logprobs = [entry]
    if seq.prompt_logprobs is not None and seq.num_output_tokens == 1:
        out.prompt_logprobs = seq.prompt_logprobs
    return out
