"""The draft stage of the step pipeline, where drafts come from a model on the executor: after
the step's tokens are sampled, each sequence the plan names (`StepPlan.num_next_drafts`) runs
the draft model from its last kept token, k greedy steps, and the k tokens travel back with
the step's result for its next step to verify.

Greedy drafts are a one-hot draft distribution, which the verifier's rejection sampling takes
as it is: the output distribution stays exactly the target's. Each draft step writes the
draft's KV at the draft token's position; the scheduler gave those slots blocks (lookahead), and
the next target step computes those positions again, so nothing written here outlives it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import compress

import numpy as np
import torch

from aioworker.compute.small_copies import to_device
from aioworker.core.plan import StepPlan

# (seq ids, input tokens [n], positions [n]) -> the draft's logits [n, V]: one decode step of
# the draft model, its attention built by the runner that owns the block tables.
DraftStep = Callable[[list[int], torch.Tensor, torch.Tensor], torch.Tensor]


class DraftPlanError(RuntimeError):
    """A plan asks for drafts the runner cannot make as one batch."""


@dataclass
class NextDrafts:
    """Drafts made after a step: `which` sampled sequences (indices in plan order) drafted,
    `tokens` [len(which), k] theirs."""

    which: list[int]
    tokens: torch.Tensor

    def per_sequence(self, num_sampled_seqs: int, host_tokens: list[list[int]]) -> list[list[int]]:
        """StepResult.next_drafts: a list per sampled sequence, empty where none were asked."""
        out: list[list[int]] = [[] for _ in range(num_sampled_seqs)]
        for index, drafts in zip(self.which, host_tokens, strict=True):
            out[index] = drafts
        return out


def propose_next_drafts(
    plan: StepPlan,
    first_positions: np.ndarray,
    last_tokens: torch.Tensor,
    counts: torch.Tensor | None,
    draft_step: DraftStep,
) -> NextDrafts:
    """Draft after the step. `first_positions` [S]: the position of each sampled sequence's
    first sampled token; `last_tokens` [S]: its last kept token; `counts` [S]: tokens it kept
    (None: one each), so the last kept token sits at first position + count - 1."""
    asked = list(compress(plan.num_next_drafts, plan.sample))
    k = max(asked)
    if any(n not in (0, k) for n in asked):
        raise DraftPlanError(f"step {plan.step_id} asks for unequal draft counts {set(asked)}")
    which = [i for i, n in enumerate(asked) if n]
    seq_ids = [s for s, n in zip(compress(plan.seq_ids, plan.sample), asked, strict=True) if n]
    device = last_tokens.device
    index = to_device(device, which)
    positions = to_device(device, first_positions[which])
    if counts is not None:
        positions = positions + counts.index_select(0, index) - 1
    tokens = last_tokens.index_select(0, index)
    drafts = []
    for i in range(k):
        tokens = draft_step(seq_ids, tokens, positions + i).argmax(dim=-1)
        drafts.append(tokens)
    return NextDrafts(which, torch.stack(drafts, dim=1))
