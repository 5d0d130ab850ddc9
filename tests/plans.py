"""Step plans built by hand, for tests that drive a runner or an executor directly."""

from __future__ import annotations

from aioworker.core.plan import NewSeq, SamplingSettings, StepPlan

GREEDY = SamplingSettings(0.0, 0, 1.0, None, 0, [])


def prefill_plan(
    token_ids: list[int], block_ids: list[int], seq_id: int = -1, step_id: int = -1
) -> StepPlan:
    """One new greedy sequence whose whole prompt is computed in this step."""
    return StepPlan(
        step_id=step_id,
        seq_ids=[seq_id],
        num_scheduled_tokens=[len(token_ids)],
        start_positions=[0],
        new_block_ids=[block_ids],
        sample=[True],
        input_token_ids=token_ids,
        new_seqs=[NewSeq(seq_id, len(token_ids), GREEDY)],
    )


def empty_plan(step_id: int, released_seq_ids: tuple[int, ...] = ()) -> StepPlan:
    """A step that runs nothing (and releases `released_seq_ids`)."""
    return StepPlan(
        step_id=step_id,
        seq_ids=[],
        num_scheduled_tokens=[],
        start_positions=[],
        new_block_ids=[],
        sample=[],
        input_token_ids=[],
        released_seq_ids=list(released_seq_ids),
    )
