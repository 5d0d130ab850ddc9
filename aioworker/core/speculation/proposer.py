"""What proposes draft tokens. The scheduler asks once per speculating sequence per step, with
every token the sequence has (prompt and outputs, none in flight) and how many it may verify.
An EAGLE-style head or a draft model on the executor's side fills the same seam."""

from __future__ import annotations

from typing import Protocol


class Proposer(Protocol):
    def propose(self, token_ids: list[int], max_tokens: int) -> list[int]:
        """Up to `max_tokens` guesses of the tokens that follow `token_ids` (may be none)."""
        ...
