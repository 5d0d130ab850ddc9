"""The driver counts a peer's weights ack only for the phase in progress: matched by rank,
operation and version, one per rank."""

from __future__ import annotations

import asyncio
import logging

from aioworker.core.weights_phase import WeightsPhase
from aioworker.runtime.peer_group import PeerGroup
from aioworker.wire.drops import DropCounter
from aioworker.wire.protocol import WeightsAck


def group_of(size: int) -> PeerGroup:
    group = PeerGroup.__new__(PeerGroup)
    group.size, group.phase_timeout_s = size, 1.0
    group.weights_acks = asyncio.Queue()
    group.unsent = DropCounter(logging.getLogger("t"), "x")
    return group


def ack(rank: int, op: str, version: int, ok: bool = True) -> WeightsAck:
    return WeightsAck(rank=rank, op=op, version=version, ok=ok)


def test_late_duplicate_and_foreign_acks_do_not_complete_a_phase() -> None:
    async def scenario():
        group = group_of(3)
        # Earlier phases (another operation, another version), and a rank not in the group.
        for stray in (
            ack(1, "stage", 2, ok=False),
            ack(1, "commit", 1, ok=False),
            ack(7, "commit", 2),
        ):
            group.weights_acks.put_nowait(stray)
        group.weights_acks.put_nowait(ack(1, "commit", 2))
        group.weights_acks.put_nowait(ack(1, "commit", 2, ok=False))  # the same rank again
        group.weights_acks.put_nowait(ack(2, "commit", 2))
        return await group._collect(WeightsPhase(op="commit", version=2))

    acks = asyncio.run(scenario())
    assert sorted((a.rank, a.ok) for a in acks) == [(1, True), (2, True)]
