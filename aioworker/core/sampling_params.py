"""What a client asks for when it submits a request: sampling and stopping parameters.

A msgspec Struct so it can travel on the wire unchanged; `validate` names the bad field and its limit.
"""

from __future__ import annotations

import math

import msgspec

# The smallest temperature that is sampled as asked; below it, greedy (see is_greedy).
GREEDY_BELOW = 1e-5


class InvalidRequestError(ValueError):
    """A request cannot be served as given; the message names the field and the limit."""


class SamplingParams(
    msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, forbid_unknown_fields=True
):
    max_tokens: int = 16
    min_tokens: int = 0
    # 0 = greedy.
    temperature: float = 1.0
    # 0 = no top-k cut.
    top_k: int = 0
    top_p: float = 1.0
    # A seeded request samples the same tokens whatever else shares its batch.
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

    def validate(self) -> None:
        """Check the fields that need no model; token ids are checked against the vocabulary at admission."""
        if self.max_tokens <= 0:
            raise InvalidRequestError(f"max_tokens is {self.max_tokens}; it must be at least 1")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise InvalidRequestError(
                f"min_tokens is {self.min_tokens}; it must be between 0 and max_tokens ({self.max_tokens})"
            )
        if not 0.0 <= self.temperature < math.inf:  # also rejects NaN
            raise InvalidRequestError(
                f"temperature is {self.temperature}; it must be finite and >= 0 (0 means greedy)"
            )
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidRequestError(f"top_p is {self.top_p}; it must be in (0, 1]")
        if self.top_k < 0:
            raise InvalidRequestError(f"top_k is {self.top_k}; it must be >= 0 (0 disables it)")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise InvalidRequestError(f"seed is {self.seed}; it must be in [0, 2**63)")

    @property
    def is_greedy(self) -> bool:
        """Temperatures below GREEDY_BELOW sample greedily: dividing float32 logits by them
        overflows, and the distribution they ask for is the argmax anyway."""
        return self.temperature < GREEDY_BELOW
