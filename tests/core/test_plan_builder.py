"""PlanBuilder: a plan's inputs, the token still in flight, and which rows sample."""

from __future__ import annotations

from aioworker.core.block_manager import BlockManager
from aioworker.core.plan import PENDING_TOKEN
from aioworker.core.plan_builder import PlanBuilder, logit_controls, new_seq
from aioworker.core.sampling_params import SamplingParams
from aioworker.core.sequence import Sequence


def test_a_prompt_chunk_then_its_last_chunk_then_a_decode_in_flight() -> None:
    seq = Sequence(0, "r0", [5, 6, 7, 8, 9], SamplingParams())
    first = PlanBuilder(BlockManager(16, 4))
    first.add(seq, 3, [0])
    assert (first.input_ids, first.sample) == ([5, 6, 7], [False])
    second = PlanBuilder(BlockManager(16, 4))
    second.add(seq, 2, [1])
    assert (second.input_ids, second.sample, seq.num_pending_tokens) == ([8, 9], [True], 1)
    # The next step is planned before the token it samples exists: the executor fills it in.
    third = PlanBuilder(BlockManager(16, 4))
    third.add(seq, 1, [])
    plan = third.plan(7, released_seq_ids=[3])
    assert plan.input_token_ids == [PENDING_TOKEN] and plan.sample == [True]
    assert (plan.step_id, plan.released_seq_ids, plan.start_positions) == (7, [3], [5])


def test_a_new_seq_carries_controls_and_seen_tokens_only_where_needed() -> None:
    plain = Sequence(0, "r0", [1, 2, 3], SamplingParams())
    assert logit_controls(plain.params) is None and new_seq(plain).token_ids == []
    penalised = Sequence(1, "r1", [1, 2, 3], SamplingParams(repetition_penalty=1.3))
    entry = new_seq(penalised)
    assert entry.sampling.controls.repetition_penalty == 1.3 and entry.token_ids == [1, 2, 3]
