"""Scheduler behaviour with exact block ids, and a property test over random workloads."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from aioworker.core.block_manager import BlockManager
from aioworker.core.outputs import FinishReason
from aioworker.core.plan import StepResult
from aioworker.core.sampling_params import SamplingParams
from aioworker.core.scheduler import Scheduler
from aioworker.core.sequence import Sequence

EOS = 99


def make(num_blocks=16, block_size=4, max_num_seqs=8, budget=64, max_model_len=64) -> Scheduler:
    return Scheduler(BlockManager(num_blocks, block_size), max_num_seqs, budget, max_model_len)


def add(sched: Scheduler, seq_id: int, prompt_len: int, **params) -> Sequence:
    params.setdefault("max_tokens", 4)
    seq = Sequence(seq_id, f"r{seq_id}", list(range(prompt_len)), SamplingParams(**params), (EOS,))
    sched.add(seq)
    return seq


def run_step(sched: Scheduler, token: int = 7):
    plan = sched.schedule()
    if plan is None:
        return None, []
    outputs = sched.update(plan, StepResult(plan.step_id, [token] * sum(plan.sample)))
    return plan, outputs


def test_prefill_and_decode_share_a_step_with_exact_blocks() -> None:
    sched = make()
    add(sched, 0, prompt_len=6)
    plan, outputs = run_step(sched)
    assert plan.seq_ids == [0] and plan.num_scheduled_tokens == [6]
    assert plan.new_block_ids == [[0, 1]] and plan.sample == [True]
    assert [out.token_ids for out in outputs] == [[7]]
    add(sched, 1, prompt_len=3)
    plan, _ = run_step(sched)
    # seq 0 decodes its sampled token at position 6; seq 1 prefills in the same step.
    assert plan.seq_ids == [0, 1]
    assert plan.num_scheduled_tokens == [1, 3]
    assert plan.start_positions == [6, 0]
    assert plan.input_token_ids == [7, 0, 1, 2]
    assert plan.new_block_ids == [[], [2]]
    assert [n.seq_id for n in plan.new_seqs] == [1]


def test_long_prompt_is_prefilled_in_budget_sized_chunks() -> None:
    sched = make(budget=8)
    add(sched, 0, prompt_len=20)
    chunks = []
    for _ in range(3):
        plan, outputs = run_step(sched)
        chunks.append((plan.num_scheduled_tokens[0], plan.start_positions[0], plan.sample[0]))
    assert chunks == [(8, 0, False), (8, 8, False), (4, 16, True)]
    assert sched.seqs[0].num_output_tokens == 1


def test_max_num_seqs_limits_admission() -> None:
    sched = make(max_num_seqs=2)
    for i in range(3):
        add(sched, i, prompt_len=2)
    plan, _ = run_step(sched)
    assert plan.seq_ids == [0, 1]
    assert [s.seq_id for s in sched.waiting] == [2]


def test_newest_running_sequence_is_preempted_and_recomputed() -> None:
    # 4 blocks of 4 tokens: two sequences of 8 tokens fill the cache.
    sched = make(num_blocks=4, block_size=4)
    old = add(sched, 0, prompt_len=8, max_tokens=3)
    new = add(sched, 1, prompt_len=8, max_tokens=3)
    plan, _ = run_step(sched)
    assert plan.seq_ids == [0, 1]
    # Old needs a third block for position 8: the newest (1) is preempted, its blocks freed.
    plan, _ = run_step(sched)
    assert plan.seq_ids == [0] and sched.num_preemptions == 1
    assert plan.released_seq_ids == [1]
    assert new.num_computed_tokens == 0 and new.block_table == [] and sched.waiting[0] is new
    while old.seq_id in sched.seqs:
        run_step(sched)
    # Once old finishes, new is recomputed from all of its tokens (prompt + the sampled one).
    plan, _ = run_step(sched)
    assert plan.seq_ids == [1] and plan.num_scheduled_tokens == [9]
    assert [n.seq_id for n in plan.new_seqs] == [1]


def new_seq_of(sched: Scheduler, seq_id: int, prompt_len: int, **params):
    add(sched, seq_id, prompt_len, **params)
    plan, _ = run_step(sched)
    [new] = [n for n in plan.new_seqs if n.seq_id == seq_id]
    return new


def test_a_plan_carries_logit_controls_and_seen_tokens_only_where_needed() -> None:
    sched = make(num_blocks=64)
    prompt = list(range(5))
    plain = new_seq_of(sched, 0, 5)
    assert plain.sampling.controls is None and plain.token_ids == []
    # min_p changes nothing for a greedy request: no controls at all.
    assert new_seq_of(sched, 1, 5, temperature=0.0, min_p=0.3).sampling.controls is None
    biased = new_seq_of(sched, 2, 5, logit_bias={3: 2.0}, bad_words_token_ids=((4,),))
    assert biased.sampling.controls.logit_bias == {3: 2.0} and biased.token_ids == []
    assert biased.sampling.controls.bad_words_token_ids == [[4]]
    # Penalties and bad words of several tokens start from what the sequence has seen.
    penalised = new_seq_of(sched, 3, 5, presence_penalty=0.5)
    assert penalised.sampling.controls.presence_penalty == 0.5 and penalised.token_ids == prompt
    assert new_seq_of(sched, 4, 5, bad_words_token_ids=((4, 5),)).token_ids == prompt
    assert new_seq_of(sched, 5, 5, prompt_logprobs=1).token_ids == prompt


def test_a_preempted_sequence_with_penalties_is_readmitted_with_its_outputs() -> None:
    sched = make(num_blocks=4, block_size=4)
    old = add(sched, 0, prompt_len=8, max_tokens=3)
    new = add(sched, 1, prompt_len=7, max_tokens=3, repetition_penalty=1.2)
    plan, _ = run_step(sched, token=11)
    assert plan.new_seqs[1].token_ids == list(range(7))
    run_step(sched, token=12)  # old needs a third block: new is preempted after one output
    while old.seq_id in sched.seqs:
        run_step(sched, token=13)
    assert sched.num_preemptions == 1
    plan, _ = run_step(sched, token=14)
    [readmitted] = plan.new_seqs
    assert readmitted.seq_id == 1 and readmitted.token_ids == new.token_ids[:-1]
    assert readmitted.token_ids[7:] == new.output_token_ids[:-1] and len(readmitted.token_ids) > 7
    # A copy: the scheduler appending the step's token does not reach the plan.
    assert readmitted.token_ids is not new.token_ids


def test_abort_frees_blocks_immediately_and_is_released() -> None:
    sched = make()
    seq = add(sched, 0, prompt_len=10)
    run_step(sched)
    assert sched.block_manager.num_free_blocks == 13
    assert sched.abort(0) is seq and seq.finish_reason is FinishReason.ABORT
    assert sched.block_manager.num_free_blocks == 16
    assert sched.abort(0) is None
    add(sched, 1, prompt_len=2)
    plan, _ = run_step(sched)
    assert plan.released_seq_ids == [0]


def test_abort_of_waiting_sequence() -> None:
    sched = make()
    add(sched, 0, prompt_len=3)
    sched.abort(0)
    assert not sched.waiting and sched.schedule() is None


def test_stop_conditions() -> None:
    sched = make()
    add(sched, 0, prompt_len=2, max_tokens=10)
    add(sched, 1, prompt_len=2, max_tokens=10, ignore_eos=True)
    add(sched, 2, prompt_len=2, max_tokens=10, min_tokens=2)
    _, outputs = run_step(sched, token=EOS)
    reasons = {out.request_id: out.finish_reason for out in outputs}
    assert reasons == {"r0": FinishReason.STOP, "r1": None, "r2": None}
    run_step(sched, token=EOS)  # r2 has 2 outputs now: still below min_tokens + 1
    _, outputs = run_step(sched, token=EOS)
    assert {out.request_id: out.finish_reason for out in outputs}["r2"] is FinishReason.STOP


def test_max_tokens_and_max_model_len_finish_with_length() -> None:
    sched = make(max_model_len=6)
    add(sched, 0, prompt_len=2, max_tokens=2)
    add(sched, 1, prompt_len=4, max_tokens=10)
    finished = {}
    while sched.has_work:
        _, outputs = run_step(sched)
        finished.update({out.request_id: out.finish_reason for out in outputs if out.finished})
    assert finished == {"r0": FinishReason.LENGTH, "r1": FinishReason.LENGTH}


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    num_blocks=st.integers(6, 24),
    block_size=st.sampled_from([1, 2, 4, 8]),
    budget=st.integers(4, 40),
)
def test_random_workloads_keep_invariants(
    seed: int, num_blocks: int, block_size: int, budget: int
) -> None:
    """Whatever mix of arrivals, aborts and preemptions: blocks are never shared or leaked,
    every request finishes exactly once, and plans respect the budget."""
    rng = random.Random(seed)
    max_model_len = num_blocks * block_size
    sched = make(num_blocks, block_size, rng.randint(1, 6), budget, max_model_len)
    finished: dict[str, FinishReason] = {}
    next_id = 0
    for _ in range(200):
        if rng.random() < 0.3 and next_id < 20:
            add(sched, next_id, rng.randint(1, max_model_len), max_tokens=rng.randint(1, 8))
            next_id += 1
        if rng.random() < 0.05 and sched.seqs:
            victim = rng.choice(list(sched.seqs.values()))
            sched.abort(victim.seq_id)
            finished[victim.request_id] = FinishReason.ABORT
        plan, outputs = run_step(sched, token=rng.choice([EOS, 5, 6]))
        if plan is not None:
            assert plan.num_tokens <= budget
        for out in outputs:
            if out.finish_reason is not None:
                assert out.request_id not in finished
                finished[out.request_id] = out.finish_reason
        owned = [b for s in sched.running for b in s.block_table]
        assert len(owned) == len(set(owned)), "a block is owned twice"
        assert len(owned) + sched.block_manager.num_free_blocks == num_blocks
        assert all(not s.block_table for s in sched.waiting)
    while sched.has_work:
        _, outputs = run_step(sched)
        finished.update({out.request_id: out.finish_reason for out in outputs if out.finished})
    assert len(finished) == next_id
    assert sched.block_manager.num_free_blocks == num_blocks
