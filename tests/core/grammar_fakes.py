"""A torch-free grammar backend for the engine core's tests, and an executor that samples what
the masks allow: the seam of guided decoding exercised without a model or xgrammar."""

from __future__ import annotations

from concurrent.futures import Future

import numpy as np

from aioworker.core.fake_executor import FAKE_VOCAB_SIZE, FakeExecutor, fake_token
from aioworker.core.grammar import StepMasks
from aioworker.core.guided import GuidedParams
from aioworker.core.plan import StepPlan, StepResult
from aioworker.core.request_errors import InvalidRequestError


class FixedMatcher:
    """A grammar that matches exactly `target` and then a stop token."""

    def __init__(self, target: list[int], stop_token_ids: list[int]) -> None:
        self.target = target
        self.stop_token_ids = stop_token_ids
        self.accepted: list[int] = []

    def accept_token(self, token_id: int) -> bool:
        if self.is_terminated():
            return False
        position = len(self.accepted)
        expected = self.target[position] if position < len(self.target) else None
        if token_id == expected or (expected is None and token_id in self.stop_token_ids):
            self.accepted.append(token_id)
            return True
        return False

    def rollback(self, num_tokens: int) -> None:
        del self.accepted[len(self.accepted) - num_tokens :]

    def is_terminated(self) -> bool:
        return len(self.accepted) > len(self.target)

    def fill_next_token_bitmask(self, bitmask: np.ndarray, index: int) -> bool:
        if self.is_terminated():
            raise RuntimeError("the grammar has ended: it has no next token")  # as xgrammar
        bitmask[index] = 0
        position = len(self.accepted)
        allowed = [self.target[position]] if position < len(self.target) else self.stop_token_ids
        words = bitmask.view(np.uint32)
        for token in allowed:
            words[index, token // 32] |= np.uint32(1 << (token % 32))
        return True


class FakeGrammars:
    """GuidedParams.regex names the target as token ids ("5 6 7"); "bad" fails to compile;
    with `hold`, compiles wait until `release()`."""

    num_mask_words = -(-FAKE_VOCAB_SIZE // 32)
    num_compiled = num_cache_hits = cached_bytes = 0

    def __init__(self, hold: bool = False) -> None:
        self.hold = hold
        self.held: list[tuple[Future, GuidedParams]] = []

    def compile(self, guided: GuidedParams) -> Future:
        future: Future = Future()
        if self.hold:
            self.held.append((future, guided))
        else:
            self._settle(future, guided)
        return future

    def read_vocabulary(self) -> None:
        """The fake's vocabulary is its token ids: nothing to read."""

    def release(self) -> None:
        for future, guided in self.held:
            self._settle(future, guided)
        self.held = []

    def _settle(self, future: Future, guided: GuidedParams) -> None:
        if guided.regex == "bad":
            future.set_exception(InvalidRequestError("guided.regex does not compile: bad"))
        else:
            future.set_result([int(t) for t in guided.regex.split()])

    def matcher(self, compiled: list[int], stop_token_ids: list[int]) -> FixedMatcher:
        return FixedMatcher(compiled, stop_token_ids)

    def close(self) -> None:
        pass


def lowest_allowed(row: np.ndarray) -> int:
    bits = np.unpackbits(row.view(np.uint8), bitorder="little")
    return int(np.flatnonzero(bits)[0])


class MaskingExecutor(FakeExecutor):
    """Answers a step with a guided row only once its masks come, sampling each guided row's
    lowest allowed token (the others: fake tokens). Records which steps waited."""

    def __init__(self) -> None:
        super().__init__()
        self.guided_seq_ids: set[int] = set()
        self.waiting: dict[int, tuple[StepPlan, Future]] = {}
        self.steps_waited: list[int] = []
        self.rows_masked: list[int] = []  # per step that waited

    def submit(self, plan: StepPlan) -> Future[StepResult]:
        for seq_id in plan.released_seq_ids:
            self.guided_seq_ids.discard(seq_id)
        self.guided_seq_ids.update(new.seq_id for new in plan.new_seqs if new.sampling.guided)
        future: Future[StepResult] = Future()
        sampled = [s for s, do in zip(plan.seq_ids, plan.sample, strict=True) if do]
        if any(seq_id in self.guided_seq_ids for seq_id in sampled):
            self.waiting[plan.step_id] = (plan, future)
            self.steps_waited.append(plan.step_id)
        else:
            self._settle(plan, future)
        return future

    def provide_masks(self, masks: StepMasks) -> None:
        super().provide_masks(masks)
        plan, future = self.waiting.pop(masks.step_id)
        self.rows_masked.append(len(masks.rows))
        tokens = [
            fake_token(start + num)
            for start, num, do in zip(
                plan.start_positions, plan.num_scheduled_tokens, plan.sample, strict=True
            )
            if do
        ]
        assert masks.bitmask.shape[0] == len(tokens)  # a row per sampled row
        for row in masks.rows:
            tokens[row] = lowest_allowed(masks.bitmask[row])
        future.set_result(StepResult(plan.step_id, tokens))
