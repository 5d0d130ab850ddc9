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


class ErrorKind(enum.StrEnum):
    """What kind of failure an ERROR output reports, so a front end can answer it in kind
    (400, 429, 503, 500) without parsing words."""

    INVALID = "invalid"  # the request itself is wrong: fix it before retrying
    OVERLOADED = "overloaded"  # the group's queue is full: retry later
    UNAVAILABLE = "unavailable"  # the group is draining, loading, released or lost: retry elsewhere
    INTERNAL = "internal"  # a step failed, or anything else


class TokenLogprobs(msgspec.Struct, array_like=True, forbid_unknown_fields=True, gc=False):
    """One token's log-probability, and the most likely tokens at its position, most likely
    first, under the distribution it was sampled from (see docs/architecture.md).

    Untracked by the garbage collector, with tuples of numbers inside (which it stops tracking
    too): a long request holds thousands, and tracked ones made every collection walk them all,
    costing a GPU decode step 10% at 256 requests with logprobs."""

    token_id: int
    logprob: float
    top_token_ids: tuple[int, ...] = ()
    top_logprobs: tuple[float, ...] = ()


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
    # Parallel to token_ids, where the request asked for logprobs.
    logprobs: list[TokenLogprobs] | None = None
    # On a request's first output, where it asked: one per prompt token after the first.
    prompt_logprobs: list[TokenLogprobs] | None = None
    # Set on ERROR outputs.
    error_kind: ErrorKind | None = None
    # The stop string that ended the request (finish_reason STOP), if one did.
    stop_string: str | None = None
    # Which of the request's `n` samples these tokens belong to.
    sample_index: int = 0
    # Speculative decoding: drafts this step verified for the sample, and how many of them it
    # accepted (each accepted draft is one of token_ids); a request's are summed.
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0

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
    logprobs: list[TokenLogprobs] | None = None
    prompt_logprobs: list[TokenLogprobs] | None = None
    error_kind: ErrorKind | None = None
    stop_string: str | None = None
    # Speculative decoding: drafts verified, and accepted.
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0

    def add(self, output: RequestOutput) -> None:
        self.token_ids += output.token_ids
        if output.num_draft_tokens:
            self.num_draft_tokens += output.num_draft_tokens
            self.num_accepted_tokens += output.num_accepted_tokens
        if output.logprobs is not None:
            if self.logprobs is None:
                self.logprobs = []
            self.logprobs += output.logprobs  # in place: a long request adds thousands
        if output.prompt_logprobs is not None:
            self.prompt_logprobs = output.prompt_logprobs
        if output.finished:
            self.finish_reason, self.error = output.finish_reason, output.error
            self.error_kind, self.stop_string = output.error_kind, output.stop_string
