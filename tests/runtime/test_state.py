"""The rank state table: every state reachable, nothing leaves a final state but a late failure,
and a transition the table does not list raises."""

from __future__ import annotations

import pytest

from aioworker.runtime.state import RULES, IllegalTransition, RankStateMachine
from aioworker.wire.health import FINAL_STATES, RankState


def reachable(start: RankState) -> set[RankState]:
    seen, todo = {start}, [start]
    while todo:
        for nxt in RULES[todo.pop()].next_states - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


def test_the_table_covers_every_state_and_each_is_reachable_from_starting() -> None:
    assert set(RULES) == set(RankState)
    assert reachable(RankState.STARTING) == set(RankState)


def test_only_a_late_failure_leaves_a_final_state() -> None:
    assert RULES[RankState.FAILED].next_states == frozenset()
    assert RULES[RankState.STOPPED].next_states == {RankState.FAILED}
    for state in set(RankState) - FINAL_STATES:
        assert RULES[state].next_states >= FINAL_STATES, state


def test_only_serving_and_draining_run_steps() -> None:
    stepping = {state for state, rules in RULES.items() if rules.runs_steps}
    assert stepping == {RankState.READY, RankState.DRAINING}
    assert not RULES[RankState.DRAINING].accepts_requests


def test_a_transition_outside_the_table_raises_and_changes_nothing() -> None:
    seen = []
    machine = RankStateMachine(seen.append)
    machine.move(RankState.LOADING)
    machine.move(RankState.LOADING)  # staying put is no change
    with pytest.raises(IllegalTransition, match="from LOADING to PAUSED"):
        machine.move(RankState.PAUSED)
    machine.move(RankState.READY)
    machine.move(RankState.DRAINING)
    with pytest.raises(IllegalTransition, match="from DRAINING to READY"):
        machine.move(RankState.READY)
    assert machine.state is RankState.DRAINING
    assert seen == [RankState.LOADING, RankState.READY, RankState.DRAINING]
