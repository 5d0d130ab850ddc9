"""The CUDA runner's prepared step, and a launched one whose results are on their way to the host."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from aioworker.compute.sampling.logprobs import StepLogprobs
from aioworker.compute.small_copies import pinned_copy
from aioworker.compute.step.drafting import NextDrafts
from aioworker.compute.step.stages import PreparedStep, Sampled
from aioworker.core.plan import StepResult


@dataclass(kw_only=True)
class CudaStep(PreparedStep):
    """The CUDA runner's prepared step: host arrays, and whether the captured graphs run it."""

    nums: np.ndarray  # tokens per scheduled sequence
    starts: np.ndarray  # position of each one's first token
    rows: np.ndarray  # each one's row of the block-table matrix
    token_ids: np.ndarray  # the plan's input ids, PENDING_TOKEN where the device fills them
    use_graphs: bool
    use_verify_graphs: bool = False
    sampled_rows: torch.Tensor | None = None  # set by forward: the rows whose tokens are kept


class PendingStep:
    """A launched step: its sampled tokens (and counts) and any logprobs are being copied to
    pinned host memory, all behind one event."""

    def __init__(self, step_id: int, sampled: Sampled | None, extra: StepLogprobs) -> None:
        self.step_id = step_id
        self.host = None
        if sampled is not None:
            counts = None if sampled.counts is None else pinned_copy(sampled.counts)
            self.host = Sampled(pinned_copy(sampled.tokens), counts, sampled.drafts)
            drafts = sampled.next_drafts
            if drafts is not None:
                self.host.next_drafts = NextDrafts(drafts.which, pinned_copy(drafts.tokens))
        self.extra = extra.to_host()
        self.done = torch.cuda.Event()
        self.done.record()

    def result(self) -> StepResult:
        """The step's one host synchronisation; called on the executor's completion thread."""
        self.done.synchronize()
        if self.host is None:
            return self.extra.result(self.step_id, [])
        return self.host.result(self.step_id, self.extra)
