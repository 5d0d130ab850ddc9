"""The eager steps a CUDA rank runs once while WARMING, so that serving never waits on Triton.

Triton compiles a kernel anew for each combination of its compile-time arguments and of how its
integer arguments specialize (equal to 1, divisible by 16, or neither) that the process has not
launched before. Capturing the decode graphs launches the decode path's combinations, but eager
steps launch others, and the first such step in service stalled on the compiler:
- a mixed step (prefills beside decodes) runs decode attention without the rotary inside it,
  with the split count its decode batch gets; W1's first run on an H100 compiled it twice,
  0.73 s (docs/benchmarks.md, 2026-12-07 05:35);
- a step of a few tokens (a short prompt, or one whose prefix was cached) runs the few-rows
  products without PDL, which the graphs of up to pdl_max_batch sequences launch with it;
- a prefill's token count picks an MoE layer's expert tiles (moe/triton_experts.block_sizes), so
  the first long prompt on an MoE rank would compile larger ones.

So the rank runs, on its scratch row and block (whose contents nothing reads), prefills of a few
rows, of each token-count specialization and of 64, 256, 1,024... tokens up to the step's token
budget; and for each class of split count that `choose_num_splits` gives a decode batch, a
decode step of that batch (eager where graphs are off) and a mixed step (with several queries a
sequence too, where speculation verifies drafts); a batch large enough to take decode attention
in tiles of 128 keys starts another class.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from aioworker.compute.step.cuda_step import CudaStep
from aioworker.core.plan import StepPlan

if TYPE_CHECKING:
    from aioworker.compute.step.cuda_runner import CudaModelRunner

PREFILL_LENGTHS = (3, 16, 17)  # a few rows, then 16k and other token counts (one: a decode)
LONG_PREFILLS = (64, 256, 1024, 4096, 16384)  # those within the step's budget: MoE's tile classes
MIXED_PREFILL = 17  # the prefill chunk beside a mixed step's decodes


@dataclass(frozen=True)
class WarmStep:
    """An eager step to run: each sequence's token count and drafts (all start at position 0)."""

    nums: tuple[int, ...]
    drafts: tuple[int, ...] = ()  # parallel to nums where any sequence verifies drafts

    @property
    def num_tokens(self) -> int:
        return sum(self.nums)

    def plan(self) -> StepPlan:
        """The step as a plan of new sequences at position 0, each sampling its last token."""
        count = len(self.nums)
        return StepPlan(
            step_id=-1,
            seq_ids=list(range(count)),
            num_scheduled_tokens=list(self.nums),
            start_positions=[0] * count,
            new_block_ids=[[] for _ in range(count)],
            sample=[True] * count,
            input_token_ids=[0] * self.num_tokens,
            num_draft_tokens=list(self.drafts),
        )


def split_class(splits: int) -> str:
    """How Triton specializes a split count: 1, divisible by 16, or neither."""
    return "one" if splits == 1 else "by16" if splits % 16 == 0 else "other"


def one_build(num_seqs: int) -> Hashable:
    """For a backend that launches the same decode attention whatever the batch."""
    return None


def decode_counts(
    max_num_seqs: int,
    num_splits: Callable[[int], int],
    build_of: Callable[[int], Hashable] = one_build,
) -> list[int]:
    """The least decode batch of each class of split count and decode attention build
    (`build_of`: the backend's for a batch; a larger batch may take larger key tiles) that
    batches of 1 to max_num_seqs sequences get."""
    first: dict[tuple, int] = {}
    for batch in range(1, max_num_seqs + 1):
        first.setdefault((split_class(num_splits(batch)), build_of(batch)), batch)
    return sorted(first.values())


def warm_steps(
    max_num_seqs: int,
    num_splits: Callable[[int], int],
    verify_queries: int = 0,
    step_tokens: int = 0,
    build_of: Callable[[int], Hashable] = one_build,
) -> list[WarmStep]:
    """The eager steps to run: prefills of PREFILL_LENGTHS tokens, and of LONG_PREFILLS up to
    `step_tokens` (the step's token budget: no more than profiling sized the cache for; 0:
    none); for each class of split count, that many decodes alone (a sequence of one token at
    position 0 is decoded, not prefilled) and beside a prefill chunk (leaving a row for the
    chunk); with `verify_queries` > 1, the mixed steps again with each decode verifying
    verify_queries - 1 drafts. `build_of`: as decode_counts takes it."""
    lengths = PREFILL_LENGTHS + tuple(n for n in LONG_PREFILLS if n <= step_tokens)
    steps = [WarmStep((length,)) for length in lengths]
    decodes = decode_counts(max(1, max_num_seqs - 1), num_splits, build_of)
    steps += [WarmStep((1,) * count) for count in decodes]
    steps += [WarmStep((MIXED_PREFILL,) + (1,) * count) for count in decodes]
    if verify_queries > 1:
        drafts = verify_queries - 1
        for count in decodes:
            nums = (MIXED_PREFILL,) + (verify_queries,) * count
            steps.append(WarmStep(nums, (0,) + (drafts,) * count))
    return steps


@torch.inference_mode()
def warm_up_eager(runner: CudaModelRunner, step_tokens: int) -> None:
    """Run `warm_steps` through the runner's eager forward and the LM head, on its scratch row
    and block (and the draft's, where the draft keeps a cache), then wait for them.
    `step_tokens`: the step's token budget (a prefill is also at most max_model_len long: the
    scratch row holds no more blocks)."""
    longest = min(step_tokens, runner.max_model_len)
    # Backends without builds of their own (xformers) launch one kernel whatever the batch.
    build_for = getattr(runner.backend, "decode_build_for", lambda num_seqs, num_kv_heads: None)

    def build_of(num_seqs: int) -> Hashable:
        return build_for(num_seqs, runner.num_kv_heads)

    steps = warm_steps(
        runner.scratch_row, runner.num_splits, runner.max_verify_queries, longest, build_of
    )
    for warm in steps:
        nums = np.asarray(warm.nums, dtype=np.int64)
        step = CudaStep(
            sample_rows=[],
            spans=[],
            sample_idx=None,
            nums=nums,
            starts=np.zeros_like(nums),
            rows=np.full_like(nums, runner.scratch_row),
            token_ids=np.zeros(warm.num_tokens, dtype=np.int64),
            use_graphs=False,
        )
        plan = warm.plan()
        hidden = runner.forward_eager(step, plan)
        last_tokens = torch.as_tensor(np.cumsum(nums) - 1, device=hidden.device)
        runner.model.compute_logits(hidden[last_tokens])
        if runner.draft is not None and runner.draft.owns_cache:
            runner.forward_eager(step, plan, runner.draft)
    torch.cuda.synchronize(runner.device)
