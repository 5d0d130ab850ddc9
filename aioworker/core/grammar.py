"""Guided decoding on the torch-free side: a grammar matcher per sequence, advanced by the
scheduler with every token a sequence keeps, and the token masks of a step.

The engine core runs a step ahead, so a step's plan is built before the tokens its masks follow
are known. Masks therefore travel beside the plan, not in it: when a step becomes the oldest in
flight, every token before its sampled rows is known, and `MaskFiller` fills their masks on a
thread of its own, while that step's forward runs, and hands them to the executor
(`Executor.provide_masks`). The executor's logits stage waits for them only in steps with a
guided row. Only the driver samples, so masks never travel to tensor-parallel peers.

A matcher only ever accepts tokens a sequence keeps. So a preemption needs no replay (the
tokens in flight that it voids were never accepted), and the rows of drafts are filled by
accepting the drafts and rolling them back at once: a rejected draft leaves nothing behind.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from aioworker.core.guided import GuidedParams
from aioworker.core.plan import StepPlan

if TYPE_CHECKING:
    from aioworker.core.sequence import Sequence

log = logging.getLogger(__name__)


class GrammarMatcher(Protocol):
    """One sequence's position in its grammar (xgrammar's GrammarMatcher satisfies it)."""

    def accept_token(self, token_id: int) -> bool: ...

    def rollback(self, num_tokens: int) -> None: ...

    def is_terminated(self) -> bool: ...

    def fill_next_token_bitmask(self, bitmask: np.ndarray, index: int) -> bool: ...


class GrammarBackend(Protocol):
    """Compiles what requests ask for against the model's tokenizer (compute/grammar/)."""

    # int32 words per mask row: one bit per token of the model's vocabulary.
    num_mask_words: int

    def compile(self, guided: GuidedParams) -> Future:
        """The compiled grammar, from the cache or a compile pool; the future raises
        InvalidRequestError naming what is wrong with a bad schema, regex or grammar."""
        ...

    def matcher(self, compiled: object, stop_token_ids: list[int]) -> GrammarMatcher:
        """A fresh matcher; the grammar ends with one of `stop_token_ids`."""
        ...

    def fill_many(self, matchers: list[GrammarMatcher], bitmask: np.ndarray) -> None:
        """Row i of `bitmask` takes matcher i's mask (on several threads where it pays)."""
        ...

    def close(self) -> None:
        """Stop compiling and let the backend's threads go."""
        ...


class SequenceGrammar:
    """A sequence's matcher and what the scheduler asks of it."""

    __slots__ = ("matcher", "is_broken")

    def __init__(self, matcher: GrammarMatcher) -> None:
        self.matcher = matcher
        self.is_broken = False  # a kept token the grammar refused (never, while masks apply)

    def accept(self, token_id: int) -> bool:
        """Advance past a kept token; False if the grammar refuses it."""
        if self.is_broken or not self.matcher.accept_token(token_id):
            self.is_broken = True
            return False
        return True

    @property
    def is_complete(self) -> bool:
        """The grammar ended (it accepted a stop token): the output is whole."""
        return self.matcher.is_terminated()

    def valid_prefix(self, drafts: list[int]) -> list[int]:
        """The drafts the grammar allows, up to the first it refuses (drafts from an n-gram or
        a draft model know nothing of the grammar, and a refused one could never be kept)."""
        matcher, count = self.matcher, 0
        for token in drafts:
            if matcher.is_terminated() or not matcher.accept_token(token):
                break
            count += 1
        if count:
            matcher.rollback(count)
        return drafts[:count]

    def fill_with_drafts(self, bitmask: np.ndarray, first: int, drafts: list[int]) -> None:
        """Rows first .. first + len(drafts): the mask before each draft and after the last."""
        matcher, accepted = self.matcher, 0
        matcher.fill_next_token_bitmask(bitmask, first)
        for j, token in enumerate(drafts, start=1):
            if accepted == j - 1 and matcher.accept_token(token):
                accepted += 1
            if accepted == j and not matcher.is_terminated():
                matcher.fill_next_token_bitmask(bitmask, first + j)
            else:  # after a refused draft, or a stop token: never sampled from
                bitmask[first + j] = bitmask[first + j - 1]
        if accepted:
            matcher.rollback(accepted)


@dataclass(slots=True)
class StepMasks:
    """The masks of one step's guided rows: `rows` index the step's sampled rows (in the order
    the sampler sees them), `bitmask` [len(rows), words] int32, bit t of a row: token t allowed."""

    step_id: int
    rows: list[int]
    bitmask: np.ndarray


def has_guided_rows(plan: StepPlan, find: Callable[[int], Sequence | None]) -> bool:
    """Whether a step samples for a sequence with a grammar (then its masks are owed)."""
    for seq_id, do_sample in zip(plan.seq_ids, plan.sample, strict=True):
        if do_sample:
            seq = find(seq_id)
            if seq is not None and seq.grammar is not None:
                return True
    return False


class MaskFiller:
    """Fills a step's masks on its own thread and hands them to `provide`."""

    def __init__(self, backend: GrammarBackend, provide: Callable[[StepMasks], None]) -> None:
        self.backend = backend
        self.provide = provide
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="aioworker-masks")

    def start(self, plan: StepPlan, find: Callable[[int], Sequence | None]) -> Future:
        """Begin filling the masks of `plan`, whose earlier tokens are all known now."""
        rows, grammars, drafts = guided_rows(plan, find)
        return self._thread.submit(self._fill, plan.step_id, rows, grammars, drafts)

    def _fill(
        self,
        step_id: int,
        rows: list[int],
        grammars: list[SequenceGrammar],
        drafts: list[list[int]],
    ) -> None:
        num_rows = sum(len(d) + 1 for d in drafts)
        bitmask = np.zeros((num_rows, self.backend.num_mask_words), dtype=np.int32)
        try:
            if not any(drafts):
                self.backend.fill_many([g.matcher for g in grammars], bitmask)
            else:
                first = 0
                for grammar, seq_drafts in zip(grammars, drafts, strict=True):
                    grammar.fill_with_drafts(bitmask, first, seq_drafts)
                    first += len(seq_drafts) + 1
        except Exception:
            # Never leave the step waiting: its rows go unconstrained, and a token the grammar
            # refuses then ends its request with an error.
            log.exception("filling the masks of step %d failed", step_id)
            bitmask[:] = -1
        self.provide(StepMasks(step_id, rows, bitmask))

    def shutdown(self) -> None:
        self._thread.shutdown(wait=True)


def guided_rows(
    plan: StepPlan, find: Callable[[int], Sequence | None]
) -> tuple[list[int], list[SequenceGrammar], list[list[int]]]:
    """The sampled rows of `plan` that follow a grammar, each sequence's grammar, and its
    drafts (a sequence with k drafts samples k + 1 consecutive rows)."""
    rows: list[int] = []
    grammars: list[SequenceGrammar] = []
    drafts: list[list[int]] = []
    row = end = 0
    num_drafts = plan.num_draft_tokens or [0] * len(plan.seq_ids)
    for seq_id, num_tokens, k, do_sample in zip(
        plan.seq_ids, plan.num_scheduled_tokens, num_drafts, plan.sample, strict=True
    ):
        end += num_tokens
        if not do_sample:
            continue
        seq = find(seq_id)
        if seq is not None and seq.grammar is not None and not seq.grammar.is_broken:
            rows.extend(range(row, row + k + 1))
            grammars.append(seq.grammar)
            drafts.append(plan.input_token_ids[end - k : end] if k else [])
        row += k + 1
    return rows, grammars, drafts
