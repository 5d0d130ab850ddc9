"""Admission checks for a request, before it reaches the scheduler. Torch-free.

Each error names the field and the limit, so a client can fix its request; nothing already
running is affected by a rejected one.
"""

from __future__ import annotations

from aioworker.core.sampling_params import InvalidRequestError, SamplingParams


class QueueFull(RuntimeError):
    """The group has `scheduler.max_waiting` requests waiting already: retry later."""


class RequestValidator:
    def __init__(self, vocab_size: int, max_model_len: int) -> None:
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len

    def check(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        if not prompt_token_ids:
            raise InvalidRequestError("prompt is empty; give at least one token")
        if len(prompt_token_ids) > self.max_model_len:
            raise InvalidRequestError(
                f"prompt has {len(prompt_token_ids)} tokens; max_model_len is {self.max_model_len}"
            )
        bad = next(
            (i for i, t in enumerate(prompt_token_ids) if not 0 <= t < self.vocab_size), None
        )
        if bad is not None:
            raise InvalidRequestError(
                f"prompt token id {prompt_token_ids[bad]} at index {bad} is outside the vocabulary "
                f"[0, {self.vocab_size})"
            )
        params.validate()
        for field, token_ids in params.token_ids_to_check():
            bad = next((t for t in token_ids if not 0 <= t < self.vocab_size), None)
            if bad is not None:
                raise InvalidRequestError(
                    f"{field} holds {bad}; token ids must be in [0, {self.vocab_size})"
                )
