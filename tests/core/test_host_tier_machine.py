"""A state machine over the two KV tiers: requests arrive, steps run up to two in flight, blocks
are evicted, saved to the host, hit and loaded back, sequences are swapped out and in, copies
end late or fail, requests are aborted, and the tiers are reset, in any order.

A simulated executor keeps what each device block and host slot holds: the token each position
was computed from, and the weights version it was computed with. Copies move that content when
they are reported, the latest a real copy may run, so a block reused before its copy ended
would show. Every block stays counted in both tiers, and every step reads, at every position
before its first input, the token the sequence has there: a hit returns the tokens it names.
"""

from __future__ import annotations

from collections import deque

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from aioworker.core.block_manager import BlockManager
from aioworker.core.host_tier import HostKvConnector
from aioworker.core.kv_connector import KvCopy, KvReport
from aioworker.core.outputs import FinishReason
from aioworker.core.plan import StepPlan, StepResult
from aioworker.core.sampling_params import SamplingParams
from aioworker.core.scheduler import Scheduler
from aioworker.core.sequence import Sequence
from tests.core.speculation.executor_tables import ExecutorTables

NUM_BLOCKS, NUM_SLOTS, BLOCK_SIZE, MAX_MODEL_LEN = 12, 10, 2, 24


def token_at(seq_id: int, prompt: list[int], position: int) -> int:
    """The token a sequence has at `position`: its prompt's, then what the fake model samples."""
    return prompt[position] if position < len(prompt) else 100 + (seq_id * 7 + position) % 5


