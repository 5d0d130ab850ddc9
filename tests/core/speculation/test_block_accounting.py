"""A state machine over the scheduler with drafts: propose, accept or reject, trim, preempt,
abort and finish in any order, with up to two steps in flight; every block stays counted."""

from __future__ import annotations

import random
from collections import deque

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from aioworker.core.block_manager import BlockManager
from aioworker.core.plan import StepResult
from aioworker.core.sampling_params import SamplingParams
from aioworker.core.scheduler import Scheduler
from aioworker.core.sequence import SeqStatus, Sequence
from aioworker.core.speculation.policy import SpeculationPolicy
from aioworker.core.speculation.speculator import Speculator
from tests.core.speculation.executor_tables import ExecutorTables

EOS = 3
NUM_BLOCKS, BLOCK_SIZE, MAX_MODEL_LEN = 24, 2, 40


class RandomProposer:
    def __init__(self) -> None:
        self.rng = random.Random(0)

    def propose(self, token_ids: list[int], max_tokens: int) -> list[int]:
        return [self.rng.choice([4, 5, 6]) for _ in range(self.rng.randint(0, max_tokens))]


class DraftedScheduling(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.sched: Scheduler | None = None
        self.in_flight: deque = deque()
        self.next_id = 0
        self.tables = ExecutorTables()

    @initialize(caching=st.booleans())
    def start(self, caching: bool) -> None:
        speculator = Speculator(
            RandomProposer(), SpeculationPolicy(4, dynamic=False), MAX_MODEL_LEN
        )
        blocks = BlockManager(NUM_BLOCKS, BLOCK_SIZE, enable_prefix_caching=caching)
        self.sched = Scheduler(blocks, 4, 16, MAX_MODEL_LEN, speculator)

    @rule(prompt_len=st.integers(1, 20), max_tokens=st.integers(1, 12), prefix=st.booleans())
    def add(self, prompt_len: int, max_tokens: int, prefix: bool) -> None:
        prompt = [8] * prompt_len if prefix else list(range(10, 10 + prompt_len))
        params = SamplingParams(max_tokens=max_tokens)
        self.sched.add(Sequence(self.next_id, f"r{self.next_id}", prompt, params, (EOS,)))
        self.next_id += 1

    @precondition(lambda self: len(self.in_flight) < 2)
    @rule()
    def schedule(self) -> None:
        if self.in_flight and self.in_flight[-1].has_drafts:
            return  # the engine never schedules behind a step with drafts
        plan = self.sched.schedule()
        if plan is not None:
            self.in_flight.append(plan)
            self.tables.follow(plan, self.sched.seqs)

    @precondition(lambda self: self.in_flight)
    @rule(data=st.data())
    def complete(self, data) -> None:
        plan = self.in_flight.popleft()
        tokens, counts = [], []
        drafts = plan.num_draft_tokens or [0] * len(plan.seq_ids)
        for num_drafts, do_sample in zip(drafts, plan.sample, strict=True):
            if do_sample:
                count = data.draw(st.integers(1, num_drafts + 1))
                tokens += data.draw(
                    st.lists(st.sampled_from([EOS, 4, 5]), min_size=count, max_size=count)
                )
                counts.append(count)
        result = StepResult(plan.step_id, tokens, num_sampled=counts if plan.has_drafts else None)
        self.sched.update(plan, result)

    @precondition(lambda self: self.sched.seqs)
    @rule(data=st.data())
    def abort(self, data) -> None:
        seq_id = data.draw(st.sampled_from(sorted(self.sched.seqs)))
        self.sched.abort(seq_id)

    @rule()
    def preempt_all(self) -> None:
        self.sched.preempt_all()

    @invariant()
    def every_block_is_counted(self) -> None:
        if self.sched is None:
            return
        blocks = self.sched.block_manager
        tables = [s.block_table for s in self.sched.seqs.values()]
        held = [b for table in tables for b in table]
        assert sorted(set(held)) == [b for b in range(NUM_BLOCKS) if blocks.ref_counts[b] > 0]
        assert all(blocks.ref_counts[b] == held.count(b) for b in set(held))
        assert len(set(held)) + blocks.num_free_blocks == NUM_BLOCKS

    @invariant()
    def no_sequence_holds_more_than_it_may_write(self) -> None:
        if self.sched is None:
            return
        for seq in self.sched.running:
            in_flight = seq.num_pending_tokens + seq.num_draft_tokens
            assert len(seq.block_table) <= -(-(len(seq.token_ids) + in_flight) // BLOCK_SIZE)
            assert seq.num_computed_tokens <= len(seq.block_table) * BLOCK_SIZE
        for seq in self.sched.waiting:
            assert seq.status is SeqStatus.WAITING and not seq.block_table


TestDraftedScheduling = DraftedScheduling.TestCase
TestDraftedScheduling.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
