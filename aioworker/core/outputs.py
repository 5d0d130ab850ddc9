"""What requests get back: one `RequestOutput` per request per step (the same object from the
engine core, over the wire, to the client), and a `Completion` when a whole request is collected."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import msgspec


class FinishReason(enum.StrEnum):
    STOP = "stop"  # a stop token (EOS included) was sampled
    LENGTH = "length"  # max_tokens or max_model_len reached
    ABORT = "abort"  # by the client, an operator, a drain deadline or a weights update
    ERROR = "error"  # refused at admission, or failed in a step


class RequestOutput(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    """A request's new tokens from one step; the request's one terminal output also says why it
    ended. Array-like: hundreds of these travel in every step's messages."""

    request_id: str
    token_ids: list[int]
    finish_reason: FinishReason | None = None
    # Why an aborted or failed request ended, in words.
    error: str | None = None
    step_id: int = -1
    weights_version: int = 0
    # The text these tokens add, where a tokenizer ran (the offline engine); empty on the wire.
    text: str = ""

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class Completion:
    """A whole request's outputs, collected."""

    request_id: str
    prompt_token_ids: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: FinishReason | None = None
    error: str | None = None
    # The data-parallel group that served it (-1: the offline engine).
    group: int = -1

    def add(self, output: RequestOutput) -> None:
        self.token_ids += output.token_ids
        if output.finished:
            self.finish_reason, self.error = output.finish_reason, output.error
