"""Rank lifecycle states, as published in every heartbeat and in `admin status`."""

from __future__ import annotations

import enum


class RankState(enum.StrEnum):
    STARTING = "STARTING"
    LOADING = "LOADING"
    PROFILING = "PROFILING"
    WARMING = "WARMING"
    READY = "READY"
    PAUSED = "PAUSED"
    DRAINING = "DRAINING"
    UPDATING_WEIGHTS = "UPDATING_WEIGHTS"
    WEIGHTS_CLEARED = "WEIGHTS_CLEARED"
    STOPPED = "STOPPED"
    FAILED = "FAILED"

    @property
    def accepts_requests(self) -> bool:
        return self in (
            RankState.READY,
            RankState.PAUSED,
            RankState.UPDATING_WEIGHTS,
            RankState.WEIGHTS_CLEARED,
        )

    @property
    def is_final(self) -> bool:
        return self in (RankState.STOPPED, RankState.FAILED)


class ExitCode(enum.IntEnum):
    """Process exit codes; docs/operations.md lists them for supervisors."""

    OK = 0  # a requested, clean stop
    FAILED = 1  # a fatal error in this rank (step exception, load failure)
    USAGE = 2  # bad configuration or arguments
    PEER_LOST = 3  # a tensor-parallel peer died, froze or reported failure
    PLAN_GAP = 4  # a peer missed a step plan: the group has diverged
    HUNG = 5  # a step stopped making progress
