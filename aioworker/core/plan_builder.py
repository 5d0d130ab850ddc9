"""One StepPlan, built while the scheduler walks its sequences: each scheduled sequence's tokens,
positions and new blocks, and for a sequence that is (re)admitted the `NewSeq` that tells the
executors its sampling settings once. Torch-free."""

from __future__ import annotations

from aioworker.core.block_manager import BlockManager
from aioworker.core.kv_connector import KvTransfers
from aioworker.core.plan import (
    PENDING_TOKEN,
    LogitControls,
    NewSeq,
    SamplingSettings,
    StepPlan,
)
from aioworker.core.sampling_params import SamplingParams
from aioworker.core.sequence import Sequence


class PlanBuilder:
    """The lists of one StepPlan, filled sequence by sequence (the hot path at hundreds of seqs)."""

    __slots__ = (
        "register",
        "block_size",
        "seq_ids",
        "num_tokens",
        "starts",
        "new_block_ids",
        "sample",
        "input_ids",
        "new_seqs",
        "drafted",
        "next_drafts",
    )

    def __init__(self, block_manager: BlockManager) -> None:
        # Prefix caching: gives blocks that this step fills their content address.
        self.register = (
            block_manager.register_full_blocks if block_manager.enable_prefix_caching else None
        )
        self.block_size = block_manager.block_size
        self.seq_ids: list[int] = []
        self.num_tokens: list[int] = []
        self.starts: list[int] = []
        self.new_block_ids: list[list[int]] = []
        self.sample: list[bool] = []
        self.input_ids: list[int] = []
        self.new_seqs: list[NewSeq] = []
        # (index in seq_ids, number of drafts) of each sequence scheduled with drafts.
        self.drafted: list[tuple[int, int]] = []
        # (index in seq_ids, drafts to propose after the step) where the executor drafts.
        self.next_drafts: list[tuple[int, int]] = []

    def ask_next_drafts(self, num_drafts: int, lookahead_block_ids: list[int]) -> None:
        """The executor drafts `num_drafts` for the sequence added last, after its step; their
        KV goes into `lookahead_block_ids` (appended to its table) where its blocks end first."""
        self.next_drafts.append((len(self.seq_ids) - 1, num_drafts))
        if lookahead_block_ids:
            self.new_block_ids[-1] = [*self.new_block_ids[-1], *lookahead_block_ids]

    def add_with_drafts(self, seq: Sequence, drafts: list[int], new_block_ids: list[int]) -> None:
        """A decoding sequence (no token in flight) with drafts to verify: its last known token,
        then the drafts, all computed this step; between 1 and len(drafts) + 1 tokens come back."""
        start = seq.num_computed_tokens
        self.drafted.append((len(self.seq_ids), len(drafts)))
        self.seq_ids.append(seq.seq_id)
        self.num_tokens.append(1 + len(drafts))
        self.starts.append(start)
        self.new_block_ids.append(new_block_ids)
        self.input_ids.append(seq.token_ids[start])
        self.input_ids.extend(drafts)
        self.sample.append(True)
        seq.num_computed_tokens = start + 1 + len(drafts)
        seq.num_pending_tokens += 1
        seq.num_draft_tokens = len(drafts)
        if self.register is not None and (start + 1) // self.block_size > len(seq.block_hashes):
            self.register(seq)  # addresses only known tokens: drafts never register

    def add(self, seq: Sequence, num_tokens: int, new_block_ids: list[int]) -> None:
        start = seq.num_computed_tokens
        end = start + num_tokens
        known = len(seq.token_ids)
        self.seq_ids.append(seq.seq_id)
        self.num_tokens.append(num_tokens)
        self.starts.append(start)
        self.new_block_ids.append(new_block_ids)
        if num_tokens == 1:
            self.input_ids.append(seq.token_ids[start] if start < known else PENDING_TOKEN)
        else:
            self.input_ids.extend(seq.token_ids[start:end])
            if end > known:  # only ever the last one: the token in flight
                self.input_ids.append(PENDING_TOKEN)
        seq.num_computed_tokens = end
        if self.register is not None and end // self.block_size > len(seq.block_hashes):
            self.register(seq)
        is_last = end == known + seq.num_pending_tokens
        self.sample.append(is_last)
        if is_last:
            seq.num_pending_tokens += 1

    def plan(
        self,
        step_id: int,
        released_seq_ids: list[int],
        trimmed_block_tables: list[tuple[int, int]] = (),
        kv: KvTransfers | None = None,
    ) -> StepPlan:
        return StepPlan(
            step_id=step_id,
            seq_ids=self.seq_ids,
            num_scheduled_tokens=self.num_tokens,
            start_positions=self.starts,
            new_block_ids=self.new_block_ids,
            sample=self.sample,
            input_token_ids=self.input_ids,
            new_seqs=self.new_seqs,
            released_seq_ids=released_seq_ids,
            num_draft_tokens=self._per_seq(self.drafted),
            num_next_drafts=self._per_seq(self.next_drafts),
            trimmed_block_tables=list(trimmed_block_tables),
            kv=kv,
        )

    def _per_seq(self, counts: list[tuple[int, int]]) -> list[int]:
        """(index, count) pairs as a list parallel to seq_ids; empty where there are none."""
        if not counts:
            return []
        out = [0] * len(self.seq_ids)
        for index, count in counts:
            out[index] = count
        return out


def new_seq(seq: Sequence) -> NewSeq:
    params = seq.params
    scores_prompt = seq.needs_prompt_logprobs
    controls = logit_controls(params)
    settings = SamplingSettings(
        temperature=0.0 if params.is_greedy else params.temperature,
        top_k=params.top_k,
        top_p=params.top_p,
        seed=params.seed,
        min_tokens=params.min_tokens,
        stop_token_ids=sorted(seq.stop_token_ids) if params.min_tokens else [],
        logprobs=-1 if params.logprobs is None else params.logprobs,
        prompt_logprobs=params.prompt_logprobs if scores_prompt else -1,
        controls=controls,
        guided=seq.grammar is not None,
    )
    if controls is not None and controls.needs_history:
        token_ids = list(seq.token_ids)  # a copy: the offline executor reads it on its thread
    elif scores_prompt:
        token_ids = seq.token_ids[: seq.num_prompt_tokens]
    else:
        token_ids = []
    return NewSeq(seq.seq_id, seq.num_prompt_tokens, settings, token_ids)


_NO_CONTROLS = LogitControls()


def logit_controls(params: SamplingParams) -> LogitControls | None:
    """The request's logit controls, or None where every one is off (most requests)."""
    controls = LogitControls(
        repetition_penalty=params.repetition_penalty,
        presence_penalty=params.presence_penalty,
        frequency_penalty=params.frequency_penalty,
        # A greedy draw always keeps the likeliest token, which is all min_p could keep.
        min_p=0.0 if params.is_greedy else params.min_p,
        logit_bias=dict(params.logit_bias),
        allowed_token_ids=(
            None if params.allowed_token_ids is None else list(params.allowed_token_ids)
        ),
        bad_words_token_ids=[list(word) for word in params.bad_words_token_ids],
    )
    return None if controls == _NO_CONTROLS else controls
