"""The step contract between the scheduler and every rank's executor: StepPlan in, StepResult out.

A plan carries deltas: a sequence's sampling settings and prompt length travel once (in `new_seqs`),
and afterwards only its new tokens and newly allocated blocks do. Executors keep the rest, so
plans stay small at hundreds of running requests. Plans are numbered: a rank that sees a gap
has lost state and must stop.
"""

from __future__ import annotations

import msgspec

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

    @property
    def num_tokens(self) -> int:
        return len(self.input_token_ids)

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
    # One token per sequence whose `sample` flag was set, in plan order.
    sampled_token_ids: list[int]
    # Parallel to sampled_token_ids when any of them asked for logprobs (None where one did not).
    logprobs: list[TokenLogprobs | None] | None = None
    prompt_logprobs: list[PromptLogprobs] = []
