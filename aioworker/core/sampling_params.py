"""What a client asks for when it submits a request: sampling and stopping parameters.

A msgspec Struct so it can travel on the wire unchanged; `validate` names the bad field and its limit.
"""

from __future__ import annotations

import math

import msgspec

# The smallest temperature that is sampled as asked; below it, greedy (see is_greedy).
GREEDY_BELOW = 1e-5
# The most alternatives a request may ask logprobs for, per token (OpenAI's top_logprobs bound).
MAX_LOGPROBS = 20
# Stop strings: how many a request may give, and how long each may be (characters).
MAX_STOP_STRINGS = 16
MAX_STOP_STRING_LENGTH = 256
# The most samples one request may ask for (`n`).
MAX_SAMPLES = 64


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
    # Text that ends the request where it appears in the output (never included in it); needs
    # the model's tokenizer in the worker.
    stop: tuple[str, ...] = ()
    # Each sampled token's logprob, with this many most likely alternatives (0..MAX_LOGPROBS).
    logprobs: int | None = None
    # The same for every prompt token after the first (RL scoring).
    prompt_logprobs: int | None = None
    # Independent samples of the same prompt, which is computed once and shared; sample i is
    # seeded with seed + i and has its own outputs (`sample_index`) and terminal output.
    n: int = 1

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
        if not 1 <= self.n <= MAX_SAMPLES:
            raise InvalidRequestError(f"n is {self.n}; it must be between 1 and {MAX_SAMPLES}")
        if self.seed is not None and not 0 <= self.seed <= 2**63 - self.n:
            raise InvalidRequestError(f"seed is {self.seed}; seed + n must stay below 2**63")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= MAX_LOGPROBS:
                raise InvalidRequestError(
                    f"{name} is {value}; it must be between 0 and {MAX_LOGPROBS}"
                )
        self._validate_stop()

    def _validate_stop(self) -> None:
        if len(self.stop) > MAX_STOP_STRINGS:
            raise InvalidRequestError(
                f"stop has {len(self.stop)} strings; at most {MAX_STOP_STRINGS} are allowed"
            )
        for text in self.stop:
            if not 0 < len(text) <= MAX_STOP_STRING_LENGTH:
                raise InvalidRequestError(
                    f"stop string {text[:40]!r} has {len(text)} characters; each must have 1 to "
                    f"{MAX_STOP_STRING_LENGTH}"
                )

    @property
    def is_greedy(self) -> bool:
        """Temperatures below GREEDY_BELOW sample greedily: dividing float32 logits by them
        overflows, and the distribution they ask for is the argmax anyway."""
        return self.temperature < GREEDY_BELOW
