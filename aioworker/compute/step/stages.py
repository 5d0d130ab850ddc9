"""What the step pipeline's stages hand each other (runner.py): a launched step's handle, the
prepared step, the forward's output, the sampled tokens, and the error of a plan this rank cannot
follow. Shared by the CPU and CUDA runners.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import msgspec
import numpy as np
import torch

from aioworker.compute.layers.attention import AttentionContext
from aioworker.compute.sampling.logprobs import StepLogprobs
from aioworker.compute.sampling.sampler import SampleRow
from aioworker.compute.sampling.verify import DraftRows
from aioworker.compute.small_copies import to_device
from aioworker.compute.step.drafting import NextDrafts
from aioworker.core.plan import StepResult


class PlanError(RuntimeError):
    """A plan refers to state this rank does not have: the ranks have diverged."""


class StepHandle(Protocol):
    """A launched step; `result()` waits for its sampled tokens (on the executor's completion
    thread) and gives its StepResult."""

    def result(self) -> StepResult: ...


class CompletedStep:
    """A step whose result is already on the host (the CPU path runs steps synchronously)."""

    def __init__(self, result: StepResult) -> None:
        self._result = result

    def result(self) -> StepResult:
        return self._result


@dataclass(kw_only=True)
class PreparedStep:
    """What `prepare` gives the shared stages; runners add what their forward reads."""

    sample_rows: list[SampleRow]  # what each sampled row samples with
    spans: list  # prompt positions scored for prompt logprobs (logprobs.prompt_spans)
    sample_idx: torch.Tensor | None  # [R] token rows whose next token is sampled
    drafts: DraftRows | None = None  # where the plan has drafts to verify


@dataclass
class Sampled:
    """What the sample stage gives: a token per sampled row, and where the step verified drafts
    how many of its rows' tokens each sequence keeps."""

    tokens: torch.Tensor  # [R]
    counts: torch.Tensor | None = None  # [S]
    drafts: DraftRows | None = None
    next_drafts: NextDrafts | None = None  # made after the step, for the next one

    @property
    def num_seqs(self) -> int:
        return len(self.tokens) if self.drafts is None else len(self.drafts.rows_per_seq)

    def last_tokens(self) -> torch.Tensor:
        """[S]: each sampled sequence's last kept token (its next step's input)."""
        if self.counts is None:
            return self.tokens
        firsts = np.cumsum(self.drafts.rows_per_seq) - self.drafts.rows_per_seq
        return self.tokens[to_device(self.tokens.device, firsts) + self.counts - 1]

    def result(self, step_id: int, extra: StepLogprobs) -> StepResult:
        """The StepResult, once tokens (and counts, and next drafts) are on the host."""
        tokens = self.tokens.tolist()
        if self.counts is None:
            result = extra.result(step_id, tokens)
        else:
            counts = self.counts.tolist()
            kept = self.drafts.emitted_rows(counts)
            result = extra.result(step_id, [tokens[i] for i in kept], counts, kept)
        if self.next_drafts is None:
            return result
        drafts = self.next_drafts.per_sequence(self.num_seqs, self.next_drafts.tokens.tolist())
        return msgspec.structs.replace(result, next_drafts=drafts)


@dataclass(kw_only=True)
class StepInputs(PreparedStep):
    """The CPU runner's prepared step."""

    token_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    attn: AttentionContext


@dataclass
class Forwarded:
    """What a forward gives: every token row's final hidden state, and the sampled rows' logits
    where the forward made them itself (a captured decode graph keeps no hidden states)."""

    hidden: torch.Tensor | None
    logits: torch.Tensor | None = None
