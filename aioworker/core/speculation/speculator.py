"""The scheduler's side of speculative decoding: which sequences may speculate this step, their
drafts, and what a verified step says about acceptance.

Drafts come from a Proposer on the host (n-gram), or, with no proposer, from a draft model on
the executor: a plan asks for drafts after its step (`StepPlan.num_next_drafts`), the result
brings them (`Sequence.next_drafts`), and the sequence's next step verifies them."""

from __future__ import annotations

from aioworker.core.sequence import Sequence
from aioworker.core.speculation.policy import SpeculationPolicy
from aioworker.core.speculation.proposer import Proposer


class Speculator:
    def __init__(
        self, proposer: Proposer | None, policy: SpeculationPolicy, max_model_len: int
    ) -> None:
        """`proposer`: None where the executor drafts."""
        self.proposer = proposer
        self.policy = policy
        self.max_model_len = max_model_len

    def num_draft_tokens(self, running: list[Sequence], probe: bool = False) -> int:
        """Drafts per sequence this step, for a batch of these running sequences (`probe`:
        a decision the scheduler acts on, which counts toward the policy's next probe)."""
        return self.policy.num_draft_tokens(len(running), len(running), probe)

    @property
    def drafts_on_executor(self) -> bool:
        return self.proposer is None

    def may_speculate(self, seq: Sequence) -> bool:
        """Decoding, with nothing in flight (its drafts follow its last known token), and
        where the executor drafts, with drafts from its last step."""
        return (
            seq.can_speculate
            and not seq.num_pending_tokens
            and seq.num_computed_tokens == len(seq.token_ids) - 1
            and (self.proposer is not None or bool(seq.next_drafts))
        )

    def drafts(self, seq: Sequence, max_drafts: int) -> list[int]:
        """Up to `max_drafts` drafts, never past the sequence's max_tokens or max_model_len:
        every draft accepted plus the step's own token must still be allowed."""
        room = min(
            max_drafts,
            seq.params.max_tokens - seq.num_output_tokens - 1,
            self.max_model_len - len(seq.token_ids) - 1,
        )
        if self.proposer is None:
            drafts, seq.next_drafts = seq.next_drafts, []
            return drafts[: max(room, 0)]
        return self.proposer.propose(seq.token_ids, room) if room > 0 else []