class TieredExecutor:
    """Device blocks and host slots as lists of (token, weights version) per position."""

    def __init__(self) -> None:
        self.device: list[list] = [[None] * BLOCK_SIZE for _ in range(NUM_BLOCKS)]
        self.host: list[list] = [[None] * BLOCK_SIZE for _ in range(NUM_SLOTS)]
        self.copies: deque[tuple[KvCopy, bool]] = deque()  # issued, not yet reported
        self.tables = ExecutorTables()
        # Each plan's block tables and weights version when it was made (it runs later).
        self.plans: dict[int, tuple[dict[int, list[int]], int]] = {}
        self.version = 0
        # The weights version each sequence was last admitted under: its KV must be as new.
        self.admitted: dict[int, int] = {}
        self.failing = False

    def run(self, plan: StepPlan, prompts: dict, finished: bool) -> StepResult:
        if plan.kv is not None:
            self.copies.extend((copy, True) for copy in plan.kv.saves)
            self.copies.extend((copy, False) for copy in plan.kv.loads)
        tables, version = self.plans.pop(plan.step_id)
        sampled = []
        for seq_id, start, count, do_sample in zip(
            plan.seq_ids, plan.start_positions, plan.num_scheduled_tokens, plan.sample,
            strict=True,
        ):  # fmt: skip
            table, prompt = tables[seq_id], prompts[seq_id]
            for position in range(start):
                token, written = self.device[table[position // BLOCK_SIZE]][position % BLOCK_SIZE]
                assert token == token_at(seq_id, prompt, position), (seq_id, position)
                assert written >= self.admitted[seq_id], (seq_id, position)
            for position in range(start, start + count):
                self.device[table[position // BLOCK_SIZE]][position % BLOCK_SIZE] = (
                    token_at(seq_id, prompt, position),
                    version,
                )
            if do_sample:
                sampled.append(token_at(seq_id, prompt, start + count))
        return StepResult(plan.step_id, sampled, kv=self.report(everything=finished))

    def follow(self, plan: StepPlan, seqs: dict) -> None:
        """A plan is made: its tables, and the weights it will run on (phases run in order)."""
        self.tables.follow(plan, seqs)
        tables = {seq_id: list(self.tables.tables[seq_id]) for seq_id in plan.seq_ids}
        self.plans[plan.step_id] = (tables, self.version)
        for new in plan.new_seqs:
            self.admitted[new.seq_id] = self.version

    def report(self, everything: bool, count: int = 1) -> KvReport | None:
        """Run and report the oldest `count` copies issued (all of them for a plan without
        sequences: the real executor waits for every copy then)."""
        done, failed = [], []
        while self.copies and (everything or len(done) + len(failed) < count):
            copy, is_save = self.copies.popleft()
            if self.failing:
                failed.append(copy.transfer_id)
                continue
            for block, slot in zip(copy.device_block_ids, copy.tier_block_ids, strict=True):
                if is_save:
                    self.host[slot] = list(self.device[block])
                else:
                    self.device[block] = list(self.host[slot])
            done.append(copy.transfer_id)
        return KvReport(done, failed, error="test") if done or failed else None


class TwoTiers(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.sched: Scheduler | None = None
        self.executor = TieredExecutor()
        self.in_flight: deque[StepPlan] = deque()
        self.prompts: dict[int, list[int]] = {}
        self.next_id = 0
        self.errors = 0

    @initialize(caching=st.booleans(), preemption=st.sampled_from(["swap", "auto", "recompute"]))
    def start(self, caching: bool, preemption: str) -> None:
        blocks = BlockManager(NUM_BLOCKS, BLOCK_SIZE, enable_prefix_caching=caching)
        connector = HostKvConnector(NUM_SLOTS, BLOCK_SIZE, 64, preemption)
        self.sched = Scheduler(blocks, 4, 8, MAX_MODEL_LEN, connector=connector)

    @rule(prompt_len=st.integers(1, 12), max_tokens=st.integers(1, 6), shared=st.integers(0, 5))
    def add(self, prompt_len: int, max_tokens: int, shared: int) -> None:
        prompt = (
            [10 + shared] * 6 + [20 + self.next_id] * prompt_len if shared else [30] * prompt_len
        )
        self.prompts[self.next_id] = prompt
        seq = Sequence(
            self.next_id, f"r{self.next_id}", prompt, SamplingParams(max_tokens=max_tokens)
        )
        self.sched.add(seq)
        self.next_id += 1

    @precondition(lambda self: len(self.in_flight) < 2)
    @rule()
    def schedule(self) -> None:
        plan = self.sched.schedule()
        if plan is not None:
            self.in_flight.append(plan)
            self.executor.follow(plan, self.sched.seqs)

    @precondition(lambda self: self.in_flight)
    @rule()
    def complete(self) -> None:
        plan = self.in_flight.popleft()
        result = self.executor.run(plan, self.prompts, finished=plan.is_empty)
        for out in self.sched.update(plan, result):
            if out.finish_reason is FinishReason.ERROR:
                assert "failed copy" in out.error
                self.errors += 1

    @rule(num_steps=st.integers(1, 6))
    def run_steps(self, num_steps: int) -> None:
        """Steps back to back, as the engine runs them (one scheduled ahead)."""
        for _ in range(num_steps):
            if len(self.in_flight) < 2:
                self.schedule()
            if self.in_flight:
                self.complete()

    @precondition(lambda self: self.sched.seqs)
    @rule(data=st.data())
    def abort(self, data) -> None:
        self.sched.abort(data.draw(st.sampled_from(sorted(self.sched.seqs))))

    @rule()
    def reset(self) -> None:
        """What a weights update does: new weights, and nothing kept from before serves."""
        self.executor.version += 1
        self.sched.drop_loaded_kv()
        self.sched.block_manager.reset_prefix_cache()
        self.sched.connector.reset()

    @rule(failing=st.booleans())
    def copies_fail(self, failing: bool) -> None:
        self.executor.failing = failing

    @invariant()
    def every_device_block_is_counted(self) -> None:
        if self.sched is None:
            return
        blocks, kv = self.sched.block_manager, self.sched.kv
        tables = [seq.block_table for seq in self.sched.seqs.values()]
        tables += [table for held in kv.held_tables.values() for table in held]
        refs = [block for table in tables for block in table]
        assert all(blocks.ref_counts[b] == refs.count(b) for b in range(NUM_BLOCKS))
        # Held while copied out; a prefix hit may take one meanwhile (still never freed).
        held = {b for ids in kv.held_blocks.values() for b in ids}
        assert held == blocks._held
        assert len(set(refs) | held) + blocks.num_free_blocks == NUM_BLOCKS

    @invariant()
    def every_host_slot_is_counted(self) -> None:
        if self.sched is None:
            return
        connector: HostKvConnector = self.sched.connector
        slots = connector.slots
        swapped = [s for swap in connector._swaps.values() for s in swap.slots]
        saving = [s for pairs, _ in connector._saves.values() for s, _ in pairs]
        cached = list(slots._slot_of_key.values())
        doomed = list(slots._doomed)
        owned = swapped + saving + cached + doomed + slots._free
        assert sorted(owned) == list(range(NUM_SLOTS)), owned

    def teardown(self) -> None:
        """Everything in flight ends; every request finishes, none is lost."""
        if self.sched is None:
            return
        self.executor.failing = False
        for _ in range(400):
            if not (self.sched.has_work or self.in_flight):
                break
            if len(self.in_flight) < 2:
                self.schedule()
            if self.in_flight:
                self.complete()
        assert not self.sched.has_work
        self.every_device_block_is_counted()
        self.every_host_slot_is_counted()


TestTwoTiers = TwoTiers.TestCase
TestTwoTiers.settings = settings(max_examples=200, stateful_step_count=50, deadline=None)
