"""Guided decoding on the torch-free side: a grammar matcher per sequence, advanced by the
scheduler with every token a sequence keeps, and the token masks of a step.

The engine core runs a step ahead, so a step's plan is built before the tokens its masks follow
are known. Masks therefore travel beside the plan, not in it: when a step becomes the oldest in
flight, every token before its sampled rows is known, and `MaskFiller` fills their masks, while
that step's forward runs, and hands them to the executor (`Executor.provide_masks`). The executor's logits stage waits for them only in steps with a
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
    # Grammars compiled, compiles saved by the cache, and the bytes it holds (admin status).
    num_compiled: int
    num_cache_hits: int
    cached_bytes: int

    def compile(self, guided: GuidedParams) -> Future:
        """The compiled grammar, from the cache or a compile pool; the future raises
        InvalidRequestError naming what is wrong with a bad schema, regex or grammar."""
        ...

    def matcher(self, compiled: object, stop_token_ids: list[int]) -> GrammarMatcher:
        """A fresh matcher; the grammar ends with one of `stop_token_ids`."""
        ...

    def read_vocabulary(self) -> None:
        """Read the tokenizer's vocabulary now instead of on the first compile."""
        ...

    def close(self) -> None:
        """Stop compiling and let the backend's threads go."""
        ...


class SequenceGrammar:
    """A sequence's matcher. The scheduler only notes the tokens a sequence keeps (`keep`);
    the mask thread has the matcher accept them (`catch_up`) just before it fills the
    sequence's next mask, so that the work of both runs off the event loop, and on several
    threads for large steps. The grammar's end needs no matcher: a grammar ends with a stop
    token, which ends the sequence by itself."""

    __slots__ = ("matcher", "kept", "is_broken")

    def __init__(self, matcher: GrammarMatcher) -> None:
        self.matcher = matcher
        self.kept: list[int] = []  # kept, not accepted by the matcher yet
        self.is_broken = False  # a kept token the grammar refused (never, while masks apply)

    def keep(self, token_id: int) -> None:
        self.kept.append(token_id)

    def catch_up(self) -> None:
        """The matcher accepts the kept tokens; one it refuses breaks the grammar for good."""
        kept, self.kept = self.kept, []
        for token in kept:
            if self.is_broken or not self.matcher.accept_token(token):
                self.is_broken = True
                return

    def valid_prefix(self, drafts: list[int]) -> list[int]:
        """The drafts the grammar allows, up to the first it refuses (drafts from an n-gram or
        a draft model know nothing of the grammar, and a refused one could never be kept)."""
        self.catch_up()
        if self.is_broken:
            return []
        matcher, count = self.matcher, 0
        for token in drafts:
            if matcher.is_terminated() or not matcher.accept_token(token):
                break
            count += 1
        if count:
            matcher.rollback(count)
        return drafts[:count]

    def fill(self, bitmask: np.ndarray, first: int, drafts: list[int]) -> None:
        """Rows first .. first + len(drafts): the mask before each draft and after the last
        (one row where there are no drafts). A broken grammar leaves its rows unconstrained."""
        self.catch_up()
        if self.is_broken:
            return
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
    """The masks of one step: `bitmask` [sampled rows, words] int32, in the order the sampler
    sees its rows; bit t of a row allows token t. `rows`: the guided rows (the others allow
    every token)."""

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
    """Fills a step's masks and hands them to `provide`, on the engine core's own thread (the
    driver's event loop), helped by up to `num_threads` - 1 threads for steps of more than
    PARALLEL_ROWS guided sequences while that thread waits.

    Not on a thread of its own: the matchers' calls let go of the GIL, and a thread that takes it
    back after each of them waits out the event loop's Python work, 5 ms at a time (the
    interpreter's switch interval). Measured on a 2-core CPU (an ad-hoc script), 64 rows: 604 ms
    per step filled row by row beside a busy Python thread, 1.7 ms on 4 threads while the
    caller waits and nothing else wants the GIL. The fill is the step's critical path either way: the step
    cannot sample until its masks exist, and its forward runs meanwhile."""

    def __init__(
        self, num_mask_words: int, provide: Callable[[StepMasks], None], num_threads: int = 1
    ) -> None:
        self.num_mask_words = num_mask_words
        self.provide = provide
        self.num_threads = max(1, num_threads)
        self._helpers = (
            ThreadPoolExecutor(self.num_threads - 1, thread_name_prefix="aioworker-masks")
            if self.num_threads > 1
            else None
        )

    def fill(self, plan: StepPlan, find: Callable[[int], Sequence | None]) -> None:
        """Fill the masks of `plan`, whose earlier tokens are all known now, and provide them."""
        rows, work, num_rows = guided_rows(plan, find)
        bitmask = np.full((num_rows, self.num_mask_words), -1, dtype=np.int32)
        try:
            self._fill(work, bitmask)
        except Exception:
            # Never leave the step waiting: its rows go unconstrained, and a token the grammar
            # refuses then ends its request with an error.
            log.exception("filling the masks of step %d failed", plan.step_id)
            bitmask[:] = -1
        self.provide(StepMasks(plan.step_id, rows, bitmask))

    def _fill(self, work: list[GuidedRow], bitmask: np.ndarray) -> None:
        if self._helpers is None or len(work) <= PARALLEL_ROWS:
            _fill_rows(work, bitmask)
            return
        chunks = _chunks(work, self.num_threads)
        helped = [self._helpers.submit(_fill_rows, chunk, bitmask) for chunk in chunks[1:]]
        _fill_rows(chunks[0], bitmask)
        for done in helped:
            done.result()

    def shutdown(self) -> None:
        if self._helpers is not None:
            self._helpers.shutdown(wait=True)


# Above this many guided sequences in a step, their masks are filled on several threads.
PARALLEL_ROWS = 16


@dataclass(slots=True)
class GuidedRow:
    """A guided sequence's rows in a step: its first row, its grammar, its drafts."""

    first: int
    grammar: SequenceGrammar
    drafts: list[int]


def _fill_rows(work: list[GuidedRow], bitmask: np.ndarray) -> None:
    for row in work:
        row.grammar.fill(bitmask, row.first, row.drafts)


def _chunks(work: list[GuidedRow], count: int) -> list[list[GuidedRow]]:
    size = -(-len(work) // count) if work else 1
    return [work[i : i + size] for i in range(0, len(work), size)] or [[]]


def guided_rows(
    plan: StepPlan, find: Callable[[int], Sequence | None]
) -> tuple[list[int], list[GuidedRow], int]:
    """The sampled rows of `plan` that follow a grammar, each guided sequence's work, and the
    step's number of sampled rows (a sequence with k drafts samples k + 1 consecutive rows)."""
    rows: list[int] = []
    work: list[GuidedRow] = []
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
            drafts = plan.input_token_ids[end - k : end] if k else []
            work.append(GuidedRow(row, seq.grammar, drafts))
        row += k + 1
    return rows, work, row
