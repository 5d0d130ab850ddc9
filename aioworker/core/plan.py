"""The step contract between the scheduler and every rank's executor: StepPlan in, StepResult out.

A plan carries deltas: a sequence's sampling settings and prompt length travel once (in `new_seqs`),
and afterwards only its new tokens and newly allocated blocks do. Executors keep the rest, so
plans stay small at hundreds of running requests. Plans are numbered: a rank that sees a gap
has lost state and must stop.

A step may verify drafts (speculative decoding): a sequence with k draft tokens is scheduled
with 1 + k input tokens, its last known token then the drafts, and the step gives back between
1 and k + 1 tokens for it: the drafts it accepted and one token of its own. Such a sequence has
no token in flight when it is planned, so its inputs are never PENDING_TOKEN.

Where drafts come from a model on the executor's side (a draft model or the target's own first
layers), a plan also says which sequences to draft for after the step (`num_next_drafts`): the
executor runs the draft from each one's last kept token and returns the drafts with the result
(`next_drafts`), and the scheduler verifies them in the sequence's next step.
"""

from __future__ import annotations

import msgspec

from aioworker.core.kv_connector import KvReport, KvTransfers
from aioworker.core.outputs import TokenLogprobs

# An input token that the previous step samples: the executor takes it from its own record of
# that step's samples, so the next plan can be built while the previous step still runs.
PENDING_TOKEN = -1


class LogitControls(msgspec.Struct, array_like=True, frozen=True, forbid_unknown_fields=True):
    """The controls a sequence's logits go through before sampling (SamplingParams has their
    meaning); present only where at least one is on."""

    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_p: float = 0.0
    logit_bias: dict[int, float] = {}
    allowed_token_ids: list[int] | None = None
    bad_words_token_ids: list[list[int]] = []

    @property
    def uses_penalties(self) -> bool:
        return (
            self.repetition_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
        )

    @property
    def needs_history(self) -> bool:
        """Whether the sampler needs the tokens the sequence has seen: penalties count them, and
        a bad word of several tokens is matched against the latest outputs."""
        return self.uses_penalties or any(len(word) > 1 for word in self.bad_words_token_ids)


class SamplingSettings(msgspec.Struct, array_like=True, frozen=True, forbid_unknown_fields=True):
    temperature: float
    top_k: int
    top_p: float
    seed: int | None
    min_tokens: int
    # Logits of these are masked while the sequence has fewer than min_tokens outputs.
    stop_token_ids: list[int]
    # Alternatives to return with each sampled token's logprob (-1: no logprobs).
    logprobs: int = -1
    # The same for prompt tokens (-1: none, or all already computed before a preemption).
    prompt_logprobs: int = -1
    # None for a sequence that uses no logit control: one byte in its plan, no work per step.
    controls: LogitControls | None = None
    # Its rows follow a grammar: the driver's sampling waits for their masks (core/grammar.py).
    guided: bool = False


class NewSeq(msgspec.Struct, array_like=True, frozen=True, forbid_unknown_fields=True):
    seq_id: int
    num_prompt_tokens: int
    sampling: SamplingSettings
    # Only where they are needed, else empty. Prompt logprobs score each prompt position against
    # the next prompt token, which a chunk's own inputs do not always hold: the prompt. Penalties
    # and bad words of several tokens start from what the sequence has seen, which a plan's
    # inputs miss (a cached prefix, outputs before a preemption): the prompt, then every output.
    token_ids: list[int] = []


class StepPlan(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    step_id: int
    # Sequences scheduled this step, in batch order; the lists below are parallel to it.
    seq_ids: list[int]
    num_scheduled_tokens: list[int]
    # Tokens already in the KV cache before this step (the position of the first input token).
    start_positions: list[int]
    # Blocks appended to each sequence's block table this step (all of them for a new sequence).
    new_block_ids: list[list[int]]
    # True where this step computes the last known token, so a new one is sampled.
    sample: list[bool]
    # Input tokens of all scheduled sequences, concatenated; PENDING_TOKEN where a sequence's
    # last input is the token the previous step samples for it.
    input_token_ids: list[int]
    new_seqs: list[NewSeq] = []
    # Finished, aborted or preempted since the last plan: executors drop their state first.
    released_seq_ids: list[int] = []
    # Empty unless a sequence has drafts; then parallel to seq_ids: how many of a sequence's
    # input tokens, at their end, are drafts to verify (0 for the others).
    num_draft_tokens: list[int] = []
    # (seq id, blocks kept) of sequences whose block tables were cut since the last plan (the
    # blocks of rejected drafts went back): executors cut theirs before adding new blocks.
    trimmed_block_tables: list[tuple[int, int]] = []
    # Empty unless the executor drafts; then parallel to seq_ids: how many drafts to propose
    # for a sampled sequence after this step, from its last kept token (0: none). The draft
    # writes its KV at the positions of those drafts: their blocks are in the block table.
    num_next_drafts: list[int] = []
    # Copies of KV blocks to and from another tier (core/kv_connector.py), run before the
    # forward; a plan may carry only these (no sequence is ready, copies are in flight).
    kv: KvTransfers | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.input_token_ids)

    @property
    def has_drafts(self) -> bool:
        return bool(self.num_draft_tokens)

    @property
    def drafts_next(self) -> bool:
        return bool(self.num_next_drafts)

    @property
    def is_empty(self) -> bool:
        return not self.seq_ids


class PromptLogprobs(msgspec.Struct, array_like=True, frozen=True, forbid_unknown_fields=True):
    """Logprobs of the prompt tokens at positions first_position, first_position + 1, ... of
    one sequence, from one step's chunk of its prompt."""

    seq_id: int
    first_position: int
    entries: list[TokenLogprobs]


class StepResult(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    step_id: int
    # The tokens of each sequence whose `sample` flag was set, in plan order, concatenated: one
    # each, unless the plan had drafts (then see num_sampled).
    sampled_token_ids: list[int]
    # Parallel to sampled_token_ids when any of them asked for logprobs (None where one did not).
    logprobs: list[TokenLogprobs | None] | None = None
    prompt_logprobs: list[PromptLogprobs] = []
    # For a plan with drafts, per sampled sequence: how many of sampled_token_ids are its (the
    # drafts it accepted, plus one). None: one each.
    num_sampled: list[int] | None = None
    # For a plan with num_next_drafts, per sampled sequence: the drafts proposed for its next
    # step (empty where none were asked for).
    next_drafts: list[list[int]] = []
    # KV copies that ended since the rank's last result (core/kv_connector.py).
    kv: KvReport | None = None

    def tokens_per_sequence(self) -> list[list[int]]:
        """The sampled tokens of each sampled sequence, in plan order."""
        if self.num_sampled is None:
            return [[token] for token in self.sampled_token_ids]
        out, start = [], 0
        for count in self.num_sampled:
            out.append(self.sampled_token_ids[start : start + count])
            start += count
        return out
