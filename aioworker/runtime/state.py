"""Which rank state may follow which, and what each state allows: the one table. A transition the
table does not list raises, so a new code path cannot slip a rank into a state nobody planned
for. The states' names are published (wire/health.py); the exit codes are read by supervisors."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from aioworker.wire.health import RankState

S = RankState


@dataclass(frozen=True)
class StateRules:
    next_states: frozenset[RankState]
    accepts_requests: bool = False
    runs_steps: bool = False
    is_starting: bool = False


def _rules(*next_states: RankState, **allows: bool) -> StateRules:
    # Any state that has not ended may stop or fail.
    return StateRules(frozenset({*next_states, S.STOPPED, S.FAILED}), **allows)


RULES: dict[RankState, StateRules] = {
    S.STARTING: _rules(S.LOADING, is_starting=True),
    S.LOADING: _rules(S.PROFILING, S.WARMING, S.READY, is_starting=True),
    S.PROFILING: _rules(S.WARMING, S.READY, is_starting=True),
    S.WARMING: _rules(S.READY, is_starting=True),
    S.READY: _rules(
        S.PAUSED,
        S.DRAINING,
        S.UPDATING_WEIGHTS,
        S.WEIGHTS_CLEARED,
        accepts_requests=True,
        runs_steps=True,
    ),
    # Running requests hold; new ones queue.
    S.PAUSED: _rules(
        S.READY, S.DRAINING, S.UPDATING_WEIGHTS, S.WEIGHTS_CLEARED, accepts_requests=True
    ),
    # Requests queue behind the update; steps resume in the state the update started from.
    S.UPDATING_WEIGHTS: _rules(
        S.READY, S.PAUSED, S.WEIGHTS_CLEARED, S.DRAINING, accepts_requests=True
    ),
    S.WEIGHTS_CLEARED: _rules(S.READY, S.UPDATING_WEIGHTS, S.DRAINING, accepts_requests=True),
    # Requests in flight finish; new ones are refused.
    S.DRAINING: _rules(runs_steps=True),
    S.STOPPED: StateRules(frozenset({S.FAILED})),  # a fault while stopping still says FAILED
    S.FAILED: StateRules(frozenset()),
}


class IllegalTransition(RuntimeError):
    """A code path tried a state change the table does not allow."""


class RankStateMachine:
    """The rank's current state; every change is checked against RULES and then reported."""

    def __init__(self, on_change: Callable[[RankState], None]) -> None:
        self._state = S.STARTING
        self._on_change = on_change

    @property
    def state(self) -> RankState:
        return self._state

    @property
    def rules(self) -> StateRules:
        return RULES[self._state]

    def move(self, state: RankState) -> None:
        """Change to `state` (staying put is allowed); raises IllegalTransition otherwise."""
        if state is self._state:
            return
        if state not in RULES[self._state].next_states:
            raise IllegalTransition(f"a rank cannot go from {self._state} to {state}")
        self._state = state
        self._on_change(state)


class ExitCode(enum.IntEnum):
    """Process exit codes; docs/operations.md lists them for supervisors."""

    OK = 0  # a requested, clean stop
    FAILED = 1  # a fatal error in this rank (step exception, load failure)
    USAGE = 2  # bad configuration or arguments
    PEER_LOST = 3  # a tensor-parallel peer died, froze or reported failure
    PLAN_GAP = 4  # a peer missed a step plan: the group has diverged
    HUNG = 5  # a step stopped making progress
    WEIGHTS_DIVERGED = 6  # a commit failed on some rank: the ranks may hold different weights
